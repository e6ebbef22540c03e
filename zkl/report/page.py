"""The static HTML page: plotly figures (their JavaScript inlined, so it opens offline) and tables.

The page opens with what a reader of a comparison asks first (zkl/report/summary.py): what
was compared, the arms by name in the style of their curves, the winner of each question,
and the Treatments table when the runs compare treatments. Then gen_kl_error, reward/mean and
val/accuracy per step for every arm, the treatments' diagnostics, and the other tables.
Every legend, table and sentence names an arm by the one rule of zkl/report/naming.py.
"""

from __future__ import annotations

import html
from pathlib import Path

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

from zkl.report import treatments
from zkl.report.contents import OPENING, all_tables
from zkl.report.figures import Curve, line_figure, zero_band_figure
from zkl.report.naming import Arms, arms_of
from zkl.report.runs import KL, Sources
from zkl.report.style import style
from zkl.report.summary import summary_html
from zkl.report.tables import Table, ablation, all_zero

STYLE = """
body { font-family: system-ui, sans-serif; margin: 24px; color: #222; }
h1 { margin: 0 0 4px; font-size: 26px; }
h2 { margin: 18px 0 4px; font-size: 19px; }
table { border-collapse: collapse; margin: 8px 0 4px; font-size: 13px; display: block;
        max-width: 100%; overflow-x: auto; }
th, td { border: 1px solid #ccc; padding: 3px 6px; text-align: left; white-space: nowrap; }
th, td.wrap { white-space: normal; }
td.wrap { min-width: 10em; }
th { background: #f2f2f2; }
td[data-value] { text-align: right; font-variant-numeric: tabular-nums; }
.note { color: #555; font-size: 13px; margin: 2px 0 10px; }
.zero { font-size: 15px; padding: 8px 12px; background: #eef7ee; border-left: 4px solid #2a2; }
#summary { font-size: 14px; }
#summary p { margin: 4px 0; }
.arm { display: inline-block; margin: 0 14px 2px 0; white-space: nowrap; }
th:first-child, td:first-child { position: sticky; left: 0; background: #fff; z-index: 1;
        box-shadow: 1px 0 0 #ccc; }
th:first-child { background: #f2f2f2; }
"""


def _curves(arms: Arms, key: str) -> list[Curve]:
    """`key` per step of every arm that logged it, in the arms' order and style."""
    out = []
    for run in arms.runs:
        points = run.points(key)
        if points:
            xs, ys = [x for x, _ in points], [y for _, y in points]
            out.append(Curve(arms.name(run), xs, ys, arms.style(run)))
    return out


def kl_figure(sources: Sources, arms: Arms | None = None) -> go.Figure:
    curves = _curves(arms or arms_of(sources.runs), KL)
    return zero_band_figure("gen_kl_error per step, every arm", curves, "step", "gen_kl_error")


def reward_figure(sources: Sources, arms: Arms | None = None) -> go.Figure | None:
    curves = _curves(arms or arms_of(sources.runs), "reward/mean")
    if not curves:
        return None
    return line_figure("reward/mean per step, every arm", curves, "step", "reward/mean")


def val_figure(sources: Sources, arms: Arms | None = None) -> go.Figure | None:
    """val/accuracy at the steps each run validated (rl.val_every), to read beside the KL."""
    curves = _curves(arms or arms_of(sources.runs), "val/accuracy")
    if not curves:
        return None
    title = "val/accuracy (greedy, validation split) per step, every arm"
    return line_figure(title, curves, "step", "val/accuracy", y_range=[-0.02, 1.02])


def ablation_figure(data: dict[str, dict[str, float]]) -> go.Figure:
    curves = [
        Curve(group, list(values), list(values.values()), style(i))
        for i, (group, values) in enumerate(data.items())
    ]
    return zero_band_figure(
        "What each fix contributes: max gen_kl_error with that fix off",
        curves,
        "fix turned off",
        "max gen_kl_error",
        mode="markers",
    )


def _figure_html(fig: go.Figure, div_id: str) -> str:
    return fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id)


def _table_html(table_id: str, table: Table) -> str:
    return f"<h2>{html.escape(table.title)}</h2>{table.to_html(table_id)}"


def _opening(sources: Sources, arms: Arms, tables: dict[str, Table]) -> list[str]:
    """The first screen: what was compared, the arms, the winners, the Treatments table."""
    if not sources.runs:
        return []
    parts = ["<section id='summary'>", summary_html(arms)]
    parts += [_table_html(i, tables[i]) for i in OPENING if i in tables]
    return [*parts, "</section>"]


def render(sources: Sources, title: str, source_paths: list[str]) -> str:
    """The whole page as one HTML string; plotly's JavaScript is inlined once."""
    parts = [f"<h1>{html.escape(title)}</h1>"]
    listed = ", ".join(html.escape(p) for p in source_paths)
    parts.append(
        f"<p class='note'>{len(sources.runs)} runs from {listed}; metrics.jsonl is the source.</p>"
    )
    arms = arms_of(sources.runs)
    tables = all_tables(sources, arms)
    parts += _opening(sources, arms, dict(tables))
    zero = all_zero(sources.runs)
    if zero:  # nothing to draw on a log axis: the grid of "exactly 0" leads instead
        steps = sum(len(r.series()) for r in sources.runs)
        parts.append(
            f"<p class='zero'>Every logged step of every run is exactly 0: gen_kl_error == 0.0 "
            f"at all {steps} steps, so a log-scale plot would be empty; the grid lays the runs "
            "out by axis.</p>"
        )
        parts += [_table_html(i, t) for i, t in tables if i == "grid"]
    elif any(r.series() for r in sources.runs):
        parts.append(_figure_html(kl_figure(sources, arms), "kl-per-step"))
    for div_id, fig in (
        ("reward-per-step", reward_figure(sources, arms)),
        ("val-accuracy-per-step", val_figure(sources, arms)),
    ):
        if fig is not None:
            parts.append(_figure_html(fig, div_id))
    treated = treatments.arms(sources, arms)
    if treated:
        parts.append("<h2>Treatment diagnostics</h2>")
        parts += [_figure_html(f, div) for div, f in treatments.figures(treated, arms)]
    data = ablation(sources.runs)
    for table_id, table in tables:
        if table_id in OPENING or (zero and table_id == "grid"):
            continue
        if table_id == "ablation" and data:
            parts.append(f"<h2>{html.escape(table.title)}</h2>")
            parts.append(_figure_html(ablation_figure(data), "ablation-chart"))
            parts.append(table.to_html(table_id))
        else:
            parts.append(_table_html(table_id, table))
    body = "\n".join(parts)
    return (
        "<!DOCTYPE html>\n<html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>{STYLE}</style>"
        f"<script>{get_plotlyjs()}</script></head>\n<body>\n{body}\n</body></html>\n"
    )


def write(path: str | Path, page: str) -> None:
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(page)
        tmp.replace(path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
