"""zkl's model config and weights in megatron-core's terms, as plain data (no megatron import).

Two things, both pure so CPU CI tests them without megatron-core (which needs Python 3.12):
- `transformer_config_kwargs` / `gpt_model_kwargs`: the keyword arguments of megatron's
  `TransformerConfig` and `GPTModel` for a zkl `ModelConfig` (strings stand for the two
  values that are not plain data: the activation function and the parameter dtype).
- `to_megatron` / `from_megatron`: zkl's native state dict <-> GPTModel's. Both fuse q/k/v
  and gate/up; zkl's `qkv_proj` holds every query head, then every key head, then every
  value head, megatron's `linear_qkv` goes per query group (the group's query heads, then
  its key, then its value), so the rows are regrouped. zkl's `gate_up_proj` is megatron's
  `linear_fc1` as it is (gate rows, then up rows). In the TE specs the two pre-norms live
  inside the following linear as `layer_norm_weight`.
"""

from __future__ import annotations

import torch

from zkl.engines import NATIVE, engine_named
from zkl.models.config import ModelConfig
from zkl.models.registry import family


def transformer_config_kwargs(model: ModelConfig, compute_dtype: str) -> dict:
    """`TransformerConfig(**kwargs)` for `model` (TP = PP = EP = 1; no dropout, no fusions).

    `activation_func` is "silu" and `params_dtype` a dtype's name; `zkl.megatron.model`
    resolves them.
    Fusions that need Apex or custom CUDA extensions are off, so the default path is
    megatron's plain PyTorch code.
    """
    if not family(model).megatron:
        raise ValueError(
            f"model.family={model.family!r} has no megatron mapping yet; use engine={NATIVE.name}."
        )
    bf16 = compute_dtype == "bfloat16"
    kwargs = {
        "num_layers": model.num_hidden_layers,
        "hidden_size": model.hidden_size,
        "num_attention_heads": model.num_attention_heads,
        "num_query_groups": model.num_key_value_heads,
        "kv_channels": model.head_dim,
        "ffn_hidden_size": model.intermediate_size,
        "normalization": "RMSNorm",
        "layernorm_epsilon": model.rms_norm_eps,
        "gated_linear_unit": True,
        "activation_func": "silu",
        # The MLP takes its activation from the spec's slot (zkl's SwiGLU), not from
        # `activation_func`; the flag's name is megatron's, no Transformer Engine is asked for.
        "use_te_activation_func": True,
        "add_bias_linear": False,
        "add_qkv_bias": model.qkv_bias,
        "qk_layernorm": model.qk_norm,
        "hidden_dropout": 0.0,
        "attention_dropout": 0.0,
        "attention_softmax_in_fp32": True,
        "bf16": bf16,
        # Created in fp32; zkl's precision recipe then casts (norms and router stay fp32).
        "params_dtype": "float32",
        "init_method_std": model.init_std,
        "use_cpu_initialization": True,
        "gradient_accumulation_fusion": False,
        "bias_activation_fusion": False,
        "bias_dropout_fusion": False,
        "masked_softmax_fusion": False,
        "apply_rope_fusion": False,
        "persist_layer_norm": False,
        "tensor_model_parallel_size": 1,
        "pipeline_model_parallel_size": 1,
    }
    if model.is_moe:
        kwargs.update(
            {
                "num_moe_experts": model.moe.num_experts,
                "moe_router_topk": model.moe.num_experts_per_tok,
                "moe_ffn_hidden_size": model.moe.intermediate_size,
                # Qwen3-MoE: softmax over all experts, top-k, renormalise (norm_topk_prob);
                # megatron's top-k then softmax is the same function, pre-softmax is the
                # un-normalised one.
                "moe_router_pre_softmax": not model.moe.norm_topk_prob,
                "moe_router_score_function": "softmax",
                "moe_router_load_balancing_type": "none",
                "moe_aux_loss_coeff": 0.0,
                "moe_token_dispatcher_type": "allgather",
                "moe_grouped_gemm": False,
                "moe_layer_freq": [
                    int(model.layer_is_moe(i)) for i in range(model.num_hidden_layers)
                ],
            }
        )
    return kwargs


def gpt_model_kwargs(model: ModelConfig) -> dict:
    """`GPTModel(config=..., transformer_layer_spec=..., **kwargs)` for `model`.

    No megatron position embedding: zkl's rotary runs inside the core-attention slot, at each
    token's absolute position, so decode rows at different positions share one batch.
    """
    return {
        "vocab_size": model.vocab_size,
        "max_sequence_length": model.max_position_embeddings,
        "pre_process": True,
        "post_process": True,
        "parallel_output": False,
        "share_embeddings_and_output_weights": model.tie_word_embeddings,
        "position_embedding_type": "none",
    }


