"""Refuse keys the schema does not have, which Hydra's `+key=value` would add silently.

`+rl.stepz=2` passes Hydra (a `+` forces the key in) and `OmegaConf.to_object` then drops
it, so the run would ignore the setting. The composed config is compared with the schema
dataclasses before conversion, and the nearest valid key is suggested; an old name
(`zkl.renamed`) that reaches here (a YAML file of your own: overrides are renamed before
Hydra composes) is refused with a sentence naming the new one.
"""

from __future__ import annotations

import dataclasses
import difflib

from omegaconf import DictConfig, OmegaConf

from zkl.errors import ConfigError
from zkl.renamed import RENAMED


def schema_keys(schema: type, prefix: str = "") -> list[str]:
    """Every dotted key of a dataclass schema, nested dataclasses included."""
    keys = []
    for f in dataclasses.fields(schema):
        path = f"{prefix}{f.name}"
        keys.append(path)
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else None
        if dataclasses.is_dataclass(default):
            keys += schema_keys(type(default), f"{path}.")
    return keys


def unknown_keys(node: DictConfig, prefix: str = "") -> list[str]:
    """Dotted keys in `node` that its dataclass schema (and nested ones) does not declare."""
    schema = OmegaConf.get_type(node)
    if not dataclasses.is_dataclass(schema):
        return []
    fields = {f.name for f in dataclasses.fields(schema)}
    extra = []
    for key in node:
        child = node._get_node(key)
        if key not in fields:
            extra.append(f"{prefix}{key}")
        elif isinstance(child, DictConfig) and not child._is_none():
            extra += unknown_keys(child, f"{prefix}{key}.")
    return extra


def suggestion(key: str, schema: type) -> str:
    """A hint naming the valid key nearest to `key`: a sibling first, then any leaf key."""
    if key in RENAMED:
        return f"it is now {RENAMED[key]}."
    valid = schema_keys(schema)
    parent, _, leaf = key.rpartition(".")
    siblings = [k.rpartition(".")[2] for k in valid if k.rpartition(".")[0] == parent]
    near = difflib.get_close_matches(leaf, siblings, 1, 0.6)
    if near:
        return f"did you mean {parent + '.' if parent else ''}{near[0]}?"
    leaves = [k for k in valid if not any(v.startswith(k + ".") for v in valid)]
    near = difflib.get_close_matches(key, leaves, 1, 0.6)
    if near:
        return f"did you mean {near[0]}?"
    if parent:
        return f"the keys under {parent} are {', '.join(siblings)}."
    return "`python -m zkl --cfg job` lists the keys."


def reject_unknown_keys(cfg: DictConfig) -> None:
    """Raise ConfigError naming the first unknown key and the valid key nearest to it."""
    extra = unknown_keys(cfg)
    if not extra:
        return
    key = extra[0]
    others = f" (other unknown keys: {', '.join(extra[1:])})" if len(extra) > 1 else ""
    hint = suggestion(key, OmegaConf.get_type(cfg))
    raise ConfigError(f"{key} is not a config key{others}; {hint}")
