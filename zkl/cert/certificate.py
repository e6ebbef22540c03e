"""`python -m zkl.cert`: certify beds bitwise, and never pass a bed that tested nothing.

What is certified is what `python -m zkl` would run with the same config and overrides. The
bed axes `cert.models`, `cert.precisions`, `cert.layouts` and `cert.kv` are null by default:
then the one bed is the user's config. A list certifies one bed per combination of options;
each option is `conf/<group>/<option>.yaml` with the user's own edits of that group kept
(`model.num_hidden_layers=4` holds for every model), and every other key is the user's. An
empty list, `cert.steps=1`, or a bed this machine cannot run is refused with one sentence
(exit 2) before any work.

Step-0 (`cert.steps=0`): generate with the initial weights under several schedules
(batch sizes, arrival orders, chunked prefill, prompts of varied length behind a shared
prefix) and score every rollout with several micro-batch groupings; every token must agree
bitwise. Multi-step (`cert.steps=N`, N >= 2): N real GRPO steps with updates and refits,
every step exactly zero, and every step must have trained: some advantage non-zero, an
update that changed the weights the generator gets, the next rollout on the refitted
version. A bed that misses one fails with a sentence naming the step and the reason.

`cert.ablate=true` turns each fix off in turn, in a mode that can expose it (`ablation`).
The beds and their runs are planned in `beds`, each certified by `certify`.
Progress goes to stderr, one line as each run starts and ends; the table, then the paths of
`cert.jsonl` and `cert.txt`, to stdout. Exit 0 when every bed passes, 1 when one fails or
none ran, 2 when the config is refused.
"""

from __future__ import annotations

import gc
import json
import time
from pathlib import Path
from typing import Any

import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from zkl import invariance
from zkl.cert import ablation
from zkl.cert.beds import Run, bed_dir, plan
from zkl.cert.certify import certify
from zkl.cert.schema import CertRunConfig
from zkl.console import say
from zkl.device import resolve_device
from zkl.errors import NonFinite
from zkl.run.compose import to_object
from zkl.state import run_lock

RESULTS_FILE, TABLE_FILE = "cert.jsonl", "cert.txt"


def execute(run: Run, run_dir: Path, done: list[tuple[Run, dict[str, Any]]]) -> dict[str, Any]:
    """Certify one run; its row with a `passed` flag and a `result` in words."""
    row: dict[str, Any] = {"bed": run.bed, "kind": run.kind, "variant": run.variant}
    row.update(mode=str(run.mode), fix=run.fix)
    if run.refused:
        row.update(passed=False, result=f"cannot run in this mode: {run.refused}")
        return row
    try:
        row.update(certify(run.cfg, bed_dir(run_dir, run)))
    except NonFinite as exc:  # the bed fails; the other beds still run
        row.update(passed=False, result=f"FAIL: {exc}")
        return row
    row["passed"] = row["train/max_abs_logprob_diff"] == 0.0 and not row["reasons"]
    if run.kind == "ablation":
        reference = next(ref for r, ref in done if r.kind != "ablation" and r.cfg == run.reference)
        row["result"] = ablation.verdict(run.fix, run.cfg, row, reference)
    else:
        row["result"] = "PASS" if row["passed"] else "FAIL"
        if row["reasons"]:
            row["result"] += ": " + row["reasons"][0]
    return row


def progress(message: str) -> None:
    say(f"zkl.cert {message}")


def run_cert(cfg: CertRunConfig, run_dir: str | Path) -> list[dict[str, Any]]:
    """Certify every bed (with cert.ablate, every fix off in turn); write and print the table."""
    run_dir = Path(run_dir)
    runs = plan(cfg)
    with run_lock.held(run_dir):  # each bed's own run directory is locked by loop.run too
        return _run_all(runs, run_dir)


def _run_all(runs: list[Run], run_dir: Path) -> list[dict[str, Any]]:
    done: list[tuple[Run, dict[str, Any]]] = []
    with open(run_dir / RESULTS_FILE, "w") as f:  # a row as each run ends
        for i, run in enumerate(runs, 1):
            tag = f"[{i}/{len(runs)}] {run.bed} {run.variant} ({run.mode})"
            progress(f"{tag} ...")
            device = resolve_device(run.cfg.device)
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            start = time.perf_counter()
            row = execute(run, run_dir, done)
            row["seconds"] = time.perf_counter() - start
            memory = ""
            if device.type == "cuda":
                row["peak_gpu_mem_gb"] = torch.cuda.max_memory_allocated(device) / 2**30
                memory = f", peak GPU memory {row['peak_gpu_mem_gb']:.1f} GiB"
            progress(f"{tag}: {row['result']} ({row['seconds']:.1f}s{memory})")
            done.append((run, row))
            f.write(json.dumps(row) + "\n")
            f.flush()
            if device.type == "cuda":  # the next bed's memory check must see this one's freed
                gc.collect()
                torch.cuda.empty_cache()
    results = [row for _, row in done]
    table = format_table(results)
    (run_dir / TABLE_FILE).write_text(table + "\n")
    print(table)
    print(f"results: {run_dir / RESULTS_FILE} (one JSON object per row), {run_dir / TABLE_FILE}")
    return results


# (header, row key, width, format); "s" columns are left-aligned
COLUMNS = [
    ("bed", "bed", 40, "s"),
    ("variant", "variant", 32, "s"),
    ("mode", "mode", 23, "s"),
    ("steps", "steps", 5, "d"),
    ("tokens", "tokens", 7, "d"),
    ("max_abs_diff", "train/max_abs_logprob_diff", 12, ".3g"),
    ("gen_kl_error", "train/gen_kl_error", 12, ".3g"),
    ("bitwise", "train/bitwise_equal_frac", 7, ".3f"),
    ("update_norm", "update_norm", 11, ".3g"),
    ("version", "weight_version", 7, "d"),
]


def format_table(results: list[dict[str, Any]]) -> str:
    """One line per row; `update_norm` is the smallest of the bed's steps, `version` the weight
    version of its last rollout (both `-` / 0 for step-0)."""

    def cell(value: Any, width: int, fmt: str) -> str:
        text = "-" if value is None else format(value, fmt)
        return text.ljust(width) if fmt == "s" else text.rjust(width)

    head = " ".join(h.ljust(w) if f == "s" else h.rjust(w) for h, _, w, f in COLUMNS)
    head += "  result"
    lines = [head, "-" * len(head)]
    for r in results:
        cells = " ".join(cell(r.get(key), w, f) for _, key, w, f in COLUMNS)
        lines.append(f"{cells}  {r['result']}")
    return "\n".join(lines)


def certify_all(dcfg: DictConfig) -> int:
    """The exit code: 0 when every certified bed is exactly zero, else 1."""
    results = run_cert(to_object(dcfg), HydraConfig.get().runtime.output_dir)
    certified = [r for r in results if r["kind"] == "bed"]
    if not certified:
        say("zkl.cert: no bed ran, so nothing is certified.")
        return 1
    return 0 if all(r["passed"] for r in certified) else 1


def list_fixes() -> str:
    """The registry (zkl/invariance.py): each fix's name, cause and remedy, and its key."""
    blocks = [f"{len(invariance.FIXES)} fixes; fixes.<name>=false turns one off:"]
    for fix in invariance.FIXES.values():
        blocks.append(
            f"{fix.name}\n  cause: {fix.cause}\n  fix:   {fix.remedy}\n  test:  {fix.test}"
        )
    return "\n".join(blocks)