def group_qkv(model: ModelConfig, qkv: torch.Tensor) -> torch.Tensor:
    """zkl's qkv_proj rows [q heads; k heads; v heads] -> megatron's linear_qkv rows, grouped
    per KV head (the group's query heads, then its key head, then its value head)."""
    groups, d = model.num_key_value_heads, model.head_dim
    per = model.num_attention_heads // groups
    rest = qkv.shape[1:]
    q, k, v = torch.split(qkv, [groups * per * d, groups * d, groups * d])
    q = q.reshape(groups, per * d, *rest)
    k = k.reshape(groups, d, *rest)
    v = v.reshape(groups, d, *rest)
    return torch.cat([q, k, v], dim=1).reshape(-1, *rest)


def ungroup_qkv(model: ModelConfig, qkv: torch.Tensor) -> torch.Tensor:
    """The inverse of `group_qkv`."""
    groups, d = model.num_key_value_heads, model.head_dim
    per = model.num_attention_heads // groups
    rest = qkv.shape[1:]
    q, k, v = torch.split(qkv.reshape(groups, (per + 2) * d, *rest), [per * d, d, d], dim=1)
    return torch.cat([t.reshape(-1, *rest) for t in (q, k, v)])


def _layer_names(model: ModelConfig, engine: str, i: int) -> dict[str, str]:
    """zkl's per-layer names -> megatron's, for the non-fused parameters of layer i."""
    fused = engine_named(engine).fused_norm  # the pre-norms live in the next linear (TE)
    a, m = f"decoder.layers.{i}.self_attention.", f"decoder.layers.{i}."
    names = {
        "self_attn.o_proj.weight": a + "linear_proj.weight",
        "self_attn.q_norm.weight": a + "q_layernorm.weight",
        "self_attn.k_norm.weight": a + "k_layernorm.weight",
        "input_layernorm.weight": (
            a + "linear_qkv.layer_norm_weight" if fused else m + "input_layernorm.weight"
        ),
    }
    moe = model.layer_is_moe(i)
    if moe or not fused:
        names["post_attention_layernorm.weight"] = m + "pre_mlp_layernorm.weight"
    else:
        names["post_attention_layernorm.weight"] = m + "mlp.linear_fc1.layer_norm_weight"
    if moe:
        names["mlp.gate.weight"] = m + "mlp.router.weight"
    else:
        names["mlp.down_proj.weight"] = m + "mlp.linear_fc2.weight"
    return names


def _mlp_names(model: ModelConfig, i: int) -> dict[str, str]:
    """zkl's full names -> megatron's for layer i's fused MLP weights (the experts' or the
    dense MLP's): every checkpoint has them, unlike some of `_layer_names`."""
    p, m = f"layers.{i}.", f"decoder.layers.{i}."
    if not model.layer_is_moe(i):
        return {p + "mlp.gate_up_proj.weight": m + "mlp.linear_fc1.weight"}
    names = {}
    for e in range(model.moe.num_experts):
        x, y = f"{p}mlp.experts.{e}.", f"{m}mlp.experts.local_experts.{e}."
        names[x + "gate_up_proj.weight"] = y + "linear_fc1.weight"
        names[x + "down_proj.weight"] = y + "linear_fc2.weight"
    return names


def to_megatron(
    state: dict[str, torch.Tensor], model: ModelConfig, engine: str
) -> dict[str, torch.Tensor]:
    """zkl's native state dict -> GPTModel's (tied lm_head dropped: it is the embedding)."""
    out = {"embedding.word_embeddings.weight": state["embed_tokens.weight"]}
    out["decoder.final_layernorm.weight"] = state["norm.weight"]
    if not model.tie_word_embeddings:
        out["output_layer.weight"] = state["lm_head.weight"]
    for i in range(model.num_hidden_layers):
        p, m = f"layers.{i}.", f"decoder.layers.{i}."
        for ours, theirs in _layer_names(model, engine, i).items():
            if p + ours in state:
                out[theirs] = state[p + ours]
        for kind in ("weight", "bias"):
            if f"{p}self_attn.qkv_proj.{kind}" in state:
                qkv = state[f"{p}self_attn.qkv_proj.{kind}"]
                out[f"{m}self_attention.linear_qkv.{kind}"] = group_qkv(model, qkv)
        for ours, theirs in _mlp_names(model, i).items():
            out[theirs] = state[ours]
    return out


def from_megatron(
    state: dict[str, torch.Tensor], model: ModelConfig, engine: str
) -> dict[str, torch.Tensor]:
    """GPTModel's state dict -> zkl's native names (the inverse of `to_megatron`)."""
    out = {"embed_tokens.weight": state["embedding.word_embeddings.weight"]}
    out["norm.weight"] = state["decoder.final_layernorm.weight"]
    out["lm_head.weight"] = (
        out["embed_tokens.weight"] if model.tie_word_embeddings else state["output_layer.weight"]
    )
    for i in range(model.num_hidden_layers):
        p, m = f"layers.{i}.", f"decoder.layers.{i}."
        for ours, theirs in _layer_names(model, engine, i).items():
            if theirs in state:
                out[p + ours] = state[theirs]
        for kind in ("weight", "bias"):
            key = f"{m}self_attention.linear_qkv.{kind}"
            if key in state:
                out[f"{p}self_attn.qkv_proj.{kind}"] = ungroup_qkv(model, state[key])
        for ours, theirs in _mlp_names(model, i).items():
            out[ours] = state[theirs]
    return out
