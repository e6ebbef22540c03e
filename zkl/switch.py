"""The one mechanism behind every process-wide switch: a value set for a `with` block.

The fixes that are on (`zkl.invariance.enabled`), the generator's cache of quantized weights
(`zkl.precision.recipes.weight_cache`) and a CUDA graph step's static shapes
(`zkl.ops.fast.static_shapes`) are each a `Switch`. Code reads one with `get()` (through
its owner's `is_enabled`-style accessor); only `scoped(value)` changes it, and its `finally`
puts the previous value back however the block ends, so nested scopes and errors never
leave a switch behind. The value is the process's, not a thread's: the trainer and the
generator it hosts see the same setting.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class Switch(Generic[T]):
    """A named process-wide value, changed only for the duration of a `scoped` block."""

    def __init__(self, name: str, default: T):
        self.name = name
        self._value = default

    def get(self) -> T:
        return self._value

    @contextlib.contextmanager
    def scoped(self, value: T) -> Iterator[T]:
        """`value` inside the block; the previous value back when it ends, error or not."""
        previous, self._value = self._value, value
        try:
            yield value
        finally:
            self._value = previous

    def __repr__(self) -> str:
        return f"Switch({self.name!r}, {self._value!r})"
