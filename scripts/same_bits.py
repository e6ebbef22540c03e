"""Records of a fixed set of short runs, and whether two sets are the same bit for bit: what
a refactor that must not change results is checked with.

    python scripts/same_bits.py record DIR      # 5 steps of each bed below into DIR/<bed>
    python scripts/same_bits.py compare A B     # tokens.jsonl and metrics.jsonl (timing aside)

Each bed is `python -m zkl rl.steps=5 tracking.dump_tokens=all` with the overrides below, on
the CPU; `compare` prints one line per bed and exits 1 if any differs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BASE = ["rl.steps=5", "tracking.dump_tokens=all", "tracking.wandb.mode=disabled",
        "tracking.progress=false", "checkpoint.save=false", "num_threads=1"]  # fmt: skip
BEDS = {
    "tiny_dense": [],
    "tiny_moe": ["model=tiny_moe"],
    "tiny_hybrid": ["model=tiny_hybrid"],
    "tiny_gpt_oss": ["model=tiny_gpt_oss"],
    "mxfp8": ["+precision=mxfp8"],
    "fp16": ["+precision=fp16"],
    "dedicated": ["+layout=dedicated"],
    "routing_replay": [
        "model=tiny_moe",
        "rl.routing_replay=true",
        "zero_train_gen_mismatch=false",
    ],  # fmt: skip
    "token_tis": ["rl.correction.mode=token_tis", "zero_train_gen_mismatch=false"],
}
TIMED = ("timing/", "perf/")


def record(root: Path) -> None:
    for name, overrides in BEDS.items():
        out = root / name
        cmd = [sys.executable, "-m", "zkl", *BASE, *overrides, f"hydra.run.dir={out}"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        last = (done.stdout.strip().splitlines() or [done.stderr.strip()[-300:]])[-1]
        print(f"{name}: rc={done.returncode} {last}", flush=True)


def _rows(run: Path) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(x).items() if not k.startswith(TIMED)} for x in lines]


def compare(a: Path, b: Path) -> bool:
    same = True
    for name in BEDS:
        try:
            tokens = [(run / name / "tokens.jsonl").read_text() for run in (a, b)]
            tokens = tokens[0] == tokens[1]
            metrics = _rows(a / name) == _rows(b / name)
        except FileNotFoundError as missing:
            print(f"{name}: missing {missing.filename}")
            same = False
            continue
        word = {True: "same", False: "DIFFER"}
        print(f"{name}: tokens {word[tokens]}, metrics {word[metrics]}")
        same &= tokens and metrics
    return same


if __name__ == "__main__":
    if sys.argv[1:2] == ["record"] and len(sys.argv) == 3:
        record(Path(sys.argv[2]))
    elif sys.argv[1:2] == ["compare"] and len(sys.argv) == 4:
        sys.exit(0 if compare(Path(sys.argv[2]), Path(sys.argv[3])) else 1)
    else:
        sys.exit(__doc__)
