"""The model families zkl runs, one entry each: the one place that says which family is which.

Every question of the form "which family" (which class to build, how to read its checkpoint,
which cache it fills, whether megatron maps it, how many parameters it has) is asked here.
An entry is a `zkl.models.family.Family` (its docstring is the interface); adding a family
means writing its own files (model, `*_family.py`) and adding its entry to `FAMILIES`.
"""

from __future__ import annotations

import contextlib
import functools
import json
from typing import Any

import torch

from zkl.models.config import (
    ModelConfig,
    check_sections,
    from_tree,
    leaves,
    validate_shapes,
    value_at,
)
from zkl.models.family import Family
from zkl.models.gpt_oss_family import GPT_OSS
from zkl.models.llama_family import LLAMA, MISTRAL
from zkl.models.nemotron_h_family import NEMOTRON_H
from zkl.models.qwen_family import QWEN2, QWEN3, QWEN3_MOE
from zkl.models.rope import validate_rope

FAMILIES: dict[str, Family] = {
    f.name: f for f in (QWEN2, QWEN3, QWEN3_MOE, NEMOTRON_H, LLAMA, MISTRAL, GPT_OSS)
}


def supported() -> str:
    return ", ".join(FAMILIES)


def family(cfg: Any) -> Family:
    """The entry of `cfg.family` (a ModelConfig or its Hydra node), or ValueError naming the
    supported families."""
    entry = FAMILIES.get(cfg.family)
    if entry is None:
        raise ValueError(f"model.family={cfg.family!r} is not one of {list(FAMILIES)}.")
    return entry


def family_of_hf(hf: dict) -> Family:
    """The family of a parsed HF `config.json`: by `model_type`, else by `architectures`."""
    model_type = hf.get("model_type")
    architectures = hf.get("architectures") or []
    for entry in FAMILIES.values():
        if model_type in entry.model_types:
            return entry
    for entry in FAMILIES.values():
        if model_type is None and set(architectures) & set(entry.architectures):
            return entry
    named = f"model_type={model_type!r}" + (
        f" ({', '.join(architectures)})" if architectures else ""
    )
    raise ValueError(f"config.json {named} is not supported; zkl reads the families {supported()}.")


def validate_model(cfg: ModelConfig) -> None:
    """Raise ValueError with one sentence naming the key to change."""
    entry = family(cfg)
    validate_shapes(cfg)
    check_sections(cfg, entry.sections)
    if cfg.hybrid_override_pattern and "mamba" not in entry.capabilities:
        raise ValueError(
            f"model.hybrid_override_pattern must be empty for model.family={cfg.family!r}."
        )
    if cfg.sliding_window and "sliding_window" not in entry.capabilities:
        raise ValueError(
            f"model.sliding_window must be 0 for model.family={cfg.family!r} (full attention)."
        )
    validate_rope(cfg)
    entry.validate(cfg)


# torch.nn.init functions the modules' own `reset_parameters` call: on the meta device they
# would set nothing, yet their first call imports torch's Python decompositions (seconds).
_INITS = ("normal_", "uniform_", "kaiming_uniform_", "kaiming_normal_", "zeros_", "ones_")


@contextlib.contextmanager
def _no_init():
    saved = {name: getattr(torch.nn.init, name) for name in _INITS}
    try:
        for name in _INITS:
            setattr(torch.nn.init, name, lambda tensor, *args, **kwargs: tensor)
        yield
    finally:
        for name, fn in saved.items():
            setattr(torch.nn.init, name, fn)


def build_on_meta(cfg: ModelConfig) -> torch.nn.Module:
    """The model of `cfg` with shapes and no storage: what counts and layouts are read from."""
    with torch.device("meta"), _no_init():
        return family(cfg).model_class(cfg)


def _key(cfg: Any) -> str:
    """`cfg` (a ModelConfig or its Hydra node) as a hashable nested dict, in JSON."""
    tree: dict[str, Any] = {}
    for key, _ in leaves():
        value = value_at(cfg, key)
        section, _, leaf = key.rpartition(".")
        node = tree.setdefault(section, {}) if section else tree
        node[leaf] = value if isinstance(value, str | int | float | bool | None) else list(value)
    return json.dumps(tree, sort_keys=True)


@functools.lru_cache(maxsize=16)
def _counts(key: str) -> tuple[int, int]:
    cfg = from_tree(json.loads(key))
    model = build_on_meta(cfg)
    total = sum(p.numel() for p in model.parameters())  # a tied lm_head counts once
    largest = max(sum(p.numel() for p in layer.parameters()) for layer in model.layers)
    return total, largest


def param_count(cfg: Any) -> int:
    """Parameters of the native model of `cfg` (as `model.parameters()` counts them), from the
    model itself built on the meta device."""
    return _counts(_key(cfg))[0]


def largest_layer_params(cfg: Any) -> int:
    """Parameters of the largest decoder layer (what FSDP all-gathers at a time)."""
    return _counts(_key(cfg))[1]
