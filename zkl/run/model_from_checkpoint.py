"""`model.checkpoint=DIR` without a model group: the architecture comes from its config.json.

The defaults list always holds a model group (tiny_dense), so "no model group" means the
user named none (`model=...` absent from the overrides). Then every architecture key is
read from the checkpoint; a `model.*` key the user set (an override, or an edit of the
group's YAML in a sweep file) must agree with config.json, or the run is refused with one
sentence naming it. A named group is kept and checked against config.json as before
(zkl/models/hf_weights_check.py), so `model=qwen2_5_1_5b model.checkpoint=DIR` still means "this
checkpoint must be that architecture". A dataset task without `task.tokenizer` reads the
checkpoint's tokenizer.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from zkl.data.config import tokenizer_source
from zkl.errors import ConfigError
from zkl.models.config import ModelConfig, leaves, value_at
from zkl.models.hf_weights_check import hf_model_config
from zkl.run.model_overrides import model_keys, names_model_group


def hydra_overrides() -> list[str] | None:
    """The task overrides of the running Hydra job (a multirun job's own), or None."""
    if not HydraConfig.initialized():
        return None
    return list(HydraConfig.get().overrides.task)


def _stock(name: str, conf_dir: str) -> ModelConfig | None:
    path = Path(conf_dir) / "model" / f"{name}.yaml"
    if not path.is_file():
        return None
    merged = OmegaConf.merge(OmegaConf.structured(ModelConfig), OmegaConf.load(path))
    return OmegaConf.to_object(merged)


def explicit_model_keys(model: ModelConfig, overrides: list[str], conf_dir: str) -> set[str]:
    """`model.*` keys the user set: named in an override or differing from the group's YAML."""
    keys = model_keys(overrides)
    stock = _stock(model.name, conf_dir)
    if stock is not None:
        keys |= {k for k, _ in leaves() if value_at(model, k) != value_at(stock, k)}
    return keys - {"checkpoint"}


# Keys a user may set apart from config.json: not architecture (the name, where the weights
# come from, the init scale no checkpoint uses); positions only lower than the checkpoint's.
FREE_KEYS = ("name", "checkpoint", "init_std")


def model_from_checkpoint(model: ModelConfig, explicit: set[str]) -> ModelConfig:
    """`model` with every architecture key read from `model.checkpoint`'s config.json.

    Each key in `explicit` must agree with config.json (max_position_embeddings may be set
    lower: a shorter context), or ConfigError names it.
    """
    key = f"model.checkpoint={model.checkpoint}"
    theirs = hf_model_config(model)
    for name in sorted(explicit - set(FREE_KEYS)):
        mine, ckpt = value_at(model, name), value_at(theirs, name)
        if name == "max_position_embeddings" and mine <= ckpt:
            continue
        if mine != ckpt:
            raise ConfigError(
                f"{key} has {name}={ckpt!r} in its config.json but model.{name}={mine!r}; "
                f"drop the model.{name} override (the checkpoint fixes it)."
            )
    kept = {k: getattr(model, k) for k in ("init_std", "max_position_embeddings") if k in explicit}
    name = model.name if "name" in explicit else Path(model.checkpoint).resolve().name
    return dataclasses.replace(theirs, name=name, **kept)


def resolve_checkpoint(cfg, overrides: list[str] | None, conf_dir: str):
    """`cfg` with its model read from `model.checkpoint` when no model group was named, and
    `task.tokenizer` defaulting to the checkpoint for a dataset task."""
    overrides = overrides or []
    if cfg.model.checkpoint and not names_model_group(overrides):
        explicit = explicit_model_keys(cfg.model, overrides, conf_dir)
        cfg.model = model_from_checkpoint(cfg.model, explicit)
    if cfg.task.name == "dataset":
        cfg.task.tokenizer = tokenizer_source(cfg.task, cfg.model.checkpoint)[0]
    return cfg
