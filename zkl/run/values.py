"""Hostile numbers, refused before any part's own check.

A NaN passes every `value <= 0` test and an integer in the billions passes every `> 0`
test, so every float of every part is checked for finiteness and every integer for a bound
first; then each part's rules can compare plainly.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from typing import Any

from zkl.errors import ConfigError

INT_MAX = 2**31 - 1  # every integer knob (a count or a size) stays below this
SEED_MAX = 2**63 - 1  # torch generators take 64-bit seeds


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
