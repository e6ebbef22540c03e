"""The MoE layer's experts as grouped GEMMs with device-side group offsets.

The CPU reference gives the bits of one call per expert (each group through the dense
GEMM); the CUDA forms (Triton, run here by the interpreter) read the offsets on the device,
so the layer's forward reads nothing back to the host in either mode.
"""

from __future__ import annotations

import dataclasses
from functools import partial

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from zkl import invariance, ops
from zkl.models.config import ModelConfig, MoEConfig
from zkl.models.nemotron_h import HybridMoE
from zkl.models.transformer import Qwen3MoE

MOE = ModelConfig(
    family="qwen3_moe",
    hidden_size=64,
    # four adds a token: the combine's rounding order shows
    moe=MoEConfig(num_experts=8, num_experts_per_tok=4, intermediate_size=48),
)
HYBRID = ModelConfig(
    family="nemotron_h",
    hidden_size=64,
    moe=MoEConfig(
        num_experts=8,
        num_experts_per_tok=2,
        intermediate_size=48,
        shared_expert_intermediate_size=32,
        routed_scaling_factor=2.5,
    ),
)
FIXES = {"moe_combine_order", "batch_invariant_gemm", "batch_invariant_reductions"}


def _seeded(module: torch.nn.Module, dtype: torch.dtype, seed: int = 5) -> torch.nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return module.to(dtype)


def _one_call_per_expert(moe: Qwen3MoE, x: torch.Tensor, fixed: bool) -> torch.Tensor:
    """The layer as one module call per expert on its rows (the spec the grouped GEMMs keep):
    pairs grouped by a stable sort, results to the pairs' places, the same two combines."""
    flat = x.reshape(-1, x.shape[-1])
    top_i, top_w = moe.route(flat)
    top_k = top_i.shape[-1]
    pairs = top_i.reshape(-1)
    by_expert = torch.sort(pairs, stable=True).indices
    results = flat.new_zeros(pairs.numel(), flat.shape[-1], dtype=torch.float32)
    out = torch.zeros_like(flat)
    for e, expert in enumerate(moe.experts):
        chosen = by_expert[pairs[by_expert] == e]
        if not chosen.numel():
            continue
        rows = chosen // top_k
        y = expert(flat[rows])
        if fixed:
            results[chosen] = y.float()
        else:
            out.index_add_(0, rows, y * top_w.reshape(-1)[chosen].unsqueeze(-1).to(x.dtype))
    if fixed:
        weighted = results.view(-1, top_k, flat.shape[-1]) * top_w.unsqueeze(-1)
        out = weighted[:, 0]
        for s in range(1, top_k):
            out = out + weighted[:, s]
        out = out.to(x.dtype)
    if isinstance(moe, HybridMoE):
        out = out + moe.shared_experts(flat)
    return out.reshape(x.shape)


@pytest.mark.parametrize("layer", [Qwen3MoE(MOE), HybridMoE(HYBRID)], ids=["qwen3", "nemotron"])
@pytest.mark.parametrize("fixed", [True, False], ids=["fixes_on", "fixes_off"])
def test_grouped_experts_equal_one_call_per_expert(layer, fixed):
    """Bitwise, at batch sizes where some experts get no row (1 token: 4 or 6 of 8 idle)."""
    moe = _seeded(layer, torch.bfloat16)
    g = torch.Generator().manual_seed(7)
    idle = 0
    with invariance.enabled(FIXES if fixed else set()), torch.no_grad():
        for tokens in (1, 3, 16, 37, 64):
            x = torch.randn(tokens, 64, generator=g).to(torch.bfloat16)
            idle += int(len(moe.route(x)[0].unique()) < 8)
            assert torch.equal(moe(x), _one_call_per_expert(moe, x, fixed)), tokens
    assert idle > 0


