"""Find the runs under sweep or run directories and read what they logged.

A run directory holds `metrics.jsonl` (the source of truth), `config.yaml` and, when a
ConfigError or another exception stopped it, `error.txt`. A Hydra job directory that holds
none of them is a run that never got going (shown, never skipped). `bench.json` and
`cert.jsonl` are the results of `python -m zkl.bench` and `python -m zkl.cert`.
"""

from __future__ import annotations

import functools
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from zkl import invariance
from zkl.renamed import read_back
from zkl.run.model_overrides import model_keys, names_model_group
from zkl.tracking.errors import ERROR_FILE, read_error
from zkl.tracking.jsonl import NOT_JSON, read_jsonl
from zkl.tracking.run_log import CONFIG_FILE, METRICS_FILE, axes, flatten

SKIP_DIRS = {".submitit", ".hydra", "wandb", "__pycache__"}
KL = "train/gen_kl_error"


@dataclass
class Run:
    path: Path
    name: str
    config: dict[str, Any]  # nested, as in config.yaml
    rows: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    damage: str | None = None  # why its files cannot be read whole (a failed run, with reason)

    @functools.cached_property
    def flat(self) -> dict[str, Any]:
        """The config's dotted keys (read for every axis of every table: flattened once)."""
        return flatten(self.config)

    @property
    def expected_steps(self) -> int | None:
        steps = self.flat.get("rl.steps")
        return steps if isinstance(steps, int) else None

    @property
    def status(self) -> str:
        if self.error or self.damage:
            return "failed"
        if self.rows and len(self.rows) >= (self.expected_steps or 0):
            return "complete"
        return "incomplete"

    @property
    def reason(self) -> str:
        """error.txt's sentence and what is damaged, joined."""
        return "; ".join(x for x in (self.error, self.damage) if x)

    def points(self, key: str = KL) -> list[tuple[int, float]]:
        """(step, value) of every row whose `key` is a number."""
        return [(row["step"], row[key]) for row in self.rows if _is_number(row.get(key))]

    def series(self, key: str = KL) -> list[float]:
        return [row[key] for row in self.rows if _is_number(row.get(key))]

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


def fixes_label(flat: dict[str, Any]) -> str:
    """Which fixes were on, in the registry's one vocabulary (`invariance.label`: `all_fixes`,
    `no_fixes`, `minus_<off>`, `only_<on>`), as W&B groups and the cert's variants say it."""
    zero = bool(flat.get("zero_train_gen_mismatch", True))
    forced = {n: flat.get(f"fixes.{n}") for n in invariance.FIXES}
    return invariance.label(invariance.resolve(zero, forced))


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _read_jsonl(path: Path) -> tuple[list[dict[str, Any]], str | None]:
    """The file's JSON objects, and what was wrong with the lines left out (None: nothing).

    A last line without its newline (a writer killed mid-line) is left out silently, unless
    it is a whole object.
    """
    try:
        read = read_jsonl(path)
    except OSError as err:
        return [], f"{path.name} cannot be read ({err})"
    rows, bad = [], []
    for line in read.lines:
        if line.record is NOT_JSON:
            bad.append(f"line {line.number} is not JSON")
        elif not line.is_object:
            bad.append(f"line {line.number} is not a JSON object")
        else:
            rows.append(line.record)
    if read.torn is not None and read.torn.is_object:
        rows.append(read.torn.record)
    return rows, (f"{path.name}: {', '.join(bad[:3])}" if bad else None)


def _check_rows(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str | None]:
    """Metric rows with a whole-number step and numeric metrics; a reason for any other."""
    kept, bad = [], []
    for index, row in enumerate(rows):
        step = row.get("step")
        if not isinstance(step, int) or isinstance(step, bool):
            bad.append(f"row {index + 1} has no step")
            continue
        if KL in row and not _is_number(row[KL]):
            bad.append(f"step {step} has a non-numeric {KL} ({str(row[KL])[:40]})")
        kept.append(row)
    return kept, (f"{METRICS_FILE}: {', '.join(bad[:3])}" if bad else None)


def _config(run_dir: Path) -> tuple[dict[str, Any], str | None]:
    """The run's config: zkl's resolved `config.yaml`, else what Hydra composed.

    A run refused before zkl resolved its config has only `.hydra/config.yaml`, where a
    `model.checkpoint` run without a model group still carries the default group's keys;
    its model is then named as zkl names it, by the checkpoint directory.
    """
    for path in (run_dir / CONFIG_FILE, run_dir / ".hydra" / "config.yaml"):
        if path.exists():
            try:
                tree = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
            except Exception as err:  # torn or hand-edited YAML: the run is reported failed
                first = str(err).strip().splitlines()[0] if str(err).strip() else ""
                return {}, f"{path.name} cannot be read ({type(err).__name__}: {first})"
            if not isinstance(tree, dict):
                return {}, f"{path.name} is not a mapping"
            if path.parent.name == ".hydra":
                _as_resolved(tree, _hydra_overrides(run_dir))
            return read_back(tree), None  # a run of an older zkl: under today's key names
    return {}, None


