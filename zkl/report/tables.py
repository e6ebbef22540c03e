"""The report's tables, built once and rendered both as HTML and as Markdown (a PR comment).

Each numeric cell keeps its exact value beside its printed form, so the HTML table can be
checked against the runs' files to the last bit (`data-value` holds `repr(value)`).
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, field
from typing import Any

from zkl.invariance import FIXES, label
from zkl.report.axes import axis_value, common_settings, headings, short, sweep_axes
from zkl.report.runs import Run, Sources, summary

# The mismatch first: on a narrow screen these stay in view beside the run's name.
MISMATCH_COLUMNS = [
    ("kl_final", "gen_kl_error final"),
    ("kl_mean", "gen_kl_error mean"),
    ("kl_max", "gen_kl_error max"),
    ("zero_steps", "steps exactly 0"),
]
RUN_COLUMNS = [
    ("steps", "steps"),
    ("max_abs_diff", "max |lp diff|"),
    ("bitwise_min", "min bitwise frac"),
    ("reward_final", "reward final"),
    ("val_accuracy_final", "val/accuracy final"),
]


_BREAK_AFTER = re.compile(r"([,/.+])")
_HEADER_BREAK_AFTER = re.compile(r"([,/._])")
LONG = 24  # a cell of more characters may wrap; a shorter one (a name, a number) never does
_MD_SPECIAL = re.compile(r"([\\`*_\[\]|~])")


def md_escape(text: str) -> str:
    """A Markdown table cell that shows its text as written: no HTML, links or emphasis."""
    text = html.escape(" ".join(str(text).split()), quote=False)
    return _MD_SPECIAL.sub(r"\\\1", text)


def fmt(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return "0" if value == 0.0 else f"{value:.4g}"
    return str(value)


@dataclass
class Cell:
    text: str
    value: Any = None  # the exact number behind `text`, when there is one


def cell(value: Any) -> Cell:
    return Cell(fmt(value), value if isinstance(value, int | float) else None)


@dataclass
class Table:
    title: str
    headers: list[str]
    rows: list[list[Cell]] = field(default_factory=list)
    note: str = ""

    def to_html(self, table_id: str) -> str:
        head = "".join(f"<th>{_breakable(h, _HEADER_BREAK_AFTER)}</th>" for h in self.headers)
        body = []
        for row in self.rows:
            cells = []
            for c in row:
                attr = f' data-value="{c.value!r}"' if c.value is not None else ""
                if c.value is None and len(c.text) > LONG:
                    attr, text = " class='wrap'", _breakable(c.text)
                else:
                    text = html.escape(c.text)
                cells.append(f"<td{attr}>{text}</td>")
            body.append("<tr>" + "".join(cells) + "</tr>")
        note = f"<p class='note'>{html.escape(self.note)}</p>" if self.note else ""
        return (
            f"<table id='{table_id}'><thead><tr>{head}</tr></thead>"
            f"<tbody>{''.join(body)}</tbody></table>{note}"
        )

    def to_markdown(self) -> str:
        esc = md_escape

        lines = [f"### {self.title}", ""]
        lines.append("| " + " | ".join(map(esc, self.headers)) + " |")
        lines.append("|" + "---|" * len(self.headers))
        lines += ["| " + " | ".join(esc(c.text) for c in row) + " |" for row in self.rows]
        if self.note:
            lines += ["", md_escape(self.note)]
        return "\n".join(lines)


def _breakable(text: str, after: re.Pattern = _BREAK_AFTER) -> str:
    """Escaped text that may wrap after `,` `/` `.` `+` (a header also after `_`): a long name
    never widens a column."""
    return after.sub(r"\1<wbr>", html.escape(text))


def value_order(axis: str, value: str) -> tuple[int, str]:
    """An axis value's place: sorted, the fixes' baseline (all on) first."""
    return (0 if axis == "fixes" and value == label(FIXES) else 1, value)


def _sort_value(run: Run, axis: str) -> tuple[int, str]:
    return value_order(axis, axis_value(run, axis))


def ordered(runs: list[Run], axes: list[str]) -> list[Run]:
    """Runs grouped by the sweep's axes (sorted by their values, all fixes on first)."""
    return sorted(runs, key=lambda r: ([_sort_value(r, a) for a in axes], r.name))


