"""The typed config from Hydra: the schema registered and the overrides composed
(`zkl.run.register`), `model.checkpoint` read.

`zkl.cli.hydra_entry` registers the entry point's schema before `@hydra.main` runs;
`compose` does the same for tests and scripts.
"""

from __future__ import annotations

import os
from dataclasses import fields, is_dataclass, replace
from typing import Any

from omegaconf import DictConfig, OmegaConf

from zkl.errors import ConfigError
from zkl.run.keys import reject_unknown_keys
from zkl.run.model_from_checkpoint import hydra_overrides, resolve_checkpoint
from zkl.run.overrides import normalize
from zkl.run.register import compose_dict
from zkl.run.schema import CONF_DIR, ZklConfig


def to_object(cfg: DictConfig, overrides: list[str] | None = None) -> ZklConfig:
    """The typed config; a key the schema lacks (added with `+`) is refused, not dropped.

    `model.checkpoint` without a model group fills the model from its config.json
    (zkl/run/model_from_checkpoint.py); `overrides` default to the running Hydra job's.
    """
    reject_unknown_keys(cfg)
    if overrides is None:
        overrides = hydra_overrides()
    return resolve_checkpoint(OmegaConf.to_object(cfg), overrides, str(CONF_DIR))


def compose(overrides: list[str] | None = None, schema: type = ZklConfig) -> ZklConfig:
    """The config `python -m zkl <overrides>` would run with (for tests and scripts); with
    `zkl.cert.schema`'s or `zkl.lab.schema`'s, the one its entry point would run with."""
    normalized = normalize(list(overrides or []))
    return to_object(compose_dict(normalized, schema), normalized)


def load_group_option(cfg: ZklConfig, group: str, option: str) -> ZklConfig:
    """`cfg` with its `group` replaced by the schema defaults and `conf/<group>/<option>.yaml`."""
    path = os.path.join(CONF_DIR, group, f"{option}.yaml")
    if not os.path.exists(path):
        choices = sorted(p[:-5] for p in os.listdir(os.path.join(CONF_DIR, group)))
        raise ConfigError(
            f"{group}={option!r} is not an option of conf/{group}; pick one of {choices}."
        )
    base = OmegaConf.structured(cfg)
    base[group] = OmegaConf.merge(
        OmegaConf.structured(type(getattr(cfg, group))), OmegaConf.load(path)
    )
    return OmegaConf.to_object(base)


# The key that names a group's option (`model=tiny_moe` sets model.name; `kv=persist` kv.mode).
OPTION_KEY = {"model": "name", "precision": "name", "layout": "name", "kv": "mode"}


def with_group_option(cfg: ZklConfig, group: str, option: str) -> ZklConfig:
    """`cfg` with `conf/<group>/<option>.yaml` as its `group`, keeping the user's own edits.

    An edit is a key of the group whose value differs from the YAML of the user's option
    (e.g. `model.num_hidden_layers=4`); it holds for every option, as it would with
    `python -m zkl <group>=<option>` and the same overrides. How cert builds its beds.
    """
    user = getattr(cfg, group)
    try:
        stock = getattr(load_group_option(cfg, group, getattr(user, OPTION_KEY[group])), group)
    except ConfigError:  # a group built by hand on the command line: edits of the schema
        stock = type(user)()
    bed = load_group_option(cfg, group, option)
    edited = _with_edits(getattr(bed, group), user, stock, skip=OPTION_KEY[group])
    return replace(bed, **{group: edited})


def _with_edits(target: Any, user: Any, stock: Any, skip: str = "") -> Any:
    """`target` with every field where `user` differs from `stock`; a section (a nested
    dataclass, `model.moe`) field by field, so an edit carries only itself."""
    edits = {}
    for f in fields(user):
        mine, theirs = getattr(user, f.name), getattr(stock, f.name)
        if f.name == skip or mine == theirs:
            continue
        nested = is_dataclass(mine) and type(mine) is type(theirs)
        edits[f.name] = _with_edits(getattr(target, f.name), mine, theirs) if nested else mine
    return replace(target, **edits)
