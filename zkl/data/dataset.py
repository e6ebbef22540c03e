"""`task=dataset`: prompts and answers from your own files, scored by a reward function.

The files are local JSONL / JSON / Parquet (a path or a glob), read through HF `datasets`
with the hub off. Every fault a user can make with the files, the keys, the tokenizer or
the reward is one sentence before any model is built: a path that matches nothing, a
column that is not there, an empty split, a tokenizer wider than the model, a reward
function that cannot be imported or fails on the first example. Those that need no rows read
(the files, the tokenizer, the reward's import) are checked before torch loads
(`check_inputs`, run by `zkl.run.checks`).
"""

from __future__ import annotations

import glob
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zkl.data.config import tokenizer_source
from zkl.data.rewards import RewardError, call_reward, load_reward
from zkl.data.tokenizer import HFTokenizer
from zkl.errors import ConfigError

BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}


@dataclass(frozen=True)
class Example:
    index: int
    prompt_text: str
    answer: str
    prompt_ids: tuple[int, ...]


def _builder(path: str, key: str) -> str:
    suffix = Path(path).suffix.lower()
    if suffix not in BUILDERS:
        raise ConfigError(
            f"{key}={path} is not a {', '.join(BUILDERS)} file; convert it or name one that is."
        )
    return BUILDERS[suffix]


def split_builder(path: str, key: str) -> str:
    """The `datasets` builder of the split `key=path`; one sentence for a path that matches
    no file, a format it does not read, or files that are all empty."""
    files = glob.glob(path)
    if not files:
        raise ConfigError(f"{key}={path} matches no file.")
    builder = _builder(path, key)
    if all(os.path.getsize(f) == 0 for f in files):  # datasets' own error says StopIteration
        raise ConfigError(f"{key}={path} has no rows; a task needs at least one example.")
    return builder


def read_rows(path: str, key: str) -> list[dict[str, Any]]:
    """The rows of one local split as dicts; one sentence for a missing, bad or empty file."""
    builder = split_builder(path, key)
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # local files only: never the hub
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import datasets

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)  # its errors become ours
    try:
        ds = datasets.load_dataset(builder, data_files=path, split="train")
    except Exception as err:  # datasets' and pyarrow's many parse errors
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(f"{key}={path} cannot be read as {builder} ({first}).") from None
    if len(ds) == 0:
        raise ConfigError(f"{key}={path} has no rows; a task needs at least one example.")
    return ds.to_list()


def _require_path(cfg) -> None:
    if not cfg.path:
        raise ConfigError("task=dataset needs task.path=FILE (a .jsonl or .parquet file).")


def open_tokenizer(cfg, checkpoint: str | None, chat_template: bool) -> HFTokenizer:
    """The task's tokenizer (`task.tokenizer`, by default `model.checkpoint`'s), its refusals
    naming the key the user set."""
    directory, where = tokenizer_source(cfg, checkpoint)
    if directory is None:
        raise ConfigError(
            "task=dataset needs a tokenizer: set model.checkpoint=DIR (its tokenizer is "
            "used) or task.tokenizer=DIR."
        )
    return HFTokenizer(directory, chat_template, where)


def check_inputs(cfg, checkpoint: str | None) -> None:
    """What a dataset task reads, checked without reading a row or loading torch: the split
    files, the tokenizer and the reward function's import. The chat template is checked as
    the task is built: transformers renders it, and imports torch."""
    _require_path(cfg)
    split_builder(cfg.path, "task.path")
    if cfg.val_path:
        split_builder(cfg.val_path, "task.val_path")
    open_tokenizer(cfg, checkpoint, chat_template=False)
    load_reward(cfg.reward)


def _check_width(cfg, checkpoint: str | None, tokens: int, vocab_size: int) -> None:
    """A tokenizer with more tokens than the model's vocabulary, refused naming the keys set."""
    if tokens <= vocab_size:
        return
    _, where = tokenizer_source(cfg, checkpoint)
    if checkpoint:  # the model's vocabulary is the checkpoint's (config.json)
        raise ConfigError(
            f"{where} has {tokens} tokens but model.checkpoint={checkpoint} has "
            f"vocab_size={vocab_size} in its config.json; name a tokenizer of its vocabulary "
            "with task.tokenizer."
        )
    raise ConfigError(
        f"{where} has {tokens} tokens but the model only {vocab_size} (model.vocab_size); "
        "raise model.vocab_size or name a tokenizer of the model's vocabulary with "
        "task.tokenizer."
    )


