"""Nemotron-H hybrid: a stack of Mamba2, attention, MLP and MoE layers, one mixer per layer.

Each layer is `x + mixer(norm(x))`; the kind of mixer comes from the hybrid pattern
(`M`, `*`, `-`, `E`). Attention has no positional encoding (the Mamba layers carry order);
MLPs and experts are non-gated relu^2; the MoE routes with sigmoid scores plus a correction
bias (group-limited top-k) and adds a shared expert. Names follow HF's `NemotronHModel`
except `embed_tokens` / `norm` (HF: `embeddings` / `norm_f`), as in zkl's Transformer.
"""

from __future__ import annotations

import torch
from torch import nn

from zkl import ops
from zkl.generation.mamba_cache import HybridCache
from zkl.models.causal_lm import CausalLM
from zkl.models.config import ModelConfig
from zkl.models.mamba2 import Mamba2Mixer
from zkl.models.moe import SparseMoE
from zkl.models.transformer import Attention, Linear, RMSNorm, init_weights
from zkl.ops.activations import sigmoid


class ReluSquaredMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.up_proj = Linear(hidden, intermediate, False)
        self.down_proj = Linear(intermediate, hidden, False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(torch.relu(self.up_proj(x)).square())


class Router(nn.Module):
    """fp32 sigmoid router with `e_score_correction_bias` (chooses experts, not weights)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(cfg.moe.num_experts, cfg.hidden_size))
        self.register_buffer("e_score_correction_bias", torch.zeros(cfg.moe.num_experts))


class HybridMoE(SparseMoE):
    """Nemotron-H MoE: routed relu^2 experts (SparseMoE's dispatch and combine) + shared expert."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        moe = cfg.moe
        self.top_k = moe.num_experts_per_tok
        self.norm_topk_prob = moe.norm_topk_prob
        self.scale = moe.routed_scaling_factor
        self.num_expert_groups, self.topk_expert_groups = (
            moe.num_expert_groups,
            moe.topk_expert_groups,
        )
        self.gate = Router(cfg)
        self.experts = nn.ModuleList(
            ReluSquaredMLP(cfg.hidden_size, moe.intermediate_size) for _ in range(moe.num_experts)
        )
        self.shared_experts = ReluSquaredMLP(cfg.hidden_size, moe.shared_expert_intermediate_size)

    def choose_experts(self, x: torch.Tensor, fixed: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """x [N, H] -> (expert ids [N, k], fp32 weights [N, k]), HF's group-limited top-k."""
        logits = ops.linear(x.float(), self.gate.weight.float(), None)
        scores = sigmoid(logits)  # [N, E]
        choice = scores + self.gate.e_score_correction_bias.float()
        num = scores.shape[0]
        grouped = choice.view(num, self.num_expert_groups, -1)
        if self.num_expert_groups > 1:
            group_scores = grouped.topk(2, dim=-1)[0].sum(-1)  # [N, G]
            keep = group_scores.topk(self.topk_expert_groups, dim=-1)[1]
            mask = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, keep, True)
            grouped = grouped.masked_fill(~mask.unsqueeze(-1), float("-inf"))
        choice = grouped.view(num, -1)
        if fixed:  # stable: equal scores resolve to the lower expert id
            top_i = choice.sort(dim=-1, descending=True, stable=True).indices[:, : self.top_k]
        else:
            top_i = choice.topk(self.top_k, dim=-1)[1]
        top_w = scores.gather(1, top_i)
        if self.norm_topk_prob:
            if fixed:
                total = top_w[:, 0]
                for s in range(1, self.top_k):  # fixed order, whatever the row count
                    total = total + top_w[:, s]
                top_w = top_w / (total.unsqueeze(-1) + 1e-20)
            else:
                top_w = top_w / (top_w.sum(-1, keepdim=True) + 1e-20)
        return top_i, top_w * self.scale

    def grouped_experts(self, rows, offsets, top_i, by_expert) -> torch.Tensor:
        """rows [P, H] grouped per expert at `offsets` -> each row through its relu^2 expert."""
        up = ops.grouped_linear(rows, [e.up_proj.weight for e in self.experts], offsets)
        down = [e.down_proj.weight for e in self.experts]
        return ops.grouped_linear(torch.relu(up).square(), down, offsets)

    def forward(self, x: torch.Tensor, expert_order=None, routes=None) -> torch.Tensor:
        return super().forward(x, expert_order, routes) + self.shared_experts(x)


class HybridLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, kind: str, index: int):
        super().__init__()
        self.kind = kind
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        if kind == "mamba":
            self.mixer = Mamba2Mixer(cfg, index)
        elif kind == "attention":
            self.mixer = Attention(cfg, index)
        elif kind == "moe":
            self.mixer = HybridMoE(cfg)
        else:
            self.mixer = ReluSquaredMLP(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, x, positions, cache=None, slots=None, routes=None) -> torch.Tensor:
        """`routes`: the forward's route tape, for an MoE layer (`zkl.routes`)."""
        h = self.norm(x)
        if self.kind == "mamba":
            return x + self.mixer(h, positions, cache, slots)
        if self.kind == "attention":
            return x + self.mixer(h, positions, None, cache, slots)
        if self.kind == "moe":
            return x + self.mixer(h, routes=routes)
        return x + self.mixer(h)


class NemotronH(CausalLM):
    """Nemotron-H: on the gen path every token of a row is real (no padding)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        kinds = [cfg.layer_kind(i) for i in range(cfg.num_hidden_layers)]
        # attention and Mamba layers index their own rows of the cache
        index = [kinds[:i].count(kind) for i, kind in enumerate(kinds)]
        self.layers = nn.ModuleList(
            HybridLayer(cfg, i, kinds[i], index[i]) for i in range(cfg.num_hidden_layers)
        )
        self.num_attention_layers = kinds.count("attention")
        self.num_mamba_layers = kinds.count("mamba")
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, False, quantizable=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def hidden_states(
        self, tokens, positions, cache=None, slots=None, logit_index=None, routes=None
    ):
        """As `Transformer.hidden_states`."""
        x = self.embed_tokens(tokens)
        for layer in self.layers:
            x = self.run_layer(layer, x, positions, cache, slots, routes)
        if logit_index is not None:
            x = x[torch.arange(x.shape[0], device=x.device), logit_index]
        return self.norm(x)

    def make_cache(self, num_slots: int, max_len: int) -> HybridCache:
        """The gen path's cache: K/V of the attention layers, state of the Mamba layers."""
        weight = self.embed_tokens.weight
        return HybridCache(self, num_slots, max_len, weight.dtype, weight.device)


def init_hybrid_weights(model: NemotronH, seed: int) -> None:
    """`init_weights`, then HF's Mamba constants: A_log = log(1..H), D = 1, dt_bias = 1, and
    conv taps uniform in +-1/sqrt(conv_kernel) (nn.Conv1d's bound) instead of +-init_std*sqrt(3).

    Exact operations (constants, one correctly rounded scaling), so every device gets the
    same bits; with them the SSM path carries real signal, as in a trained model, instead of
    vanishing under the D skip and bf16 rounding (with the default init it did: decode by the
    recurrence then matched training bit for bit in bf16).
    """
    init_weights(model, seed)
    half_width = model.cfg.init_std * 3.0**0.5
    with torch.no_grad():
        for layer in model.layers:
            if layer.kind == "mamba":
                mixer = layer.mixer
                heads = torch.arange(1, mixer.num_heads + 1, dtype=torch.float32, device="cpu")
                mixer.A_log.copy_(torch.log(heads))
                mixer.D.fill_(1.0)
                mixer.dt_bias.fill_(1.0)
                mixer.conv1d.weight.mul_(mixer.kernel**-0.5 / half_width)
