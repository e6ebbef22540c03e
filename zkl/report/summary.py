"""The report's opening: what was compared (the axes that differ between the arms, in words),
the arms by name, and the winner of each question the report exists for, computed from the
arms' logged rows.

The questions: the lowest mismatch (gen_kl_error, mean over the logged steps), the best final
val/accuracy (at each arm's last validation) and the fastest step (generation + scoring +
update + refit, mean over the steps). Arms whose first validations differ (other models or
warm starts) do not compare by their final accuracy: the question becomes the largest gain,
last validation minus first, and says the range they started in. Arms with the best value are
a tie and said as one; a question that no arm logged says so.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable
from dataclasses import dataclass

from zkl.report.axes import axis_value, common_settings, short, sweep_axes
from zkl.report.naming import Arms
from zkl.report.runs import Run, summary
from zkl.report.style import SVG_DASHES, Style
from zkl.report.tables import Cell, Table, fmt, md_escape, value_order

TIMING = ("timing/gen_s", "timing/score_s", "timing/update_s", "timing/refit_s")

# What an axis is, in words; any other axis is named by its config key.
AXIS_WORDS = {
    "model.name": "model",
    "precision.name": "precision",
    "layout.name": "layout",
    "kv.mode": "KV cache",
    "engine.name": "engine",
    "task.name": "task",
    "rl.correction.mode": "off-policy correction",
    "rl.correction.behavior": "behaviour logprobs",
    "rl.routing_replay": "routing replay",
    "rl.record_routes": "routes recorded",
    "fixes": "fixes on",
}


def mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def step_time(run: Run) -> float | None:
    """Seconds a step, generation + scoring + update + refit, mean over the timed steps."""
    return mean([sum(row.get(k, 0.0) for k in TIMING) for row in run.rows if TIMING[0] in row])


def summarized(key: str) -> Callable[[Run], float | None]:
    """A run's number `key` from the report's one per-run summary (`zkl.report.runs.summary`),
    which the runs table shows too."""
    return lambda run: summary(run)[key]


@dataclass(frozen=True)
class Question:
    title: str
    measured: str  # how the value is measured, in words
    lower_is_better: bool
    value: Callable[[Run], float | None]
    missing: str  # why no arm has a value
    zero: str = "0"  # how a value of exactly 0 reads


def accuracy_gain(run: Run) -> float | None:
    """val/accuracy at the last validation minus at the first, rounded so that equal gains
    of fractions tie (0.3 - 0.1 and 0.2 differ in the last bit)."""
    first, final = summary(run)["val_accuracy_first"], summary(run)["val_accuracy_final"]
    return None if first is None else round(final - first, 12)


QUESTIONS = (
    Question(
        "lowest mismatch",
        "gen_kl_error, mean over the logged steps (lower is better)",
        lower_is_better=True,
        value=summarized("kl_mean"),
        missing="no arm logged train/gen_kl_error",
        zero="exactly 0",
    ),
    Question(
        "best final val/accuracy",
        "val/accuracy at the arm's last validation (higher is better)",
        lower_is_better=False,
        value=summarized("val_accuracy_final"),
        missing="no arm logged val/accuracy (validation runs with rl.val_every > 0)",
    ),
    Question(
        "fastest step",
        "seconds a step: generation + scoring + update + refit, mean over the steps",
        lower_is_better=True,
        value=step_time,
        missing="no arm logged timing/gen_s",
    ),
)


@dataclass
class Verdict:
    ranked: list[tuple[float, list[str]]]  # (value, arm names with it), best first
    counted: int  # arms with a value


def questions(arms: Arms) -> tuple[Question, ...]:
    """The report's questions for these arms: the accuracy one by gain when they started apart."""
    starts = {summary(r)["val_accuracy_first"] for r in arms.runs} - {None}
    if len(starts) < 2:
        return QUESTIONS
    gain = Question(
        "largest val/accuracy gain",
        "val/accuracy at the arm's last validation minus its first (higher is better): the "
        f"arms started apart ({fmt(min(starts))} to {fmt(max(starts))}), so their final "
        "values do not compare",
        lower_is_better=False,
        value=accuracy_gain,
        missing=QUESTIONS[1].missing,
    )
    return (QUESTIONS[0], gain, QUESTIONS[2])