def runs_table(runs: list[Run]) -> Table:
    axes = sweep_axes(runs)
    summaries = {r.name: summary(r) for r in runs}
    shown = [c for c in RUN_COLUMNS if any(s[c[0]] is not None for s in summaries.values())]
    headers = ["run", *(title for _, title in MISMATCH_COLUMNS), *headings(axes), "status"]
    headers += [title for _, title in shown]
    table = Table("Runs", headers)
    for run in ordered(runs, axes):
        s = summaries[run.name]
        row = [Cell(run.name), *(cell(s[key]) for key, _ in MISMATCH_COLUMNS)]
        row += [*(Cell(axis_value(run, a)) for a in axes), Cell(run.status)]
        row += [cell(s[key]) for key, _ in shown]
        table.rows.append(row)
    zero = sum(1 for r in runs if r.rows and not r.damage and summaries[r.name]["kl_max"] == 0.0)
    table.note = f"{zero} of {len(runs)} runs have gen_kl_error exactly 0 at every step."
    if any(r.status != "complete" for r in runs):
        table.note += " Why a run failed or is incomplete: the table of those runs below."
    return table


def all_zero(runs: list[Run]) -> bool:
    """Every logged gen_kl_error of every run is exactly 0 (and some run logged one)."""
    series = [r.series() for r in runs if r.rows]
    return any(series) and all(v == 0.0 for kl in series for v in kl)


def column_axis(axes: list[str]) -> str | None:
    """The grid's column: the fixes when they vary (the contrast they make), else the last."""
    if not axes:
        return None
    return "fixes" if "fixes" in axes else axes[-1]


def grid_table(runs: list[Run]) -> Table | None:
    """Each run's max gen_kl_error laid out by axis: "exactly 0" where every step was 0.

    Rows are the beds (the values of every axis but one), columns the last axis (the fixes
    when they vary), so a sweep that is exactly 0 throughout reads as a grid of "exactly 0"
    and a contrast (zero mode off) sits beside it.
    """
    runs = [r for r in runs if r.config]  # a run without one has no place on the axes
    axes = sweep_axes(runs)
    across = column_axis(axes)
    if across is None:
        return None
    down = [a for a in axes if a != across]
    columns = sorted({axis_value(r, across) for r in runs}, key=lambda v: value_order(across, v))
    beds: dict[tuple[str, ...], dict[str, list[Run]]] = {}
    for r in ordered(runs, down):
        bed = tuple(axis_value(r, a) for a in down)
        beds.setdefault(bed, {}).setdefault(axis_value(r, across), []).append(r)
    headers = [*(short(a) for a in down), *(f"{short(across)}: {c or '(none)'}" for c in columns)]
    table = Table("gen_kl_error max, bed by axis", headers)
    for bed, by_value in beds.items():
        table.rows.append([*map(Cell, bed), *(_grid_cell(by_value.get(c, [])) for c in columns)])
    table.note = (
        '"exactly 0": every logged step of that run had gen_kl_error == 0.0 (bitwise-equal '
        "logprobs); a number is the run's largest gen_kl_error; several runs in a cell are "
        "joined by ';'."
    )
    return table


def _grid_cell(runs: list[Run]) -> Cell:
    texts, values = [], []
    for r in runs:
        s = summary(r)
        if not r.rows or s["kl_max"] is None:
            texts.append(r.status)
        elif s["kl_max"] == 0.0:
            texts.append(f"exactly 0 ({s['steps']} steps)")
            values.append(0.0)
        else:
            texts.append(fmt(s["kl_max"]))
            values.append(s["kl_max"])
    value = values[0] if len(values) == 1 and len(runs) == 1 else None
    return Cell("; ".join(texts), value)


