"""gpt-oss: attention with learned sinks, alternating sliding-window and full layers, YaRN
RoPE (`model.rope.type=yarn`, a rule of `zkl.models.rope`), biases on q/k/v/o, and a top-k
MoE (router bias, softmax over the k chosen logits) whose experts are biased clamped SwiGLUs.
One definition for the train path and the gen path.

Attention is the shared `transformer.Attention` (its sinks, o_proj bias and window come from
the config). The MoE dispatches as Qwen3-MoE's does (`zkl.models.moe`): grouped per expert on
the device, experts as grouped GEMMs, the fp32 combine in top-k slot order with
`moe_combine_order`. zkl's names are HF's without `model.`, except the router is `mlp.gate`
(so the precision recipes keep it fp32, as every router) and q/k/v and gate/up are fused.
"""

from __future__ import annotations

import torch
from torch import nn

from zkl import ops
from zkl.models import transformer
from zkl.models.config import ModelConfig
from zkl.models.moe import SparseMoE, grouped_bias, top_k_softmax_route
from zkl.models.transformer import Linear
from zkl.ops import activations


def clamped_swiglu(gate: torch.Tensor, up: torch.Tensor, alpha: float, limit: float):
    """gpt-oss's activation: (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g), with
    g = min(gate, limit); elementwise in the activation dtype, the same on every path. The
    sigmoid is `zkl.ops.activations`' (torch's CPU kernel rounds an element by its place in
    the tensor, so a decode step's rows would leave scoring's bits)."""
    gate = gate.clamp(max=limit)
    up = up.clamp(min=-limit, max=limit)
    return (up + 1) * (gate * activations.sigmoid(gate * alpha))


class Expert(nn.Module):
    """One expert: fused gate/up with biases, the clamped SwiGLU, down with a bias."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        width = cfg.moe.intermediate_size
        parts = {"gate_proj": width, "up_proj": width}
        self.gate_up_proj = Linear(cfg.hidden_size, parts, True)
        self.down_proj = Linear(width, cfg.hidden_size, True)
        self.alpha, self.limit = cfg.moe.swiglu_alpha, cfg.moe.swiglu_limit

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj.split(self.gate_up_proj(x))
        return self.down_proj(clamped_swiglu(gate, up, self.alpha, self.limit))


class MoE(SparseMoE):
    """Router with a bias, top-k, softmax over the k logits; experts weighted and added."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.top_k = cfg.moe.num_experts_per_tok
        self.gate = Linear(cfg.hidden_size, cfg.moe.num_experts, True, quantizable=False)
        self.experts = nn.ModuleList(Expert(cfg) for _ in range(cfg.moe.num_experts))

    def choose_experts(self, x: torch.Tensor, fixed: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """x [N, H] -> (expert ids [N, k], fp32 weights [N, k]) (`moe.top_k_softmax_route`)."""
        return top_k_softmax_route(x, self.gate.weight, self.gate.bias, self.top_k, fixed)

    def replayed(self, x, top_i, top_w, fixed, routes) -> tuple[torch.Tensor, torch.Tensor]:
        """gpt-oss replays no routes (the registry gives it no `route_replay`): its own stands."""
        return top_i, top_w

    def grouped_experts(self, rows, offsets, top_i, by_expert) -> torch.Tensor:
        """rows [P, H] grouped per expert at `offsets` -> each row through its expert: the
        grouped GEMMs, then each row's own expert bias (a row-wise add)."""
        experts = self.experts
        up_bias = torch.stack([e.gate_up_proj.bias for e in experts])  # [E, 2I]
        down_bias = torch.stack([e.down_proj.bias for e in experts])  # [E, H]
        fused = ops.grouped_linear(rows, [e.gate_up_proj.weight for e in experts], offsets)
        fused = fused + grouped_bias(up_bias, top_i, by_expert).to(fused.dtype)
        gate, up = experts[0].gate_up_proj.split(fused)
        hidden = clamped_swiglu(gate, up, experts[0].alpha, experts[0].limit)
        out = ops.grouped_linear(hidden, [e.down_proj.weight for e in experts], offsets)
        return out + grouped_bias(down_bias, top_i, by_expert).to(out.dtype)


class Block(transformer.Block):
    """The shared block with gpt-oss's MoE as every layer's feed-forward part."""

    def make_mlp(self, cfg: ModelConfig, layer: int) -> nn.Module:
        return MoE(cfg)


class GptOss(transformer.Transformer):
    block_class = Block