class DatasetTask:
    """A train split (sampled each step) and an optional validation split of (prompt, answer).

    `checkpoint`: `model.checkpoint`, the tokenizer's default directory.
    """

    def __init__(self, cfg, vocab_size: int, checkpoint: str | None = None):
        self.cfg = cfg
        _require_path(cfg)
        self.reward_fn = load_reward(cfg.reward)
        self.tokenizer = open_tokenizer(cfg, checkpoint, cfg.chat_template)
        _check_width(cfg, checkpoint, len(self.tokenizer), vocab_size)
        self.train = self._examples(cfg.path, "task.path")
        self.val = self._examples(cfg.val_path, "task.val_path") if cfg.val_path else []
        self._probe()

    def _examples(self, path: str, key: str) -> list[Example]:
        rows = read_rows(path, key)
        for column in ("prompt_key", "answer_key"):
            name = getattr(self.cfg, column)
            if name not in rows[0]:
                raise ConfigError(
                    f"task.{column}={name!r} is not a column of {key}={path} "
                    f"(its columns: {', '.join(map(str, rows[0]))})."
                )
        out = []
        for i, row in enumerate(rows):
            prompt, answer = row[self.cfg.prompt_key], row[self.cfg.answer_key]
            if not isinstance(prompt, str) or not prompt:
                raise ConfigError(
                    f"row {i} of {key}={path} has {self.cfg.prompt_key}={prompt!r}, not a "
                    "non-empty text."
                )
            if answer is None:
                raise ConfigError(f"row {i} of {key}={path} has no {self.cfg.answer_key}.")
            prompt = self.cfg.prompt_template.replace("{prompt}", prompt)
            ids = tuple(self.tokenizer.prompt_ids(prompt))
            out.append(Example(i, prompt, str(answer), ids))
        return out

    def _probe(self) -> None:
        """The reward of the first example's own answer, so a broken function stops here."""
        first = self.train[0]
        try:
            call_reward(
                self.reward_fn, self.cfg.reward, first.prompt_text, first.answer, first.answer
            )
        except RewardError as err:
            raise ConfigError(
                f"{err}, the first example's own answer, so no step could be scored; fix the "
                "function or choose another task.reward."
            ) from None

    @property
    def max_prompt_len(self) -> int:
        return max(len(e.prompt_ids) for e in self.train + self.val)

    def prompt(self, problem: Example) -> list[int]:
        return list(problem.prompt_ids)

    def problems(self, seed: int, step: int, count: int) -> list[Example]:
        """`count` train examples for `step`: a seeded draw, without repeats while it can."""
        rng = random.Random(seed * 1_000_003 + step)
        if count <= len(self.train):
            return rng.sample(self.train, count)
        return [rng.choice(self.train) for _ in range(count)]

    def validation_problems(self, limit: int = 0) -> list[Example]:
        return self.val[:limit] if limit else list(self.val)

    def varied_prompts(self, seed: int, count: int) -> list[list[int]]:
        """Train prompts of the dataset itself (certification)."""
        return [list(e.prompt_ids) for e in self.problems(seed, 0, count)]

    def target(self, problem: Example) -> list[int]:
        """A right response: the answer text, then EOS (what a supervised warm start learns)."""
        return [*self.tokenizer.encode(problem.answer, special=False), self.tokenizer.eos_id]

    def reward(self, problem: Example, response: list[int]) -> float:
        text = self.tokenizer.response_text(response)
        return call_reward(
            self.reward_fn, self.cfg.reward, problem.prompt_text, text, problem.answer
        )

    def text_fields(self, prompt: list[int], response: list[int]) -> dict[str, str]:
        """The decoded texts a token record carries beside its ids (specials kept)."""
        return {
            "prompt_text": self.tokenizer.decode(prompt),
            "response_text": self.tokenizer.decode(response),
        }
