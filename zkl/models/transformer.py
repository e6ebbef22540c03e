"""Qwen2 / Qwen3 / Qwen3-MoE decoder: one definition for the train path and the gen path.

The forward takes absolute positions and, on the gen path, a KV cache with the cache slots
of the rows; it writes K/V to the cache *before* attention, so prefill and decode read keys
the same way the train path does.
"""

from __future__ import annotations

import torch
from torch import nn

from zkl import ops, rng
from zkl.generation.kv_cache import KVCache
from zkl.invariance import is_enabled
from zkl.models.config import ModelConfig
from zkl.models.stacking import stacked_linear
from zkl.precision import linear_weight_and_input


class Linear(nn.Module):
    """y = x W^T + b through `zkl.ops.linear`; the precision recipe may quantize W and x."""

    def __init__(self, in_features: int, out_features: int, bias: bool, quantizable: bool = True):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None
        self.quantizable = quantizable  # embedding, lm_head, router are never quantized

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight, x = linear_weight_and_input(self, x)
        return ops.linear(x, weight, self.bias)


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

    def __init__(self, head_dim: int, max_positions: int, theta: float):
        super().__init__()
        # Built on the CPU whatever the model's device, so every device gets the same tables.
        steps = torch.arange(0, head_dim, 2, dtype=torch.float64, device="cpu")
        inv_freq = 1.0 / (theta ** (steps / head_dim))
        positions = torch.arange(max_positions, dtype=torch.float64, device="cpu")
        angles = torch.outer(positions, inv_freq)
        angles = torch.cat([angles, angles], dim=-1)
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

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
        self.q_proj = Linear(cfg.hidden_size, self.num_heads * self.head_dim, cfg.qkv_bias)
        self.k_proj = Linear(cfg.hidden_size, self.num_kv_heads * self.head_dim, cfg.qkv_bias)
        self.v_proj = Linear(cfg.hidden_size, self.num_kv_heads * self.head_dim, cfg.qkv_bias)
        self.o_proj = Linear(self.num_heads * self.head_dim, cfg.hidden_size, False)
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None

    def forward(self, x, positions, rope, cache=None, slots=None) -> torch.Tensor:
        """x [B, T, hidden]; `rope` holds the rotary tables (None: no positional encoding)."""
        batch, seq, _ = x.shape
        heads = (self.num_heads, self.num_kv_heads, self.num_kv_heads)
        projected = stacked_linear(x, (self.q_proj, self.k_proj, self.v_proj))
        if projected is None:
            projected = (self.q_proj(x), self.k_proj(x), self.v_proj(x))
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
        out = ops.attention(q.transpose(1, 2), k, v, positions, kv_rows)  # [B, H, T, D]
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq, -1))


class MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = Linear(hidden, intermediate, False)
        self.up_proj = Linear(hidden, intermediate, False)
        self.down_proj = Linear(intermediate, hidden, False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        projected = stacked_linear(x, (self.gate_proj, self.up_proj))
        gate, up = projected if projected is not None else (self.gate_proj(x), self.up_proj(x))
        return self.down_proj(ops.silu_mul(gate, up))


class SparseMoE(nn.Module):
    """Qwen3-MoE block: softmax router, top-k, renormalised weights, SwiGLU experts.

    Tokens are grouped per expert (one stable sort of the (token, slot) pairs, one host
    sync for the group sizes), each expert runs once on its rows, and the results land in
    the pairs' own places. With `moe_combine_order` the router is fp32, ties go to the lower
    expert id, and each token adds its experts' outputs in fp32 in top-k slot order; without
    it, outputs are scattered back with `index_add` in dispatch order (atomics on a GPU).
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.top_k = cfg.num_experts_per_tok
        self.norm_topk_prob = cfg.norm_topk_prob
        self.gate = Linear(cfg.hidden_size, cfg.num_experts, False, quantizable=False)
        self.experts = nn.ModuleList(
            MLP(cfg.hidden_size, cfg.moe_intermediate_size) for _ in range(cfg.num_experts)
        )

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [N, H] -> (expert ids [N, k], fp32 weights [N, k])."""
        if is_enabled("moe_combine_order"):
            return fixed_route(x, self.gate.weight, self.top_k, self.norm_topk_prob)
        gate = self.gate.weight.to(x.dtype)
        probs = torch.softmax(ops.linear(x, gate, None).float(), dim=-1)
        top_w, top_i = probs.topk(self.top_k, dim=-1)
        if self.norm_topk_prob:
            top_w = top_w / top_w.sum(-1, keepdim=True)
        return top_i, top_w

    def forward(self, x: torch.Tensor, expert_order: list[int] | None = None) -> torch.Tensor:
        """`expert_order` (tests only) visits experts in another order, as GPU dispatch may."""
        shape = x.shape
        x = x.reshape(-1, shape[-1])  # [N, H]
        top_i, top_w = self.route(x)
        fixed = is_enabled("moe_combine_order")
        out = run_experts(x, top_i, top_w, list(self.experts), fixed, expert_order)
        return out.reshape(shape)


def fixed_route(
    x: torch.Tensor, gate_weight: torch.Tensor, top_k: int, norm_topk_prob: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """The `moe_combine_order` router: fp32 logits and softmax, ties to the lower expert id.

    x [N, H] -> (expert ids [N, k], fp32 weights [N, k]); shared by every engine's MoE.
    """
    probs = ops.softmax(ops.linear(x.float(), gate_weight.float(), None))
    # stable sort: equal probabilities resolve to the lower expert id
    top_w, top_i = probs.sort(dim=-1, descending=True, stable=True)
    top_w, top_i = top_w[:, :top_k], top_i[:, :top_k]
    if norm_topk_prob:
        total = top_w[:, 0]
        for s in range(1, top_k):  # fixed order, whatever the row count
            total = total + top_w[:, s]
        top_w = top_w / total.unsqueeze(-1)
    return top_i, top_w


def run_experts(
    x: torch.Tensor,
    top_i: torch.Tensor,
    top_w: torch.Tensor,
    experts: list,
    fixed: bool,
    expert_order: list[int] | None = None,
) -> torch.Tensor:
    """x [N, H] through its top-k experts (`experts[e](rows)` -> [n, H]), weighted and added.

    Tokens are grouped per expert (one stable sort, one host sync for the group sizes).
    `fixed`: each pair's result lands in its own fp32 row and a token adds its experts in
    top-k slot order; else `index_add` in dispatch order, in the activation dtype.
    """
    top_k = top_i.shape[-1]
    pairs = top_i.reshape(-1)  # pair p = (token p // k, slot p % k)
    by_expert = torch.sort(pairs, stable=True).indices  # pairs grouped by expert id
    counts = torch.bincount(pairs, minlength=len(experts)).tolist()
    starts = [0]
    for c in counts:
        starts.append(starts[-1] + c)
    order = expert_order if expert_order is not None else range(len(experts))
    if fixed:
        results = x.new_zeros(pairs.numel(), x.shape[-1], dtype=torch.float32)
    else:
        out = torch.zeros_like(x)
        flat_w = top_w.reshape(-1)
    for e in order:
        if not counts[e]:
            continue
        chosen = by_expert[starts[e] : starts[e + 1]]  # [c] pair ids
        rows = chosen // top_k
        y = experts[e](x[rows])
        if fixed:
            results[chosen] = y.float()
        else:
            out.index_add_(0, rows, y * flat_w[chosen].unsqueeze(-1).to(x.dtype))
    if fixed:
        weighted = results.view(-1, top_k, x.shape[-1]) * top_w.unsqueeze(-1)
        out = weighted[:, 0]
        for s in range(1, top_k):  # fixed order: top-k slot 0, 1, ...
            out = out + weighted[:, s]
        out = out.to(x.dtype)
    return out


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = (
            SparseMoE(cfg)
            if cfg.layer_is_moe(layer)
            else MLP(cfg.hidden_size, cfg.intermediate_size)
        )

    def forward(self, x, delta, positions, rope, cache=None, slots=None):
        """(residual stream x, the last sub-layer's output `delta` not yet added to it) -> the
        pair one layer on: each add runs fused with the norm after it."""
        x, h = self.input_layernorm.add_forward(x, delta)
        delta = self.self_attn(h, positions, rope, cache, slots)
        x, h = self.post_attention_layernorm.add_forward(x, delta)
        return x, self.mlp(h)


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, False, quantizable=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.rope = RotaryEmbedding(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta)

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        cache=None,
        slots: torch.Tensor | None = None,
        logit_index: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """tokens, positions [B, T] -> logits [B, T, V] (or [B, V] at `logit_index` [B]).

        With `cache` (gen path), K/V of these tokens go to the cache rows `slots` [B] and
        attention reads every cached key of the row; without it (train path), the row's
        own tokens are its keys and positions must be 0..T-1.
        """
        return self.lm_head(self.hidden_states(tokens, positions, cache, slots, logit_index))

    def hidden_states(self, tokens, positions, cache=None, slots=None, logit_index=None):
        """The final norm's output [B, T, hidden] (or [B, hidden] at `logit_index`): what
        `lm_head` reads, so the train path can take the logits a chunk of tokens at a time."""
        if cache is None and tokens.shape[1] > self.rope.cos.shape[0]:
            raise ValueError(
                f"a sequence of {tokens.shape[1]} tokens is longer than "
                f"model.max_position_embeddings={self.rope.cos.shape[0]}; raise it."
            )
        x, delta = self.embed_tokens(tokens), None
        for block in self.layers:
            x, delta = block(x, delta, positions, self.rope, cache, slots)
        if logit_index is not None:
            picked = (torch.arange(x.shape[0], device=x.device), logit_index)
            x, delta = x[picked], None if delta is None else delta[picked]
        return self.norm.add_forward(x, delta)[1]

    def make_cache(self, num_slots: int, max_len: int) -> KVCache:
        """The gen path's cache of `num_slots` rows of `max_len` positions: K/V of every
        layer, in the model's dtype, on its device."""
        cfg, weight = self.cfg, self.embed_tokens.weight
        return KVCache(
            cfg.num_hidden_layers,
            num_slots,
            cfg.num_key_value_heads,
            max_len,
            cfg.head_dim,
            weight.dtype,
            weight.device,
        )


INIT_CHUNK = 1 << 24  # elements drawn at a time


def init_weights(model: Transformer, seed: int) -> None:
    """Seeded random init: uniform with std `init_std` for matrices, ones for norms, zero biases.

    Each value is a pure function of (seed, parameter index, element index) through
    `zkl.rng`, computed with exact float operations, so the weights are bitwise the same on
    the CPU and on a GPU, and are drawn on the parameter's own device.
    """
    half_width = model.cfg.init_std * 3.0**0.5  # uniform(-a, a) has std a / sqrt(3)
    with torch.no_grad():
        for index, (name, p) in enumerate(model.named_parameters()):
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