def verdict(question: Question, arms: Arms) -> Verdict:
    values: dict[float, list[str]] = {}
    for run in arms.runs:
        v = question.value(run)
        if isinstance(v, int | float) and math.isfinite(v):
            values.setdefault(v, []).append(arms.name(run))
    ranked = sorted(values.items(), key=lambda kv: kv[0] if question.lower_is_better else -kv[0])
    return Verdict(ranked, sum(len(names) for names in values.values()))


def _who(names: list[str], arms: list[str]) -> str:
    """One arm's name, or the tie: by name, or by the arms outside it when it holds most."""
    if len(names) == 1:
        return names[0]
    if len(names) == len(arms):
        return f"tie: all {len(arms)} arms"
    if len(names) > len(arms) / 2:
        rest = ", ".join(a for a in arms if a not in names)
        return f"tie: {len(names)} arms, all but {rest}"
    return "tie: " + ", ".join(names)


def _value(question: Question, value: float) -> Cell:
    return Cell(question.zero if value == 0.0 else fmt(value), value)


def winners_table(arms: Arms) -> Table:
    table = Table("Winners", ["question", "winner", "value", "next best", "measured as"])
    total = len(arms.runs)
    every = [arms.name(r) for r in arms.runs]
    for question in questions(arms):
        v = verdict(question, arms)
        if not v.ranked:
            table.rows.append([Cell(question.title), Cell(f"no data: {question.missing}")])
            table.rows[-1] += [Cell(""), Cell(""), Cell(question.measured)]
            continue
        best, names = v.ranked[0]
        following = ""
        if len(v.ranked) > 1:
            value, others = v.ranked[1]
            following = f"{_who(others, every)} ({_value(question, value).text})"
        measured = question.measured
        if v.counted < total:
            measured += f"; {v.counted} of {total} arms logged it"
        row = [Cell(question.title), Cell(_who(names, every)), _value(question, best)]
        table.rows.append(row + [Cell(following), Cell(measured)])
    table.note = "Computed from each arm's metrics.jsonl; arms with the best value tie."
    return table


def _said(value: str) -> str:
    return {"True": "on", "False": "off"}.get(value, value)


def compared(arms: Arms) -> str:
    """What was compared, in words: the arms, the axes they differ in (with their values)
    and the settings they share."""
    runs = arms.runs
    if len(runs) < 2:
        return "One arm: nothing compared." if runs else "No run logged a step: nothing compared."
    parts = []
    for axis in sweep_axes(runs):
        values = sorted(
            {axis_value(r, axis) for r in runs} - {""}, key=lambda v: value_order(axis, v)
        )
        parts.append(f"{AXIS_WORDS.get(axis, axis)} ({', '.join(map(_said, values))})")
    text = (
        f"{len(runs)} arms that differ in " + "; ".join(parts)
        if parts
        else (f"{len(runs)} arms with the same config")
    )
    same = common_settings(runs)
    if same:
        text += ". The same in every arm: " + ", ".join(
            f"{AXIS_WORDS.get(k, short(k))} {_said(v)}" for k, v in same.items()
        )
    return text + "."


def _swatch(style: Style) -> str:
    """A short line in the arm's colour and dash, as its curves are drawn."""
    dasharray = SVG_DASHES.get(style.dash)
    dash = f" stroke-dasharray='{dasharray}'" if dasharray else ""
    return (
        "<svg width='26' height='10' aria-hidden='true'><line x1='0' y1='5' x2='26' y2='5' "
        f"stroke='{style.color}' stroke-width='3'{dash}/></svg>"
    )


def summary_html(arms: Arms) -> str:
    """The sentence of what was compared and the arms by name, each with its line's style."""
    items = "".join(
        f"<span class='arm'>{_swatch(arms.style(r))} {html.escape(arms.name(r))}</span>"
        for r in arms.runs
    )
    arm_list = f"<p id='arms'><b>Arms</b> (as drawn in every plot): {items}</p>" if items else ""
    return f"<p id='compared'><b>Compared:</b> {html.escape(compared(arms))}</p>{arm_list}"


def summary_markdown(arms: Arms) -> str:
    lines = [f"**Compared:** {md_escape(compared(arms))}"]
    if arms.runs:
        lines.append("**Arms:** " + ", ".join(md_escape(arms.name(r)) for r in arms.runs))
    return "\n\n".join(lines)
