"""The run's last console line: `gen_kl_error` (exactly 0, or its mean and max), the reward,
validation, and whether the steps trained.

A step is exactly zero when its `train/max_abs_logprob_diff` is 0.0 (docs/design.md section
2), so its `gen_kl_error` is 0.0 too; the line counts those over every step the rows hold,
and when some were not it gives the mean and max of `gen_kl_error` and the max logprob
difference over the steps. A run with steps that trained nothing ends by saying how many
and why (zkl/rl/trained.py, the rule the cert applies).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from zkl.rl.trained import untrained_clause


def summary_line(rows: list[dict[str, Any]], run_dir: str | Path) -> str:
    """One line: gen_kl_error over the steps run, reward, val/accuracy, untrained steps."""
    assert rows, "a finished run has at least one step"
    zero = sum(r["train/max_abs_logprob_diff"] == 0.0 for r in rows)
    steps = f"{len(rows)} step{'s' if len(rows) > 1 else ''}"
    line = f"{steps} in {run_dir}: gen_kl_error exactly 0 at {zero} of {steps}"
    if zero < len(rows):
        kl = [r["train/gen_kl_error"] for r in rows]
        diff = max(r["train/max_abs_logprob_diff"] for r in rows)
        line += (
            f", mean={sum(kl) / len(kl):.3g} max={max(kl):.3g}"
            f" (max_abs_logprob_diff max={diff:.3g})"
        )
    line += f"; reward first={rows[0]['reward/mean']:.3f} last={rows[-1]['reward/mean']:.3f}"
    validated = [r for r in rows if "val/accuracy" in r]
    if validated:
        last = validated[-1]
        line += f"; val/accuracy={last['val/accuracy']:.3f} (before step {last['step']})"
    untrained = untrained_clause(rows)
    if untrained:
        line += f"; {untrained}."
    return line
