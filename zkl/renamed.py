"""Config keys that have a new name: each old dotted key, and the key it is now.

An old key keeps working wherever zkl reads keys before Hydra does: an override on the command
line or a key of a sweep's `hydra.sweeper.params` is read as the new key, with one line saying
so (`zkl.run.overrides.normalize`), and a config read back from a run directory (a resume's
checkpoint, `.hydra/config.yaml`, the report's runs) is read under the new names
(`read_back`). A YAML file of your own that still holds an old key is refused in one sentence
naming the new one (`zkl.run.keys`): Hydra merges files with the schema before zkl sees them.
"""

from __future__ import annotations

import copy
from typing import Any

_MOE = {
    "num_experts": "num_experts",
    "n_routed_experts": "num_experts",
    "num_experts_per_tok": "num_experts_per_tok",
    "moe_intermediate_size": "intermediate_size",
    "norm_topk_prob": "norm_topk_prob",
    "decoder_sparse_step": "decoder_sparse_step",
    "mlp_only_layers": "mlp_only_layers",
    "moe_shared_expert_intermediate_size": "shared_expert_intermediate_size",
    "routed_scaling_factor": "routed_scaling_factor",
    "n_group": "num_expert_groups",
    "topk_group": "topk_expert_groups",
    "swiglu_alpha": "swiglu_alpha",
    "swiglu_limit": "swiglu_limit",
}
_MAMBA = {
    "mamba_num_heads": "num_heads",
    "mamba_head_dim": "head_dim",
    "ssm_state_size": "state_size",
    "n_groups": "num_groups",
    "conv_kernel": "conv_kernel",
    "chunk_size": "chunk_size",
    "mamba_hidden_act": "hidden_act",
    "time_step_min": "time_step_min",
    "use_conv_bias": "conv_bias",
    "mamba_proj_bias": "proj_bias",
}
_ROPE = {
    "rope_theta": "theta",
    "rope_type": "type",
    "rope_factor": "factor",
    "rope_low_freq_factor": "low_freq_factor",
    "rope_high_freq_factor": "high_freq_factor",
    "rope_original_max_position_embeddings": "original_max_position_embeddings",
    "yarn_factor": "factor",
    "yarn_beta_fast": "beta_fast",
    "yarn_beta_slow": "beta_slow",
    "yarn_original_max_position_embeddings": "original_max_position_embeddings",
    "yarn_truncate": "truncate",
}

_SCHEDULER = ("max_batch_size", "prefill_chunk", "prefix_cache_blocks", "sync_every", "cuda_graphs")

RENAMED: dict[str, str] = {
    "engine.backend": "engine.name",
    **{f"engine.{k}": f"scheduler.{k}" for k in _SCHEDULER},
    "layout.backend": "layout.transport",
    "trainer.backend": "trainer.process_group",
    **{f"model.{old}": f"model.rope.{new}" for old, new in _ROPE.items()},
    **{f"model.{old}": f"model.moe.{new}" for old, new in _MOE.items()},
    **{f"model.{old}": f"model.mamba.{new}" for old, new in _MAMBA.items()},
}


def new_name(key: str) -> str | None:
    """The key `key` is now, or None when it is no old name."""
    return RENAMED.get(key)


def hint(old: str) -> str:
    """The one sentence an old key gets: what it is called now."""
    return f"{old} is now {RENAMED[old]}"


def read_back(tree: dict[str, Any]) -> dict[str, Any]:
    """A nested config saved under old names, with each old key moved to its new place. Two
    old keys that became one (`num_experts`, `n_routed_experts`): the one that is set (not 0)
    stands. The old `yarn_*` keys were gpt-oss's, the one family with attention sinks: its
    RoPE is YaRN (`rope.type=yarn`); any other model never read them."""
    out = copy.deepcopy(tree)
    model = out.get("model")
    if isinstance(model, dict) and "yarn_factor" in model:
        yarn = {k: model.pop(k) for k in list(model) if k.startswith("yarn_")}
        if model.get("attention_sinks"):
            model["rope_type"] = "yarn"
            for key in ("factor", "original_max_position_embeddings"):
                if f"yarn_{key}" in yarn:
                    model[f"rope_{key}"] = yarn.pop(f"yarn_{key}")
            model.update(yarn)  # beta_fast, beta_slow, truncate: renamed below
    moved: set[str] = set()
    for old, new in RENAMED.items():
        *parents, leaf = old.split(".")
        node = out
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict) or leaf not in node:
            continue
        value = node.pop(leaf)
        *new_parents, new_leaf = new.split(".")
        target = out
        for part in new_parents:
            target = target.setdefault(part, {})
        if new_leaf not in target or (new in moved and not target[new_leaf]):
            target[new_leaf] = value
            moved.add(new)
    return out
