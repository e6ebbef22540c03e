"""Find the runs under sweep or run directories and read what they logged.

A run directory holds `metrics.jsonl` (the source of truth), `config.yaml` and, when a
ConfigError or another exception stopped it, `error.txt`. A Hydra job directory that holds
none of them is a run that never got going (shown, never skipped). `bench.json` and
`cert.jsonl` are the results of `python -m zkl.bench` and `python -m zkl.cert`.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from zkl import invariance
from zkl.tracking.errors import ERROR_FILE, read_error
from zkl.tracking.run_log import CONFIG_FILE, METRICS_FILE, axes

SKIP_DIRS = {".submitit", ".hydra", "wandb", "__pycache__"}
NOT_AXES = ("tracking.", "checkpoint.", "resume", "cert.", "fixes.", "zero_train_gen_mismatch")
KL = "train/gen_kl_error"


@dataclass
class Run:
    path: Path
    name: str
    config: dict[str, Any]  # nested, as in config.yaml
    rows: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None

    @property
    def flat(self) -> dict[str, Any]:
        return flatten(self.config)

    @property
    def expected_steps(self) -> int | None:
        return self.flat.get("rl.steps")

    @property
    def status(self) -> str:
        if self.error:
            return "failed"
        if self.rows and len(self.rows) >= (self.expected_steps or 0):
            return "complete"
        return "incomplete"

    def series(self, key: str = KL) -> list[float]:
        return [row[key] for row in self.rows if key in row]

    @property
    def fixes(self) -> str:
        return fixes_label(self.flat)

    @property
    def wandb_group(self) -> str:
        """The W&B group the run logged to: the configured one, else derived as RunLog does."""
        wb = self.flat.get("tracking.wandb.group")
        if wb and "${" not in str(wb):
            return str(wb)
        try:
            return "-".join(axes(OmegaConf.create(self.config)).values())
        except Exception:  # a config cut short by an early failure
            return ""


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, dict):
        out: dict[str, Any] = {}
        for key, value in tree.items():
            out.update(flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: tree}


def fixes_label(flat: dict[str, Any]) -> str:
    """Which fixes were on: 'all on', 'all off', or the exceptions ('-gemm', '+logprob_path')."""
    zero = bool(flat.get("zero_train_gen_mismatch", True))
    forced = {n: flat.get(f"fixes.{n}") for n in invariance.FIXES}
    on = invariance.resolve(zero, forced)
    off = set(invariance.FIXES) - on
    if not off:
        return "all on"
    if not on:
        return "all off"
    if zero:
        return ",".join(f"-{n}" for n in invariance.FIXES if n in off)
    return ",".join(f"+{n}" for n in invariance.FIXES if n in on)


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def _config(run_dir: Path) -> dict[str, Any]:
    for path in (run_dir / CONFIG_FILE, run_dir / ".hydra" / "config.yaml"):
        if path.exists():
            return OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    return {}


def _is_run(d: Path, files: set[str]) -> bool:
    if METRICS_FILE in files or ERROR_FILE in files:
        return True
    hydra_job = (d / ".hydra").is_dir() and not {"cert.jsonl", "bench.json"} & files
    return hydra_job and not (d / "beds").is_dir()


def _walk(root: Path):
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(
            (d for d in dirnames if d not in SKIP_DIRS),
            key=lambda d: (not d.isdigit(), int(d) if d.isdigit() else 0, d),
        )
        yield Path(dirpath), set(filenames)


def _name(d: Path, root: Path, prefix: bool) -> str:
    """The run's path under the directory given; with several given, under that one's name."""
    rel = d.relative_to(root).as_posix()
    if rel == ".":
        return root.resolve().name
    return f"{root.resolve().name}/{rel}" if prefix else rel


@dataclass
class Sources:
    runs: list[Run] = field(default_factory=list)
    bench: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    cert: list[tuple[str, list[dict[str, Any]]]] = field(default_factory=list)


def discover(paths: list[str | Path]) -> Sources:
    """Every run, benchmark and certification result under `paths` (sweep or run dirs)."""
    found = Sources()
    seen: set[Path] = set()
    for root in map(Path, paths):
        if not root.is_dir():
            raise FileNotFoundError(f"{root} is not a directory")
        for d, files in _walk(root):
            if d.resolve() in seen:
                continue
            seen.add(d.resolve())
            name = _name(d, root, prefix=len(paths) > 1)
            if "bench.json" in files:
                found.bench.append((name, json.loads((d / "bench.json").read_text())))
            if "cert.jsonl" in files:
                found.cert.append((name, _read_jsonl(d / "cert.jsonl")))
            if _is_run(d, files):
                rows = _read_jsonl(d / METRICS_FILE)
                found.runs.append(Run(d, name, _config(d), rows, read_error(d)))
    return found


def sweep_axes(runs: list[Run]) -> list[str]:
    """The config keys that vary across the runs: what a comparison groups by.

    A group's other keys (model.hidden_size, ...) that follow from its `name` are left out;
    the fixes are one axis, `fixes` ('all on', '-batch_invariant_gemm', ...).
    """
    flats = [r.flat for r in runs]
    keys = sorted({k for f in flats for k in f})
    varying = [
        k
        for k in keys
        if not k.startswith(NOT_AXES) and len({json.dumps(f.get(k)) for f in flats}) > 1
    ]
    out = []
    for key in varying:
        group, _, leaf = key.rpartition(".")
        if leaf != "name" and f"{group}.name" in varying:
            by_name: dict[Any, set[str]] = {}
            for f in flats:
                by_name.setdefault(f.get(f"{group}.name"), set()).add(json.dumps(f.get(key)))
            if all(len(v) == 1 for v in by_name.values()):
                continue
        out.append(key)
    if len({r.fixes for r in runs}) > 1:
        out.append("fixes")
    return out


def axis_value(run: Run, axis: str) -> str:
    if axis == "fixes":
        return run.fixes
    value = run.flat.get(axis)
    return "" if value is None else str(value)


def summary(run: Run) -> dict[str, Any]:
    """final / mean / max gen_kl_error and the other per-run numbers of the report's table."""
    kl = run.series(KL)
    finite = [v for v in kl if math.isfinite(v)]
    diff = run.series("train/max_abs_logprob_diff")
    bitwise = run.series("train/bitwise_equal_frac")
    reward = run.series("reward/mean")
    val = run.series("val/accuracy")
    return {
        "steps": len(run.rows),
        "kl_final": kl[-1] if kl else None,
        "kl_mean": sum(finite) / len(finite) if finite else None,
        "kl_max": max(kl) if kl else None,
        "zero_steps": sum(v == 0.0 for v in kl),
        "max_abs_diff": max(diff) if diff else None,
        "bitwise_min": min(bitwise) if bitwise else None,
        "reward_final": reward[-1] if reward else None,
        "val_accuracy_final": val[-1] if val else None,
    }
