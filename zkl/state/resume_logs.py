"""A resumed run's logs cut back to its checkpoint: metrics.jsonl and tokens.jsonl read
without trusting them (torn, blank, repeated or later lines dropped), or the resume refused.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from zkl.console import say
from zkl.errors import ConfigError
from zkl.state.config import CHECKPOINT_FILE
from zkl.tracking.jsonl import Line, read_jsonl
from zkl.tracking.run_log import METRICS_FILE, TOKENS_FILE


@dataclass
class LogScan:
    """What a resume keeps of a .jsonl log: the complete lines of steps before its checkpoint."""

    path: Path
    kept: list[tuple[int, str]]  # (step, line), in file order
    changed: bool  # some line is dropped: the file is rewritten
    notes: list[str]  # what was dropped, for the one line a resume prints
    damaged: list[int]  # line numbers that are not a row with a step

    def steps(self) -> set[int]:
        return {step for step, _ in self.kept}

    def write(self) -> None:
        if not self.changed:
            return
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text("".join(line for _, line in self.kept))
        os.replace(tmp, self.path)
        say(f"zkl: {self.path}: dropped {', '.join(self.notes)}")


def _step_of(line: Line) -> int | None:
    step = line.record.get("step") if line.is_object else None
    return step if type(step) is int and step >= 0 else None


def scan_jsonl(path: Path, next_step: int, one_per_step: bool) -> LogScan:
    """Read `path` without trusting it: blank, torn, non-JSON and step-less lines are dropped,
    so are exact repeats and steps from `next_step` on. Two different rows for one step of a
    one-row-per-step log (two writers) are a ConfigError: which one is true is unknown."""
    read = read_jsonl(path)
    kept: list[tuple[int, str]] = []
    seen: dict[int, tuple[int, str]] = {}
    lines_seen: set[str] = set()
    repeats = 0
    later: list[int] = []  # the steps of the rows from `next_step` on
    damaged: list[int] = []
    for line in read.lines:
        step = _step_of(line)
        if step is None:
            damaged.append(line.number)
        elif step >= next_step:
            later.append(step)
        elif line.text in lines_seen:
            repeats += 1
        elif one_per_step and step in seen:
            raise ConfigError(
                f"{path} holds two different rows for step {step} (lines {seen[step][0]} and "
                f"{line.number}), as when two runs wrote one directory; start afresh in another "
                "hydra.run.dir."
            )
        else:
            lines_seen.add(line.text)
            seen[step] = (line.number, line.text)
            kept.append((step, line.text + "\n"))
    counts = [(read.blank, "blank line"), (repeats, "repeated row")]
    notes = [f"{n} {what}{'s' if n > 1 else ''}" for n, what in counts if n]
    if later:
        notes.append(_after_checkpoint(later, next_step, "row" if one_per_step else "record"))
    if damaged:
        notes.append(f"line{'s' if len(damaged) > 1 else ''} {_numbers(damaged)} (not a row)")
    if read.torn is not None:  # dropped even when whole: the next writer would append to it
        notes.append("a torn last line")
    return LogScan(path, kept, bool(notes), notes, damaged)


def _steps_text(steps: list[int]) -> str:
    """`step 3`, `steps 3-5` or `steps 3, 5, 7` (sorted, each once)."""
    steps = sorted(set(steps))
    if len(steps) == 1:
        return f"step {steps[0]}"
    if steps == list(range(steps[0], steps[-1] + 1)):
        return f"steps {steps[0]}-{steps[-1]}"
    return f"steps {_numbers(steps)}"


def _after_checkpoint(steps: list[int], next_step: int, noun: str) -> str:
    """What a resume drops of the steps at or after its checkpoint's, and why."""
    what = f"{len(steps)} {noun}{'s' if len(steps) > 1 else ''} of {_steps_text(steps)}"
    if next_step == 0:
        held = "them" if len(steps) > 1 else "it"
        return f"{what}: no {CHECKPOINT_FILE} holds {held}, so the run starts again from step 0"
    return (
        f"{what}, logged after the {CHECKPOINT_FILE} of step {next_step}: the run continues "
        f"from step {next_step}"
    )


def _numbers(numbers: list[int]) -> str:
    shown = ", ".join(map(str, numbers[:5]))
    return shown + (f" and {len(numbers) - 5} more" if len(numbers) > 5 else "")


def trim_logs(run_dir: Path, next_step: int) -> None:
    """Cut metrics.jsonl and tokens.jsonl back to the steps before `next_step`, or refuse.

    A step's metrics row is its commit record (zkl/tracking/run_log.py writes the token
    records first), so token records of a step without a row are dropped. A step before
    `next_step` without a complete row is refused: the checkpoint's history is not on disk.
    """
    metrics = scan_jsonl(run_dir / METRICS_FILE, next_step, one_per_step=True)
    absent = sorted(set(range(next_step)) - metrics.steps())
    if absent:
        why = f" (line {_numbers(metrics.damaged)} is not a row)" if metrics.damaged else ""
        raise ConfigError(
            f"{metrics.path} has no complete row for step {absent[0]}{why}, but "
            f"{run_dir / CHECKPOINT_FILE} is at step {next_step}; delete the checkpoint to "
            "rerun from step 0 with resume=true, or start afresh in another hydra.run.dir."
        )
    tokens = scan_jsonl(run_dir / TOKENS_FILE, next_step, one_per_step=False)
    metrics.kept.sort(key=lambda kept: kept[0])  # stable: file order within a step
    metrics.changed |= [s for s, _ in metrics.kept] != sorted(s for s, _ in metrics.kept)
    metrics.write()
    tokens.write()