def test_grouped_experts_gradients_reach_every_routed_expert():
    """The gradients equal those of one call per expert (fp32, to 1e-5: the two backward
    passes sum the same terms in other orders), and reach exactly the routed experts."""
    moe = _seeded(Qwen3MoE(MOE), torch.float32)
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(8), requires_grad=True)
    grads = {}
    per_expert = partial(_one_call_per_expert, moe, fixed=True)
    for name, forward in (("grouped", moe), ("per_expert", per_expert)):
        moe.zero_grad(set_to_none=True)
        x.grad = None
        with invariance.enabled(FIXES):
            forward(x).square().sum().backward()
        weights = [e.gate_up_proj.weight.grad for e in moe.experts]
        grads[name] = (x.grad, weights, [e.down_proj.weight.grad for e in moe.experts])
        routed = set(moe.route(x)[0].reshape(-1).tolist())
    for e in range(len(moe.experts)):
        assert (grads["grouped"][1][e] is not None) == (e in routed), e
    torch.testing.assert_close(grads["grouped"], grads["per_expert"], rtol=1e-5, atol=1e-5)


def test_group_offsets_come_from_the_device():
    """Offsets of the sorted expert ids: empty groups included, no bincount."""
    from zkl.models.moe import group_by_expert

    top_i = torch.tensor([[3, 1], [1, 0], [3, 2]])
    by_expert, offsets = group_by_expert(top_i, 6)
    assert offsets.tolist() == [0, 1, 3, 4, 6, 6, 6]
    assert by_expert.tolist() == [3, 1, 2, 5, 0, 4]


class HostReadError(AssertionError):
    pass


# Ops that copy device data to the host or whose output shape depends on the data.
_HOST_READS = {
    "aten._local_scalar_dense",
    "aten.item",
    "aten.nonzero",
    "aten.nonzero_static",
    "aten.bincount",
    "aten.masked_select",
    "aten.unique",
    "aten._unique",
    "aten._unique2",
    "aten.unique_dim",
    "aten.unique_consecutive",
}


class NoHostReads(TorchDispatchMode):
    """Raises on any op that would read device data back to the host (a CUDA sync)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket._qualified_op_name.replace("::", ".")
        if name in _HOST_READS:
            raise HostReadError(f"{func} reads device data on the host")
        repeats = args[1] if len(args) > 1 else kwargs.get("repeats", args[0])
        tensor_repeats = isinstance(repeats, torch.Tensor)
        if (
            name == "aten.repeat_interleave"
            and tensor_repeats
            and kwargs.get("output_size") is None
        ):
            raise HostReadError(f"{func} without output_size sizes its output from the data")
        if name in ("aten.index", "aten.index_put", "aten.index_put_"):
            indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
            if any(t is not None and t.dtype == torch.bool for t in indices):
                raise HostReadError(f"{func} with a boolean mask sizes its output from the data")
        return func(*args, **(kwargs or {}))


def test_the_host_read_detector_catches_a_bincount_and_a_mask():
    x = torch.arange(6)
    with pytest.raises(HostReadError), NoHostReads():
        torch.bincount(x).tolist()
    with pytest.raises(HostReadError), NoHostReads():
        x[x > 2]
    with pytest.raises(HostReadError), NoHostReads():
        torch.repeat_interleave(x, x)
    with NoHostReads():  # sizes known on the host
        torch.repeat_interleave(x, 2)
        torch.repeat_interleave(x, x, output_size=15)


@pytest.mark.parametrize("layer", [Qwen3MoE(MOE), HybridMoE(HYBRID)], ids=["qwen3", "nemotron"])
@pytest.mark.parametrize("fixed", [True, False], ids=["fixes_on", "fixes_off"])
def test_moe_forward_reads_nothing_back_to_the_host(layer, fixed, monkeypatch):
    """The layer with the CUDA forms of the grouped GEMM (Triton, in the interpreter here):
    routing, grouping, the expert GEMMs and the combine all stay on the device."""
    pytest.importorskip("triton")
    from zkl.ops.triton import grouped_gemm  # triton: an optional dependency

    table = ops.TABLE["grouped_linear"]  # the CPU cells take the CUDA forms
    cuda_forms = {"cpu_fast": grouped_gemm.grouped_linear_default}
    cuda_forms["cpu_invariant"] = grouped_gemm.grouped_linear
    monkeypatch.setitem(ops.TABLE, "grouped_linear", dataclasses.replace(table, **cuda_forms))
    moe = _seeded(layer, torch.float32)
    x = torch.randn(2, 5, 64, generator=torch.Generator().manual_seed(3))
    with invariance.enabled(FIXES if fixed else set()), torch.no_grad():
        want = _one_call_per_expert(moe, x, fixed)
        with NoHostReads():
            got = moe(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)  # the interpreter's dot: NumPy
