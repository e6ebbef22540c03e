"""The supervised warm start's command line (`zkl.lab.supervised` says what it does).

    python -m zkl.lab.warm_start OUT [--steps 60] [--lr 3e-3] [group=option key=value ...]

The overrides are those of `python -m zkl`, checked as its are before torch loads (the keys,
`model.checkpoint`'s files, a dataset task's files, tokenizer and reward: `zkl.run.checks`),
so a refusal is immediate; the training loads after.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from zkl.cli import guarded
from zkl.run.checks import check_overrides
from zkl.run.overrides import normalize

PROG = "python -m zkl.lab.warm_start"


def main() -> None:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Supervised steps on the task, written as an HF checkpoint."
    )
    parser.add_argument("out", type=Path, help="the checkpoint directory to write")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--batch", type=int, default=64, help="problems a step")
    parser.add_argument("overrides", nargs="*", help="python -m zkl's group=option key=value")
    args = parser.parse_intermixed_args()  # options and overrides in any order

    def body() -> None:
        dcfg = check_overrides(args.overrides)  # before torch loads
        # lazy: torch and the training load once the config has passed its checks
        from zkl.lab.supervised import warm_start
        from zkl.run.compose import to_object  # lazy: reads a checkpoint (torch)

        cfg = to_object(dcfg, normalize(args.overrides))
        warm_start(args.out, cfg, args.steps, args.lr, args.batch)

    guarded("zkl.lab.warm_start", body)


if __name__ == "__main__":
    main()
