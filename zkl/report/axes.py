"""What tells the runs of a comparison apart: the sweep's axes, their values, short labels.

An axis is a config key whose value differs between runs that have a config; a run with
none (it never got going) shows blanks and never makes every key look like an axis. A key
that another axis already says is left out: a group's keys that follow from its `name`
(`model.hidden_size` from `model.name`), and a key equal in every run to an earlier axis
(`task.tokenizer` defaulted to `model.checkpoint`). The fixes are one axis, `fixes`
('all_fixes', 'no_fixes', 'minus_batch_invariant_gemm', ...). A new axis (a treatment, say) is one
more config key: nothing here lists the keys of a sweep.
"""

from __future__ import annotations

import json
from typing import Any

from zkl.report.runs import Run

NOT_AXES = ("tracking.", "checkpoint.", "resume", "cert.", "fixes.", "zero_train_gen_mismatch")

# The settings a reader knows runs by, in the order axes are listed; the rest follow sorted.
CONTEXT_KEYS = (
    "model.name",
    "precision.name",
    "layout.name",
    "kv.mode",
    "engine.name",
    "device",
    "task.name",
    "rl.steps",
    "seed",
    "zero_train_gen_mismatch",
)


def axis_value(run: Run, axis: str) -> str:
    if axis == "fixes":
        return run.fixes if run.config else ""
    value = run.flat.get(axis)
    return "" if value is None else str(value)


def _priority(key: str) -> tuple[int, str]:
    return (CONTEXT_KEYS.index(key), key) if key in CONTEXT_KEYS else (len(CONTEXT_KEYS), key)


def sweep_axes(runs: list[Run]) -> list[str]:
    """The config keys that vary across the runs that have a config, the named ones first."""
    flats = [r.flat for r in runs if r.config]
    keys = sorted({k for f in flats for k in f}, key=_priority)
    varying = [
        k
        for k in keys
        if not k.startswith(NOT_AXES) and len({json.dumps(f.get(k)) for f in flats}) > 1
    ]
    out: list[str] = []
    for key in varying:
        named = f"{key.split('.')[0]}.name"  # the group's name: `model.moe.x` follows `model.name`
        if key != named and named in varying and _follows(flats, named, key):
            continue
        if any(all(f.get(key) == f.get(kept) for f in flats) for kept in out):
            continue
        out.append(key)
    if len({r.fixes for r in runs if r.config}) > 1:
        out.append("fixes")
    return out


def _follows(flats: list[dict[str, Any]], name_key: str, key: str) -> bool:
    """Every run with the same `name_key` value has the same `key` value."""
    by_name: dict[Any, set[str]] = {}
    for f in flats:
        by_name.setdefault(f.get(name_key), set()).add(json.dumps(f.get(key)))
    return all(len(v) == 1 for v in by_name.values())


def common_settings(runs: list[Run]) -> dict[str, str]:
    """The context keys (and the fixes) that every run with a config shares."""
    known = [r for r in runs if r.config]
    if not known:
        return {}
    out = {}
    for key in (*CONTEXT_KEYS, "fixes"):
        values = {axis_value(r, key) for r in known}
        if len(values) == 1 and values != {""}:
            out[key] = values.pop()
    return out


def short(axis: str) -> str:
    """`model.name` -> `model`, `sampling.max_new_tokens` -> `max_new_tokens`."""
    group, _, leaf = axis.rpartition(".")
    return group.rpartition(".")[2] if leaf in ("name", "mode") and group else leaf


def headings(axes: list[str]) -> list[str]:
    """Column titles of the axes: the short name where no other axis shares it."""
    names = [short(a) for a in axes]
    return [n if names.count(n) == 1 else a for a, n in zip(axes, names)]


def label(run: Run, axes: list[str]) -> str:
    """The run by its values on the axes only: `tiny_moe mxfp8 kv=persist seed=1 no_fixes`.

    A `name` axis and the fixes show their value alone; other axes say `key=value`.
    """
    parts = []
    for axis in axes:
        value = axis_value(run, axis)
        if not value:
            continue
        bare = axis == "fixes" or axis.endswith(".name")
        parts.append(value if bare else f"{short(axis)}={value}")
    return " ".join(parts)


def labels(runs: list[Run], axes: list[str]) -> dict[str, str]:
    """{run name: label}; a run with no axis values, or one sharing its label, adds its name."""
    out = {r.name: label(r, axes) for r in runs}
    counts: dict[str, int] = {}
    for text in out.values():
        counts[text] = counts.get(text, 0) + 1
    for r in runs:
        text = out[r.name]
        if not text or counts[text] > 1:
            out[r.name] = f"{text} ({r.name})" if text else r.name
    return out
