"""The one switch mechanism (`zkl.switch.Switch`) behind the fixes, the quantized-weight
cache and static shapes: a scope sets it, and its end, error or not, puts the old value back."""

from __future__ import annotations

import pytest
import torch

from zkl import invariance
from zkl.ops import fast
from zkl.precision import recipes as precision
from zkl.switch import Switch


def test_a_scope_restores_the_previous_value_when_it_ends_or_fails():
    switch = Switch("demo", 0)
    with switch.scoped(1):
        with switch.scoped(2):
            assert switch.get() == 2
        assert switch.get() == 1
        with pytest.raises(RuntimeError), switch.scoped(3):
            raise RuntimeError("boom")
        assert switch.get() == 1
    assert switch.get() == 0


def test_fixes_weight_cache_and_static_shapes_are_switches_that_restore_on_error():
    cpu = torch.device("cpu")
    assert not invariance.active() and not fast.shapes_are_static(cpu)
    assert precision._WEIGHT_CACHE.get() is None
    cache: dict[int, torch.Tensor] = {}
    fixes = invariance.enabled({"batch_invariant_gemm"})
    with pytest.raises(RuntimeError), fixes, precision.weight_cache(cache), fast.static_shapes():
        assert invariance.is_enabled("batch_invariant_gemm")
        assert not invariance.is_enabled("attention_fixed_split")
        assert precision._WEIGHT_CACHE.get() is cache and fast.shapes_are_static(cpu)
        raise RuntimeError("a step fails mid-scope")
    assert not invariance.active() and not fast.shapes_are_static(cpu)
    assert precision._WEIGHT_CACHE.get() is None
    for switch in (invariance._ACTIVE, precision._WEIGHT_CACHE, fast._STATIC_SHAPES):
        assert isinstance(switch, Switch)
