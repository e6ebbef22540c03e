"""What the command line says of the model: a group (`model=NAME`) or single keys
(`model.KEY=VALUE`, a section's `model.moe.KEY=VALUE`). Torch-free, so the run and the report
read overrides by one rule."""

from __future__ import annotations

import re

_MODEL_KEY = re.compile(r"^[+~]*model\.([A-Za-z_][A-Za-z0-9_.]*)=")
_MODEL_GROUP = re.compile(r"^[+~]*model=")


def names_model_group(overrides: list[str]) -> bool:
    """Whether an override picks a model group (`model=`, `+model=`, `~model=`)."""
    return any(_MODEL_GROUP.match(o) for o in overrides)


def model_keys(overrides: list[str]) -> set[str]:
    """The `model.*` keys the overrides set (a section's dotted: `moe.num_experts`)."""
    return {m.group(1) for o in overrides if (m := _MODEL_KEY.match(o))}
