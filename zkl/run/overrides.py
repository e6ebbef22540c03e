"""Command-line overrides checked before Hydra sees them, so its own errors become one sentence.

Hydra refuses a misspelt key (`rl.stepz=2`) or group option (`model=tiny_dens`), an override
its grammar cannot read (`rl.steps=$(id)`, a value with spaces or non-ASCII letters) and a
value of the wrong type (`rl.steps=abc`) with its own multi-line message, and runs a group
given twice (`model=a model=b`) with the last one; `preflight` refuses each first, in one
sentence naming the override and the nearest valid key, option or spelling.

`normalize` lets every group of the primary defaults list be set with or without `+`
(`precision=mxfp8` and `+precision=mxfp8` alike): Hydra rejects `+group=option` for a group
that is already in the defaults list. It also reads a key by its old name as the new one
(`zkl.renamed`); `renames` says so, one sentence per old key.
"""

from __future__ import annotations

import dataclasses
import difflib
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from omegaconf import OmegaConf, ValidationError

from zkl.errors import ConfigError
from zkl.renamed import hint, new_name
from zkl.run.keys import suggestion
from zkl.run.schema import CONF_DIR, ZklConfig


def default_groups(conf_dir: Path = CONF_DIR) -> set[str]:
    """The groups the primary config's defaults list names (model, precision, layout, ...)."""
    defaults = OmegaConf.load(conf_dir / "config.yaml").get("defaults", [])
    return {next(iter(d)) for d in defaults if isinstance(d, dict) or OmegaConf.is_dict(d)}


def _is_group_append(line: str, groups: set[str]) -> bool:
    key, eq, _ = line.partition("=")
    return eq == "=" and key.startswith("+") and not key.startswith("++") and key[1:] in groups


def _split(line: str) -> tuple[str, str, str]:
    """An override's prefix (`+`, `++`, `~` or none), key and the rest (`=value`, or none)."""
    prefix = line[: len(line) - len(line.lstrip("+~"))]
    key, eq, value = line[len(prefix) :].partition("=")
    return prefix, key, eq + value


def renamed(line: str) -> str:
    """An override with an old key (`zkl.renamed`) as the same override of the new key; a `+`
    that forced the old key in goes (the new key is in the schema)."""
    if line.startswith("-"):  # a command-line flag, not an override
        return line
    prefix, key, rest = _split(line)
    new = new_name(key)
    if new is None:
        return line
    return ("" if prefix == "+" else prefix) + new + rest


def renames(overrides: list[str]) -> list[str]:
    """One sentence for each override that names a key by its old name."""
    return [
        f"{hint(_split(line)[1])}: {line} runs as {renamed(line)}."
        for line in overrides
        if renamed(line) != line
    ]


def normalize(overrides: list[str]) -> list[str]:
    """Old keys as their new ones (`renamed`), then `+precision=x` -> `precision=x` for every
    group already in the defaults list."""
    groups = default_groups()
    new = [renamed(o) for o in overrides]
    return [o[1:] if _is_group_append(o, groups) else o for o in new]


def normalize_sweep_params(params: dict) -> tuple[dict, list[str]]:
    """The same for a sweep file's `hydra.sweeper.params` (`+precision: bf16,mxfp8`), and one
    sentence for each key it names by its old name."""
    keys = [line.removesuffix("=") for line in normalize([f"{k}=" for k in params])]
    said = [
        f"{hint(_split(k)[1])}: the sweep's {k} runs as {new}."
        for k, new in zip(params, keys, strict=True)
        if renamed(k) != k
    ]
    return dict(zip(keys, params.values(), strict=True)), said


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


def _quoted(line: str) -> str:
    """`key='value'`: the override as Hydra's grammar reads any value (spaces, $, non-ASCII)."""
    key, _, value = line.partition("=")
    if "'" not in value:
        return f"{key}='{value}'"
    if '"' not in value:
        return f'{key}="{value}"'
    return key + "='" + value.replace("'", "\\'") + "'"


def _shell(arg: str) -> str:
    """`arg` as one word of a POSIX shell command line, in double quotes."""
    return '"' + "".join("\\" + c if c in '$`"\\' else c for c in arg) + '"'


def parse(overrides: list[str]) -> list[Override]:
    """Hydra's parse of the overrides; one that its grammar cannot read is one sentence."""
    parser = OverridesParser.create()
    parsed = []
    for line in overrides:
        try:
            parsed += parser.parse_overrides([line])
        except Exception:  # Hydra's grammar error: lexer jargon over several lines
            quoted = _quoted(line)
            try:
                parser.parse_overrides([quoted])
            except Exception:
                raise ConfigError(
                    f"the override {line!r} is not key=value (a key is letters, digits, _ "
                    "and dots); `python -m zkl --help` lists the keys."
                ) from None
            raise ConfigError(
                f"the override {line!r} cannot be read: an unquoted value takes only ASCII "
                f"letters, digits and a few symbols, no spaces; quote the value, {quoted} "
                f"(on a shell command line {_shell(quoted)})."
            ) from None
    return parsed


_KINDS = {"Integer": "a whole number", "Float": "a number", "bool": "true or false"}


def _check_type(o: Override, base: Any) -> None:
    """The value converts to its key's type in the schema, as Hydra's merge will require."""
    value = o.value()
    if isinstance(value, str) and "${" in value:  # an interpolation: resolved later
        return
    try:
        OmegaConf.update(base, o.key_or_group, value, merge=True)
    except ValidationError as err:
        message = str(err).splitlines()[0]
        if "is not Optional" in message:
            raise ConfigError(f"{o.input_line}: {o.key_or_group} cannot be null.") from None
        kind = next((k for word, k in _KINDS.items() if word in message), "another type")
        if isinstance(value, list | dict):
            kind = f"a list of {kind.removeprefix('a ')}s"
        raise ConfigError(f"{o.input_line} must be {kind} ({o.key_or_group}).") from None
    except Exception:  # anything else Hydra's own merge says in its words
        return


def preflight(
    overrides: list[str], config_dir: str | None = None, schema: type = ZklConfig
) -> None:
    """Raise ConfigError, one sentence, for an override that Hydra would refuse or ignore.

    An unreadable override, an unknown key or group option (with the nearest valid one), a
    group given twice, a value of the wrong type; `schema` is the entry point's
    (`ZklConfig`, or an experiment's extension of it).
    """
    dirs = [CONF_DIR] + ([Path(config_dir)] if config_dir else [])
    parsed = parse(overrides)
    base = OmegaConf.structured(schema)
    groups_seen: dict[str, str] = {}
    for o in parsed:
        key = o.key_or_group
        if key.startswith("hydra") or o.is_delete() or o.package is not None:
            continue
        options = group_options(key, dirs)
        if options:
            if key in groups_seen:
                raise ConfigError(
                    f"the group {key} is given twice ({groups_seen[key]} and {o.input_line}), "
                    "and only the last would run; give it once (several options: "
                    f"-m {key}=a,b)."
                )
            groups_seen[key] = o.input_line
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
        elif not _schema_allows(key, schema):
            if not (o.is_add() or o.is_force_add()):
                raise ConfigError(f"{key} is not a config key; {suggestion(key, schema)}")
        elif not o.is_sweep_override():
            _check_type(o, base)
