"""What the registry knows of one model family: the entry every family file fills in.

The interface of an entry (`Family`), kept stable so a family is added by writing its own
files and one line in `zkl.models.registry`:

- `name`: the `model.family` value, and the name used in messages.
- `model_class`: the `CausalLM` subclass built from a `ModelConfig` (`model_class(cfg)`).
- `model_types` / `architectures`: HF `config.json` `model_type` values and
  `architectures` names of its checkpoints (either identifies the family).
- `config_from_hf(hf, base) -> ModelConfig`: the model config of a parsed `config.json`;
  `base` already carries `name`, `family` and `checkpoint`. Raises ValueError (one sentence)
  on what the family does not implement.
- `config_to_hf(cfg) -> dict`: optional; the `config.json` keys of a model config (the
  inverse of `config_from_hf`), for writing zkl's weights as an HF checkpoint
  (`zkl.models.hf_export`). None: zkl does not write the family's checkpoints.
- `validate(cfg)`: the family's own rules, after the shared ones of `models.config`.
- `init_weights(model, seed)`: seeded random init when no checkpoint is given.
- `renames`: (HF prefix, zkl prefix) pairs applied to a tensor name after `model.` is removed.
- `convert(tensors, cfg) -> tensors`: optional; tensors a checkpoint stores in another form
  (quantized blocks, interleaved or fused parts) rewritten under HF's separate per-projection
  names, before names and shapes are checked. The fused parts themselves (q/k/v, gate/up)
  are read from the model (`zkl.models.fused`), not listed here.
- `cache`: the gen path's cache kind: "kv" (K/V per attention layer) or "hybrid" (K/V and
  Mamba state).
- `capabilities`: features the family may use: "moe", "mamba", "sinks", "sliding_window",
  "route_replay" (its MoE layers replay the generator's routes, `rl.routing_replay`).
- `sections`: the sections of `ModelConfig` it reads ("rope", "moe", "mamba"); a section it
  does not read must stay at its defaults (`zkl.models.config.check_sections`).
- `megatron`: whether `zkl.megatron` maps the family onto megatron-core.
- `modules`: the family's own source files under `zkl/` (with the registry, the only files
  that may name the family; tests/models/test_families.py greps for it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from zkl.models.config import SECTIONS, ModelConfig

CAPABILITIES = ("moe", "mamba", "sinks", "sliding_window", "route_replay")
CACHE_KINDS = ("kv", "hybrid")


@dataclass(frozen=True)
class Family:
    name: str
    model_class: type[nn.Module]
    model_types: tuple[str, ...]
    architectures: tuple[str, ...]
    config_from_hf: Callable[[dict, ModelConfig], ModelConfig]
    validate: Callable[[ModelConfig], None]
    init_weights: Callable[[nn.Module, int], None]
    modules: tuple[str, ...]
    renames: tuple[tuple[str, str], ...] = ()
    convert: Callable[[dict[str, torch.Tensor], ModelConfig], dict[str, torch.Tensor]] | None = None
    config_to_hf: Callable[[ModelConfig], dict] | None = None
    cache: str = "kv"
    capabilities: frozenset[str] = frozenset()
    sections: frozenset[str] = frozenset({"rope"})
    megatron: bool = False

    def __post_init__(self) -> None:
        assert self.cache in CACHE_KINDS, self.cache
        assert set(self.capabilities) <= set(CAPABILITIES), self.capabilities
        assert set(self.sections) <= set(SECTIONS), self.sections
