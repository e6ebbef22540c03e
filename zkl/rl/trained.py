"""Whether a step trained: one rule for the run's warning, its last line and the cert.

A step trained when some advantage was non-zero and its update changed some of the weights
the generator gets (`weights/changed_tensors` > 0). A step whose groups each got equal
rewards has only zero advantages and learns nothing; an update too small for the weights'
precision (a learning rate below bf16's resolution) moves the fp32 masters but none of the
weights a refit sends. Either way the next rollout samples the same policy, and a run made
of such steps reports mismatch metrics of a model that never moved.
"""

from __future__ import annotations

import itertools
from typing import Any

from zkl.console import say

ZERO_ADVANTAGES = "zero_advantages"
NO_WEIGHT_CHANGED = "no_weight_changed"


def untrained_kind(row: dict[str, Any]) -> str | None:
    """Why the step of `row` trained nothing (ZERO_ADVANTAGES, NO_WEIGHT_CHANGED), or None."""
    if row["rl/zero_adv_frac"] == 1.0:
        return ZERO_ADVANTAGES
    if row["weights/changed_tensors"] == 0:
        return NO_WEIGHT_CHANGED
    return None


def untrained_steps(rows: list[dict[str, Any]]) -> list[str]:
    """Why steps of a run certified no refit of new weights, one sentence each (empty: none)."""
    reasons = []
    for row, following in itertools.zip_longest(rows, rows[1:]):
        step, kind = row["step"], untrained_kind(row)
        if kind == ZERO_ADVANTAGES:
            reasons.append(
                f"every advantage of step {step} was zero (equal rewards in each group), "
                "so it trained nothing"
            )
        elif kind == NO_WEIGHT_CHANGED:
            reasons.append(
                f"the update of step {step} (norm {row['optim/update_norm']:.3g}) changed none "
                "of the weights the generator gets, e.g. a learning rate below their resolution"
            )
        if following is not None and following["gen/weight_version"] != row["weights/version"]:
            reasons.append(
                f"step {following['step']} rolled out with weight version "
                f"{following['gen/weight_version']}, not the refitted {row['weights/version']}"
            )
    return reasons


def _why(kinds: list[str | None], lr: float | None = None) -> str:
    """The causes among `kinds` in words, each with what to change."""
    parts = []
    if ZERO_ADVANTAGES in kinds:
        parts.append(
            "every advantage was zero (each group's rewards were equal: check task.reward, "
            "or raise rl.samples_per_prompt)"
        )
    if NO_WEIGHT_CHANGED in kinds:
        now = f", now {lr:g}" if lr is not None else ""
        parts.append(
            "the update changed none of the weights the generator gets (a learning rate "
            f"below their resolution: raise rl.lr{now})"
        )
    return " or ".join(parts)


def _steps(first: int, last: int) -> str:
    return f"step {first}" if first == last else f"steps {first}-{last}"


def warn_untrained(rows: list[dict[str, Any]], after: int, lr: float) -> None:
    """One stderr line when the last `after` steps in a row trained nothing (0: never).

    Said once a streak, as the streak reaches `after`, so a run that goes on untrained is not
    a line a step.
    """
    if after <= 0 or len(rows) < after:
        return
    streak = 0
    for row in reversed(rows):
        if untrained_kind(row) is None:
            break
        streak += 1
    if streak != after:
        return
    last = rows[-after:]
    say(
        f"zkl: warning: {_steps(last[0]['step'], last[-1]['step'])} trained nothing, "
        f"{after} in a row: {_why([untrained_kind(r) for r in last], lr)} "
        f"(rl.warn_untrained_after={after} sets when this is said)."
    )


def untrained_clause(rows: list[dict[str, Any]]) -> str | None:
    """The run's last words on training: None when every step trained, else how many did
    not and why."""
    kinds = [untrained_kind(r) for r in rows]
    count = sum(k is not None for k in kinds)
    if not count:
        return None
    head = f"{count} of {len(rows)} steps trained nothing"
    if count == len(rows):
        head = "no step trained"
    return f"{head}: {_why(kinds)}"
