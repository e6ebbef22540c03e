"""Recompute every step's mismatch metrics and `rollout_corr/` diagnostics from a run's
tokens.jsonl and check metrics.jsonl.

    python scripts/recompute_metrics.py RUN_DIR

The run must have dumped every sample (`tracking.dump_tokens=all`). Exits 1 on any
difference: an independent check that the logged numbers are what the tokens say.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

import torch
import yaml

from zkl.rl.config import CorrectionConfig
from zkl.rl.correction import correction_weights, diagnostics
from zkl.rl.metrics import mismatch_metrics
from zkl.tracking.run_log import METRICS_FILE, TOKENS_FILE


def recompute(run_dir: Path) -> list[str]:
    """Differences between logged and recomputed metrics (empty when they agree)."""
    lp_train, lp_gen = defaultdict(list), defaultdict(list)
    correction = CorrectionConfig(
        **yaml.safe_load((run_dir / "config.yaml").read_text())["rl"]["correction"]
    )
    behavior = "lp_sampled" if correction.behavior == "sampled" else "lp_gen"
    sequences = defaultdict(list)  # step -> [(lp_train, the behaviour's lp)] per response
    for line in (run_dir / TOKENS_FILE).read_text().splitlines():
        record = json.loads(line)
        lp_train[record["step"]] += record["lp_train"]
        lp_gen[record["step"]] += record["lp_gen"]
        pair = (torch.tensor(record["lp_train"]), torch.tensor(record[behavior]))
        sequences[record["step"]].append(pair)
    problems = []
    for line in (run_dir / METRICS_FILE).read_text().splitlines():
        row = json.loads(line)
        step = row["step"]
        again = mismatch_metrics(torch.tensor(lp_train[step]), torch.tensor(lp_gen[step]))
        if row["gen/response_tokens"] != len(lp_gen[step]):
            problems.append(f"step {step}: tokens.jsonl lacks samples (use dump_tokens=all)")
            continue
        old, beh = [t for t, _ in sequences[step]], [b for _, b in sequences[step]]
        if any(k.startswith("rollout_corr/") for k in row):
            again.update(diagnostics(old, beh, correction_weights(old, beh, correction)))
        problems += [
            f"step {step}: {k} logged {row[k]!r}, recomputed {v!r}"
            for k, v in again.items()
            if row[k] != v
        ]
    return problems


if __name__ == "__main__":
    problems = recompute(Path(sys.argv[1]))
    print("\n".join(problems) or "every logged metric matches the token records")
    sys.exit(1 if problems else 0)