def _hydra_overrides(run_dir: Path) -> list[str]:
    try:
        listed = OmegaConf.to_container(OmegaConf.load(run_dir / ".hydra" / "overrides.yaml"))
    except Exception:  # absent or damaged: the config alone is what there is
        return []
    return [str(o) for o in listed] if isinstance(listed, list) else []


def _as_resolved(tree: dict[str, Any], overrides: list[str]) -> None:
    """Hydra's config as zkl resolves it (zkl/run/model_from_checkpoint.py): a checkpoint
    without a named model group gives the model its directory's name; the architecture,
    read from its config.json by the run, is left out rather than shown as the default's."""
    model, task = tree.get("model"), tree.get("task")
    if not isinstance(model, dict) or not model.get("checkpoint"):
        return
    if names_model_group(overrides):
        return
    checkpoint = str(model["checkpoint"])
    named = "name" in model_keys(overrides)
    tree["model"] = {"name": model["name"] if named else Path(checkpoint).name}
    tree["model"]["checkpoint"] = checkpoint
    if isinstance(task, dict) and task.get("name") == "dataset" and not task.get("tokenizer"):
        task["tokenizer"] = checkpoint


def _is_run(d: Path, files: set[str]) -> bool:
    if METRICS_FILE in files or ERROR_FILE in files:
        return True
    hydra_job = (d / ".hydra").is_dir() and not {"cert.jsonl", "bench.json"} & files
    return hydra_job and not (d / "beds").is_dir()


def _walk(root: Path, skipped: list[tuple[str, str]]):
    """Every directory under root, symlinked ones followed once (a loop or repeat is listed)."""
    visited = {root.resolve()}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        keep = []
        for d in sorted(
            (d for d in dirnames if d not in SKIP_DIRS),
            key=lambda d: (not d.isdigit(), int(d) if d.isdigit() else 0, d),
        ):
            target = (Path(dirpath) / d).resolve()
            if target in visited:
                skipped.append((str(Path(dirpath) / d), f"a link to {target}, reported once"))
                continue
            visited.add(target)
            keep.append(d)
        dirnames[:] = keep
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
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (path, why not reported)


CERT_KEYS = ("bed", "variant", "mode", "steps", "tokens", "train/max_abs_logprob_diff")


def _read_bench(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    try:
        result = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        return None, f"bench.json cannot be read ({type(err).__name__})"
    if not isinstance(result, dict):
        return None, "bench.json is not a JSON object"
    return result, None


def discover(paths: list[str | Path]) -> Sources:
    """Every run, benchmark and certification result under `paths` (sweep or run dirs)."""
    found = Sources()
    seen: set[Path] = set()
    for root in map(Path, paths):
        if not root.is_dir():
            raise FileNotFoundError(f"{root} is not a directory")
        for d, files in _walk(root, found.skipped):
            if d.resolve() in seen:
                found.skipped.append((str(d), f"the same directory as {d.resolve()}"))
                continue
            seen.add(d.resolve())
            name = _name(d, root, prefix=len(paths) > 1)
            if "bench.json" in files:
                result, problem = _read_bench(d / "bench.json")
                if result is None:
                    found.skipped.append((f"{d / 'bench.json'}", problem))
                else:
                    found.bench.append((name, result))
            if "cert.jsonl" in files:
                rows, problem = _read_jsonl(d / "cert.jsonl")
                whole = [r for r in rows if all(k in r for k in CERT_KEYS)]
                if len(whole) < len(rows):
                    problem = f"{len(rows) - len(whole)} rows lack one of {', '.join(CERT_KEYS)}"
                if problem:
                    found.skipped.append((f"{d / 'cert.jsonl'}", problem))
                found.cert.append((name, whole))
            if _is_run(d, files):
                found.runs.append(_read_run(d, name))
    return found


def _read_run(d: Path, name: str) -> Run:
    """One run; whatever of its files is damaged makes it a failed run, with the reason."""
    rows, problem = _read_jsonl(d / METRICS_FILE)
    rows, bad_rows = _check_rows(rows)
    config, bad_config = _config(d)
    try:
        error = read_error(d)
    except (OSError, UnicodeDecodeError) as err:
        error = f"error.txt cannot be read ({err})"
    damage = "; ".join(x for x in (problem, bad_rows, bad_config) if x) or None
    return Run(d, name, config, rows, error, damage)


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
        "val_accuracy_first": val[0] if val else None,
        "val_accuracy_final": val[-1] if val else None,
    }
