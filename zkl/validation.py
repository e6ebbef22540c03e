"""Checks of hostile values that `validate` runs before its per-key rules.

A NaN passes every `value <= 0` test and an integer in the billions passes every `> 0`
test, so every float is checked for finiteness and every integer for a bound first; then
the rules that the optimizer, the rotary embedding and the sampler would otherwise hit
later with a traceback.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from typing import Any

from zkl.errors import ConfigError
from zkl.rl.task import TASKS, build_task

INT_MAX = 2**31 - 1  # every integer knob (a count or a size) stays below this
SEED_MAX = 2**63 - 1  # torch generators take 64-bit seeds
MAX_SAMPLES_PER_STEP = 2**20  # rl.prompts_per_step * rl.samples_per_prompt
MIN_TEMPERATURE, MAX_TEMPERATURE = 1e-4, 1e4
MIN_TIMEOUT_S, MAX_TIMEOUT_S = 1.0, 86400.0
MAX_THREADS = 1024


def leaves(obj: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of every leaf of a config dataclass."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            yield from leaves(value, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", value


def check_values(cfg: Any) -> None:
    """Every float (lists included) finite, every integer within its bound."""
    for key, value in leaves(cfg):
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, bool):
                continue
            if isinstance(item, float) and not math.isfinite(item):
                raise ConfigError(f"{key}={value} must be a finite number.")
            if isinstance(item, int):
                low, high = (0, SEED_MAX) if key == "seed" else (-INT_MAX, INT_MAX)
                if not low <= item <= high:
                    raise ConfigError(f"{key}={value} must be between {low} and {high}.")


def check_limits(cfg: Any) -> None:
    """The rules a later stage (task, sampler, AdamW, layout) would fail on with a traceback."""
    if cfg.task.name not in TASKS and not cfg.task._target_:
        raise ConfigError(
            f"task.name={cfg.task.name!r} is not a built-in task; use one of {TASKS}."
        )
    if cfg.rl.val_every < 0 or cfg.rl.val_prompts < 0:
        raise ConfigError("rl.val_every and rl.val_prompts must be >= 0 (0: off / all).")
    if cfg.rl.val_every and cfg.task.name == "dataset" and not cfg.task.val_path:
        raise ConfigError(
            f"rl.val_every={cfg.rl.val_every} needs a validation split: set "
            "task.val_path=FILE, or rl.val_every=0."
        )
    temperature = cfg.sampling.temperature
    if not MIN_TEMPERATURE <= temperature <= MAX_TEMPERATURE:
        raise ConfigError(
            f"sampling.temperature={temperature} must be between {MIN_TEMPERATURE:g} and "
            f"{MAX_TEMPERATURE:g} (below, logits / temperature overflows; above, sampling is "
            "uniform)."
        )
    rl = cfg.rl
    if rl.weight_decay < 0:
        raise ConfigError(f"rl.weight_decay={rl.weight_decay} must be >= 0.")
    if len(rl.betas) != 2 or not all(0 <= b < 1 for b in rl.betas):
        raise ConfigError(f"rl.betas={list(rl.betas)} must be two numbers in [0, 1).")
    samples = rl.prompts_per_step * rl.samples_per_prompt
    if samples > MAX_SAMPLES_PER_STEP:
        raise ConfigError(
            f"rl.prompts_per_step * rl.samples_per_prompt = {samples} samples a step; at most "
            f"{MAX_SAMPLES_PER_STEP} are allowed."
        )
    if rl.num_minibatches > samples:
        raise ConfigError(
            f"rl.num_minibatches={rl.num_minibatches} is more than the {samples} samples of a "
            "step (rl.prompts_per_step * rl.samples_per_prompt)."
        )
    if not MIN_TIMEOUT_S <= cfg.layout.timeout_s <= MAX_TIMEOUT_S:
        raise ConfigError(
            f"layout.timeout_s={cfg.layout.timeout_s} must be between {MIN_TIMEOUT_S:g} and "
            f"{MAX_TIMEOUT_S:g} (a day)."
        )
    for axis in ("models", "precisions", "layouts", "kv"):
        values = getattr(cfg.cert, axis)
        if values is not None and not values:  # null: the config's own option
            raise ConfigError(f"cert.{axis} is empty, so nothing would be certified; name one.")
    if cfg.num_threads > MAX_THREADS:
        raise ConfigError(f"num_threads={cfg.num_threads} must be at most {MAX_THREADS}.")
    dump = cfg.tracking.dump_tokens
    if dump != "all" and not (
        dump.isascii() and dump.isdigit() and len(dump) <= 10 and int(dump) <= INT_MAX
    ):
        raise ConfigError(
            f"tracking.dump_tokens={dump!r} must be a count (0 to {INT_MAX}) or 'all'."
        )


def default_positions(cfg: Any) -> int:
    """Positions a run of the configured task needs: its longest prompt plus the response."""
    return build_task(cfg.task, cfg.model.vocab_size).max_prompt_len + (cfg.sampling.max_new_tokens)
