"""The pre-norm decoder of Qwen2 / Qwen3 / Qwen3-MoE / Llama / Mistral: one definition for
the train path and the gen path (biases, RoPE scaling and the sliding window from the config).

The forward takes absolute positions and, on the gen path, a KV cache with the cache slots
of the rows; it writes K/V to the cache *before* attention, so prefill and decode read keys
the same way the train path does.
"""

from __future__ import annotations

import torch
from torch import nn

from zkl import ops, rng
from zkl.models.causal_lm import CausalLM
from zkl.models.config import ModelConfig, check_positions
from zkl.models.fused import init_order
from zkl.models.moe import SparseMoE, fixed_route, renormalized, router_probs
from zkl.models.rope import frequencies
from zkl.precision.recipes import RecipeLinear, linear_weight_and_input


class Linear(RecipeLinear):
    """y = x W^T + b through `zkl.ops.linear`; the precision recipe may quantize W and x.

    `out_features` as a dict (part name -> rows) makes a fused projection: projections that
    read the same input (q/k/v, gate/up) stored back to back as one weight, so every path
    runs one GEMM for them. The part names are the separate projections' (HF's), which the
    checkpoint adapters and the seeded init follow (`zkl.models.fused`), and a per-tensor
    quantizer scales each part on its own, as it would scale separate projections.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int | dict[str, int],
        bias: bool,
        quantizable: bool = True,
    ):
        super().__init__()
        self.parts = dict(out_features) if isinstance(out_features, dict) else {}
        rows = sum(self.parts.values()) if self.parts else out_features
        self.weight = nn.Parameter(torch.empty(rows, in_features))
        self.bias = nn.Parameter(torch.zeros(rows)) if bias else None
        self.quantizable = quantizable  # embedding, lm_head, router are never quantized

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight, x = linear_weight_and_input(self, x)
        return ops.linear(x, weight, self.bias)

    def split(self, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """A fused projection's output [..., rows] as its parts' outputs (views)."""
        return y.split(list(self.parts.values()), dim=-1)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.rms_norm(x, self.weight, self.eps)

    def add_forward(
        self, x: torch.Tensor, delta: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(x + delta, norm(x + delta)): a pre-norm block's residual add and its next norm."""
        if delta is None:
            return x, self(x)
        return ops.add_rms_norm(x, delta, self.weight, self.eps)


class RotaryEmbedding(nn.Module):
    """cos/sin tables built once for every position, so a position's angles never vary."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        shape = (cfg.max_position_embeddings, cfg.head_dim)
        if torch.empty(0).is_meta:  # counts and layouts: shapes only, nothing computed
            self.register_buffer("cos", torch.empty(shape), persistent=False)
            self.register_buffer("sin", torch.empty(shape), persistent=False)
            return
        # Built on the CPU whatever the model's device, so every device gets the same tables.
        inv_freq, scale = frequencies(cfg)  # [D/2] float64, by model.rope.type
        positions = torch.arange(shape[0], dtype=torch.float64, device="cpu")
        angles = torch.outer(positions, inv_freq)
        angles = torch.cat([angles, angles], dim=-1)
        self.register_buffer("cos", (angles.cos() * scale).float(), persistent=False)
        self.register_buffer("sin", (angles.sin() * scale).float(), persistent=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x [B, H, T, D], positions [B, T] (megatron's layout; zkl's models call `ops.rotary`)."""
        cos = self.cos[positions].unsqueeze(1)  # [B, 1, T, D]
        sin = self.sin[positions].unsqueeze(1)
        xf = x.float()
        half = xf.shape[-1] // 2
        rotated = torch.cat([-xf[..., half:], xf[..., :half]], dim=-1)
        return (xf * cos + rotated * sin).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.layer = layer
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        q_rows, kv_rows = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        parts = {"q_proj": q_rows, "k_proj": kv_rows, "v_proj": kv_rows}
        self.qkv_proj = Linear(cfg.hidden_size, parts, cfg.qkv_bias)
        self.o_proj = Linear(self.num_heads * self.head_dim, cfg.hidden_size, cfg.o_proj_bias)
        # gpt-oss: one learned logit a head in the softmax's denominator, with no value
        self.sinks = nn.Parameter(torch.zeros(self.num_heads)) if cfg.attention_sinks else None
        self.window = cfg.layer_window(layer)
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None

    def forward(self, x, positions, rope, cache=None, slots=None) -> torch.Tensor:
        """x [B, T, hidden]; `rope` holds the rotary tables (None: no positional encoding)."""
        batch, seq, _ = x.shape
        heads = (self.num_heads, self.num_kv_heads, self.num_kv_heads)
        projected = self.qkv_proj.split(self.qkv_proj(x))
        q, k, v = (t.view(batch, seq, h, self.head_dim) for t, h in zip(projected, heads))
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        kv_rows = None
        if cache is not None:  # K/V go to the cache first; attention reads the rows' slots
            kv_rows = slots
            if rope is not None:
                cache_k, cache_v = cache.layer(self.layer)  # [S, Hkv, max_len, D]
                q = ops.rotary_into_cache(
                    q, k, v, rope.cos, rope.sin, positions, cache_k, cache_v, slots
                )
                k, v = cache_k, cache_v
            else:
                k, v = cache.update(
                    self.layer, slots, positions, k.transpose(1, 2), v.transpose(1, 2)
                )
        else:
            if rope is not None:
                q, k = ops.rotary(q, k, rope.cos, rope.sin, positions)
            k, v = k.transpose(1, 2), v.transpose(1, 2)  # [B, Hkv, T, D]
        out = ops.attention(
            q.transpose(1, 2), k, v, positions, kv_rows, window=self.window, sinks=self.sinks
        )  # [B, H, T, D]
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq, -1))


class MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int, bias: bool = False):
        super().__init__()
        parts = {"gate_proj": intermediate, "up_proj": intermediate}
        self.gate_up_proj = Linear(hidden, parts, bias)
        self.down_proj = Linear(intermediate, hidden, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj.split(self.gate_up_proj(x))
        return self.down_proj(ops.silu_mul(gate, up))


class Qwen3MoE(SparseMoE):
    """Qwen3-MoE block: softmax router, top-k, renormalised weights, SwiGLU experts.

    With `moe_combine_order` the router is fp32 and ties go to the lower expert id
    (`moe.fixed_route`); without it the router runs in the activation dtype with `topk`.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        moe = cfg.moe
        self.top_k = moe.num_experts_per_tok
        self.norm_topk_prob = moe.norm_topk_prob
        self.gate = Linear(cfg.hidden_size, moe.num_experts, False, quantizable=False)
        self.experts = nn.ModuleList(
            MLP(cfg.hidden_size, moe.intermediate_size) for _ in range(moe.num_experts)
        )

    def choose_experts(self, x: torch.Tensor, fixed: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """x [N, H] -> (expert ids [N, k], fp32 weights [N, k])."""
        if fixed:
            return fixed_route(x, self.gate.weight, self.top_k, self.norm_topk_prob)
        top_w, top_i = router_probs(x, self.gate.weight, fixed=False).topk(self.top_k, dim=-1)
        return top_i, renormalized(top_w, fixed=False) if self.norm_topk_prob else top_w

    def grouped_experts(self, rows, offsets, top_i, by_expert) -> torch.Tensor:
        """rows [P, H] grouped per expert at `offsets` -> each row through its expert."""
        experts = self.experts
        fused = ops.grouped_linear(rows, [e.gate_up_proj.weight for e in experts], offsets)
        gate, up = experts[0].gate_up_proj.split(fused)
        return ops.grouped_linear(
            ops.silu_mul(gate, up), [e.down_proj.weight for e in experts], offsets
        )


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = self.make_mlp(cfg, layer)

    def make_mlp(self, cfg: ModelConfig, layer: int) -> nn.Module:
        """The layer's feed-forward part: Qwen3-MoE's experts where the config says, else MLP."""
        if cfg.layer_is_moe(layer):
            return Qwen3MoE(cfg)
        return MLP(cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias)

    def forward(self, x, delta, positions, rope, cache=None, slots=None, routes=None):
        """(residual stream x, the last sub-layer's output `delta` not yet added to it) -> the
        pair one layer on: each add runs fused with the norm after it. `routes`: the
        forward's route tape, for an MoE layer (`zkl.routes`)."""
        x, h = self.input_layernorm.add_forward(x, delta)
        delta = self.self_attn(h, positions, rope, cache, slots)
        x, h = self.post_attention_layernorm.add_forward(x, delta)
        if isinstance(self.mlp, SparseMoE):
            return x, self.mlp(h, routes=routes)
        return x, self.mlp(h)


class Transformer(CausalLM):
    """The decoder-only stack every attention family shares; a family with its own block
    (gpt-oss) names it in `block_class`."""

    block_class: type[nn.Module] = Block

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(self.block_class(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, False, quantizable=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.rope = RotaryEmbedding(cfg)

    def hidden_states(
        self, tokens, positions, cache=None, slots=None, logit_index=None, routes=None
    ):
        """The final norm's output [B, T, hidden] (or [B, hidden] at `logit_index`): what
        `lm_head` reads, so the train path can take the logits a chunk of tokens at a time."""
        if cache is None:  # the scheduler checks its requests before the gen path's forwards
            check_positions(self.cfg, tokens.shape[1], "of a scored sequence")
        x, delta = self.embed_tokens(tokens), None
        for block in self.layers:
            x, delta = self.run_layer(block, x, delta, positions, self.rope, cache, slots, routes)
        if logit_index is not None:
            picked = (torch.arange(x.shape[0], device=x.device), logit_index)
            x, delta = x[picked], None if delta is None else delta[picked]
        return self.norm.add_forward(x, delta)[1]


INIT_CHUNK = 1 << 24  # elements drawn at a time


def init_weights(model: Transformer, seed: int) -> None:
    """Seeded random init: uniform with std `init_std` for matrices, ones for norms, zero biases.

    Each value is a pure function of (seed, parameter index, element index) through
    `zkl.rng`, computed with exact float operations, so the weights are bitwise the same on
    the CPU and on a GPU, and are drawn on the parameter's own device. A fused projection's
    parts are drawn as separate projections would be (`fused.init_order`).
    """
    half_width = model.cfg.init_std * 3.0**0.5  # uniform(-a, a) has std a / sqrt(3)
    with torch.no_grad():
        for index, (name, p) in enumerate(init_order(model)):
            if name.endswith("norm.weight") or "layernorm" in name:
                p.fill_(1.0)
            elif name.endswith("bias"):
                p.zero_()
            else:
                flat = p.view(-1)
                param_key = rng.key(seed, index, device=p.device)
                for lo in range(0, flat.numel(), INIT_CHUNK):
                    count = min(INIT_CHUNK, flat.numel() - lo)
                    u = rng.uniform(param_key, count, offset=lo)
                    flat[lo : lo + count] = (u - 0.5) * (2 * half_width)
