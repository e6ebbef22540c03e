"""The task part's config (conf/task) and the check of its own keys, a leaf of the schema."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from zkl.errors import ConfigError

TASKS = ("add", "residue", "dataset")


@dataclass
class TaskConfig:
    # add (character tokenizer) | residue (the model's whole vocabulary) | dataset (yours)
    name: str = "add"
    max_operand: int = 4  # add: a + b with a, b in 0..max_operand
    modulus: int = 3  # residue: reward = response tokens congruent to the last prompt token
    min_prompt_len: int = 4  # residue: random tail length after the shared 32-token prefix
    max_prompt_len: int = 48
    # dataset (zkl/data): local JSONL or Parquet files read through HF datasets, offline.
    path: str | None = None  # the train split
    val_path: str | None = None  # the validation split (rl.val_every needs one)
    prompt_key: str = "prompt"
    answer_key: str = "answer"
    # The text a prompt is: the prompt column put where `{prompt}` stands, so the task can ask
    # for the answer format its reward reads ("... End with a line '#### N'.").
    prompt_template: str = "{prompt}"
    # math (math-verify) | exact | gsm8k | gsm8k_boxed | gsm8k_flexible | package.module:function
    reward: str = "math"
    tokenizer: str | None = None  # a directory with tokenizer.json; null: model.checkpoint
    chat_template: bool = False  # wrap each prompt as a user turn in the tokenizer's template
    # A task class of your own, built as Class(task_cfg, vocab_size); `params` are its knobs.
    _target_: str | None = None
    params: dict[str, Any] = field(default_factory=dict)


def check(task: TaskConfig) -> None:
    """One sentence naming the task.* key whose value cannot work."""
    if task.modulus < 2:
        raise ConfigError(f"task.modulus={task.modulus} must be >= 2.")
    if not 1 <= task.min_prompt_len <= task.max_prompt_len:
        raise ConfigError(
            "task.min_prompt_len and task.max_prompt_len must satisfy 1 <= min <= max."
        )
    if task.max_operand < 0 or task.max_operand > 9:
        raise ConfigError(f"task.max_operand={task.max_operand} must be between 0 and 9.")
    if task.prompt_template.count("{prompt}") != 1:
        raise ConfigError(
            f"task.prompt_template={task.prompt_template!r} must hold '{{prompt}}' exactly once "
            "(where each row's prompt goes)."
        )
    if task.name not in TASKS and not task._target_:
        raise ConfigError(f"task.name={task.name!r} is not a built-in task; use one of {TASKS}.")


def tokenizer_source(task: TaskConfig, checkpoint: str | None) -> tuple[str | None, str]:
    """A dataset task's tokenizer directory, and the setting a message names it by.

    `task.tokenizer` defaults to `model.checkpoint`. A directory that is the checkpoint's is
    named as `model.checkpoint`, the key the user set, also once the default has been
    written into `task.tokenizer` (`zkl.run.model_from_checkpoint`); None: neither is set.
    """
    checkpoint = os.fspath(checkpoint) if checkpoint else None
    directory = os.fspath(task.tokenizer) if task.tokenizer else checkpoint
    if directory is None:
        return None, "task.tokenizer"
    if directory == checkpoint:
        return directory, f"model.checkpoint={checkpoint} (task.tokenizer's default)"
    return directory, f"task.tokenizer={directory}"
