"""The run's last console line: how many steps were exactly zero, the reward, validation.

A step is exactly zero when its `train/max_abs_logprob_diff` is 0.0 (docs/design.md section
2); the line counts those over every step the rows hold, and when some were not it gives the
mean and max of `gen_kl_error` and the max logprob difference over the steps.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def summary_line(rows: list[dict[str, Any]], run_dir: str | Path) -> str:
    """One line: steps exactly 0 out of the steps run (or the mismatch), reward, val/accuracy."""
    assert rows, "a finished run has at least one step"
    zero = sum(r["train/max_abs_logprob_diff"] == 0.0 for r in rows)
    line = f"{len(rows)} steps in {run_dir}: {zero} of {len(rows)} exactly 0"
    if zero < len(rows):
        kl = [r["train/gen_kl_error"] for r in rows]
        diff = max(r["train/max_abs_logprob_diff"] for r in rows)
        line += (
            f"; gen_kl_error mean={sum(kl) / len(kl):.3g} max={max(kl):.3g}"
            f" max_abs_logprob_diff max={diff:.3g}"
        )
    line += f"; reward first={rows[0]['reward/mean']:.3f} last={rows[-1]['reward/mean']:.3f}"
    validated = [r for r in rows if "val/accuracy" in r]
    if validated:
        last = validated[-1]
        line += f"; val/accuracy={last['val/accuracy']:.3f} (before step {last['step']})"
    return line