def failed_table(runs: list[Run]) -> Table | None:
    bad = [r for r in runs if r.status != "complete"]
    if not bad:
        return None
    table = Table("Failed or incomplete runs", ["run", "status", "steps logged", "error"])
    for r in bad:
        error = r.reason or "no error recorded (killed or still running: see the launcher's logs)"
        table.rows.append([Cell(r.name), Cell(r.status), cell(len(r.rows)), Cell(error)])
    return table


def settings_table(runs: list[Run]) -> Table | None:
    """The settings every run shares: what the page is about, said once."""
    common = common_settings(runs)
    if not common:
        return None
    table = Table("Settings common to all runs", ["setting", "value"])
    table.rows = [[Cell(key), Cell(value)] for key, value in common.items()]
    return table


def skipped_table(sources: Sources) -> Table | None:
    if not sources.skipped:
        return None
    table = Table("Not reported", ["path", "why"])
    table.rows = [[Cell(path), Cell(why)] for path, why in sources.skipped]
    return table


def ablation(runs: list[Run]) -> dict[str, dict[str, float]] | None:
    """{group: {fix off ('none' for all fixes on): max gen_kl_error}} when the runs ablate fixes."""
    single = {label(FIXES): "none"}
    single |= {label(set(FIXES) - {name}): name for name in FIXES}
    runs = [r for r in runs if r.fixes in single and r.rows]
    if len({r.fixes for r in runs}) < 2:
        return None
    others = [a for a in sweep_axes(runs) if a != "fixes"]
    out: dict[str, dict[str, float]] = {}
    for r in ordered(runs, others):
        group = ", ".join(f"{a}={axis_value(r, a)}" for a in others) or "all runs"
        out.setdefault(group, {})[single[r.fixes]] = summary(r)["kl_max"]
    out = {group: values for group, values in out.items() if len(values) > 1}
    return out or None


def ablation_table(data: dict[str, dict[str, float]]) -> Table:
    groups = list(data)
    fixes = [f for f in ["none", *FIXES] if any(f in d for d in data.values())]
    table = Table("Fix ablation: max gen_kl_error with one fix off", ["fix off", *groups])
    for fix in fixes:
        table.rows.append([Cell(fix), *(cell(data[g].get(fix)) for g in groups)])
    table.note = "A fix whose row is exactly 0 has no effect on this bed on this machine."
    return table


def bench_table(bench: list[tuple[str, dict[str, Any]]]) -> Table | None:
    if not bench:
        return None
    keys = [
        ("threads", "threads"),
        ("zero/gen_tokens_per_s", "gen tok/s zero"),
        ("default/gen_tokens_per_s", "gen tok/s default"),
        ("ratio/gen_zero_over_default", "gen zero/default"),
        ("zero/score_tokens_per_s", "score tok/s zero"),
        ("default/score_tokens_per_s", "score tok/s default"),
        ("ratio/score_zero_over_default", "score zero/default"),
    ]
    table = Table("Throughput (python -m zkl.bench)", ["run", *(t for _, t in keys)])
    for name, result in bench:
        table.rows.append([Cell(name), *(cell(result.get(k)) for k, _ in keys)])
    return table


def cert_table(cert: list[tuple[str, list[dict[str, Any]]]]) -> Table | None:
    if not cert:
        return None
    headers = ["run", "bed", "variant", "mode", "steps", "tokens", "max |lp diff|"]
    table = Table("Certification (python -m zkl.cert)", [*headers, "gen_kl_error", "result"])
    for name, results in cert:
        for r in results:
            row = [Cell(name), Cell(str(r["bed"])), Cell(str(r["variant"])), Cell(str(r["mode"]))]
            row += [cell(r["steps"]), cell(r["tokens"]), cell(r["train/max_abs_logprob_diff"])]
            verdict = r.get("result") or ("PASS" if r.get("passed") else "FAIL")
            row += [cell(r.get("train/gen_kl_error")), Cell(str(verdict))]
            table.rows.append(row)
    return table
