"""Command-line overrides checked before Hydra sees them, so its own errors become one sentence.

Hydra refuses a misspelt key (`rl.stepz=2`) or group option (`model=tiny_dens`) with its
own multi-line message; `preflight` refuses them first, naming the nearest valid key or
option. `normalize` lets every group of the primary defaults list be set with or without
`+` (`precision=mxfp8` and `+precision=mxfp8` alike): Hydra rejects `+group=option` for a
group that is already in the defaults list.
"""

from __future__ import annotations

import dataclasses
import difflib
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from zkl.errors import ConfigError
from zkl.run.keys import RENAMED, suggestion
from zkl.run.schema import CONF_DIR, ZklConfig


def default_groups(conf_dir: Path = CONF_DIR) -> set[str]:
    """The groups the primary config's defaults list names (model, precision, layout, ...)."""
    defaults = OmegaConf.load(conf_dir / "config.yaml").get("defaults", [])
    return {next(iter(d)) for d in defaults if isinstance(d, dict) or OmegaConf.is_dict(d)}


def _is_group_append(line: str, groups: set[str]) -> bool:
    key, eq, _ = line.partition("=")
    return eq == "=" and key.startswith("+") and not key.startswith("++") and key[1:] in groups


def normalize(overrides: list[str]) -> list[str]:
    """`+precision=x` -> `precision=x` for every group already in the defaults list."""
    groups = default_groups()
    return [o[1:] if _is_group_append(o, groups) else o for o in overrides]


def normalize_sweep_params(params: dict) -> dict:
    """The same for a sweep file's `hydra.sweeper.params` (`+precision: bf16,mxfp8`)."""
    groups = default_groups()
    return {(k[1:] if _is_group_append(f"{k}=", groups) else k): v for k, v in params.items()}


def group_options(group: str, config_dirs: list[Path]) -> list[str]:
    """The options of `group`: its YAML files in conf/ and in any --config-dir."""
    found = set()
    for base in config_dirs:
        folder = base / group
        if folder.is_dir():
            found |= {p.stem for p in folder.glob("*.yaml")}
    return sorted(found)


def _near(word: str, choices: list[str]) -> str:
    near = difflib.get_close_matches(word, choices, 1, 0.6)
    return f"did you mean {near[0]}? " if near else ""


def _schema_allows(key: str, schema: type) -> bool:
    """Whether `key` (dotted) exists in the schema, or lies inside a non-dataclass field."""
    node: type | None = schema
    for part in key.split("."):
        if node is None:
            return True  # inside a list or dict field (e.g. rl.betas.0)
        fields = {f.name: f for f in dataclasses.fields(node)}
        if part not in fields:
            return False
        f = fields[part]
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else None
        node = type(default) if dataclasses.is_dataclass(default) else None
    return True


def preflight(overrides: list[str], config_dir: str | None = None) -> None:
    """Raise ConfigError, one sentence, for an unknown key or group option on the command line."""
    dirs = [CONF_DIR] + ([Path(config_dir)] if config_dir else [])
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except Exception as err:  # Hydra's grammar error, first line only
        raise ConfigError(f"cannot parse the overrides: {str(err).splitlines()[0]}") from None
    for o in parsed:
        key = o.key_or_group
        if key.startswith("hydra") or o.is_delete() or o.package is not None:
            continue
        if key in RENAMED:  # with or without `+`: the old name would be ignored or refused
            raise ConfigError(f"{key} is not a config key; {suggestion(key, ZklConfig)}")
        options = group_options(key, dirs)
        if options:
            if isinstance(o.value(), dict):
                continue
            values = (
                list(o.sweep_string_iterator())
                if o.is_sweep_override()
                else [o.get_value_element_as_str()]
            )
            for value in values:
                if value not in options:
                    raise ConfigError(
                        f"{key}={value} is not an option of {key}; {_near(value, options)}"
                        f"the options are {', '.join(options)}."
                    )
        elif not (o.is_add() or o.is_force_add()) and not _schema_allows(key, ZklConfig):
            raise ConfigError(f"{key} is not a config key; {suggestion(key, ZklConfig)}")
