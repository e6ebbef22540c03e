"""`--help` for the Hydra entry points, written from the config schema so it cannot drift.

Each group of `ZklConfig` is listed with its options (`conf/<group>/*.yaml`) and every key
with its default and the comment beside (or above) its field in the dataclass source.
"""

from __future__ import annotations

import dataclasses
import inspect
import re

from zkl.run.schema import CONF_DIR, ZklConfig

USAGE = {
    "zkl": "GRPO steps with every step's metrics logged (metrics.jsonl, W&B)",
    "zkl.cert": "certify the config bitwise (cert.* keys below; `--list-fixes` lists the fixes)",
    "zkl.bench": "generation and scoring tokens/s, zero mode vs default mode",
}
_FIELD = re.compile(r"^\s+(\w+):[^#]*?(?:#\s*(.*))?$")


def field_comments(cls: type) -> dict[str, str]:
    """Each field's comment in the class source: the one on its line, else those just above."""
    try:
        lines = inspect.getsource(cls).splitlines()
    except (OSError, TypeError):
        return {}
    comments, above = {}, []
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("#"):
            above.append(stripped.lstrip("# "))
            continue
        match = _FIELD.match(line)
        if match and not stripped.startswith(("def ", "@", "return")):
            comments[match.group(1)] = match.group(2) or " ".join(above)
        above = []
    return comments


def _value(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        if f.default is None:
            return "null"
        return repr(f.default) if f.default == "" else str(f.default)
    if f.default_factory is not dataclasses.MISSING:
        return repr(f.default_factory())
    return "???"


def _keys(cls: type, prefix: str) -> list[str]:
    comments = field_comments(cls)
    out = []
    for f in dataclasses.fields(cls):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else None
        if dataclasses.is_dataclass(default):
            out += _keys(type(default), f"{prefix}{f.name}.")
            continue
        note = comments.get(f.name) or f.metadata.get("help", "")  # generated: no source
        out.append(f"  {prefix}{f.name}={_value(f)}" + (f"  # {note}" if note else ""))
    return out


def help_text(prog: str) -> str:
    lines = [
        f"python -m {prog} [group=option ...] [key=value ...]: {USAGE.get(prog, '')}",
        "",
        "Groups (conf/<group>/<option>.yaml; `+group=option` works too):",
    ]
    groups, top = [], []
    for f in dataclasses.fields(ZklConfig):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else None
        if dataclasses.is_dataclass(default):
            folder = CONF_DIR / f.name
            options = sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []
            if options:
                lines.append(f"  {f.name}: {', '.join(options)}")
            doc = type(default).__doc__ or ""  # a dataclass without one gets its signature
            if doc.startswith(type(default).__name__ + "("):
                doc = ""
            head = f"{f.name}.*" + (f": {inspect.cleandoc(doc).splitlines()[0]}" if doc else "")
            groups += ["", head, *_keys(type(default), f"{f.name}.")]
        else:
            top.append(f)
    lines += ["", "Keys (key=value; `python -m zkl --cfg job` prints the composed config):"]
    comments = field_comments(ZklConfig)
    for f in top:
        note = comments.get(f.name, "")
        lines.append(f"  {f.name}={_value(f)}" + (f"  # {note}" if note else ""))
    lines += groups
    lines += [
        "",
        "Sweeps: python -m zkl -m --config-dir sweeps --config-name <sweep> (sweeps/*.yaml;",
        'an installed zkl: --config-dir "$(python -m zkl.sweeps)");',
        "hydra/launcher=slurm|slurm_gpu|local; Hydra's own flags: --hydra-help.",
    ]
    return "\n".join(lines)
