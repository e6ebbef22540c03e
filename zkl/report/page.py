"""The static HTML page: plotly figures (their JavaScript inlined, so it opens offline) and tables.

gen_kl_error spans many decades and is often exactly 0, which a log axis cannot show. Every
figure here has two panels on one x axis: a log-scale panel for the positive values and,
below it, a strip labelled "exactly 0" where each series' zero points sit on their own row.
No value is ever dropped.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path

import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.offline import get_plotlyjs
from plotly.subplots import make_subplots

from zkl.report import treatments
from zkl.report.axes import labels, sweep_axes
from zkl.report.runs import KL, Run, Sources
from zkl.report.tables import Table, ablation, all_tables, all_zero, ordered

PALETTE = qualitative.Dark24
STYLE = """
body { font-family: system-ui, sans-serif; margin: 24px; color: #222; }
table { border-collapse: collapse; margin: 8px 0 4px; font-size: 13px; display: block;
        max-width: 100%; overflow-x: auto; }
th, td { border: 1px solid #ccc; padding: 3px 6px; text-align: left; white-space: nowrap; }
th, td.wrap { white-space: normal; }
td.wrap { min-width: 10em; }
th { background: #f2f2f2; }
td[data-value] { text-align: right; font-variant-numeric: tabular-nums; }
.note { color: #555; font-size: 13px; margin: 2px 0 16px; }
.zero { font-size: 15px; padding: 8px 12px; background: #eef7ee; border-left: 4px solid #2a2; }
th:first-child, td:first-child { position: sticky; left: 0; background: #fff; z-index: 1;
        box-shadow: 1px 0 0 #ccc; }
th:first-child { background: #f2f2f2; }
"""

Series = tuple[str, Sequence, Sequence[float]]  # (name, x values, y values)


def zero_band_figure(
    title: str, series: list[Series], x_title: str, y_title: str, mode: str = "lines+markers"
) -> go.Figure:
    """Positive values on a log axis; exact zeros on their own row in an "exactly 0" strip."""
    rows = max(len(series), 1)
    band = min(0.45, 0.06 + 0.025 * rows)
    fig = make_subplots(
        rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.03, row_heights=[1 - band, band]
    )
    positive_seen = False
    for i, (name, xs, ys) in enumerate(series):
        color = PALETTE[i % len(PALETTE)]
        top = [y if (isinstance(y, float | int) and y > 0) else None for y in ys]
        positive_seen |= any(y is not None for y in top)
        zero_x = [x for x, y in zip(xs, ys) if y == 0]
        fig.add_trace(
            go.Scatter(
                x=list(xs),
                y=top,
                name=html.escape(name),  # plotly renders HTML in names: shown as text
                legendgroup=name,
                mode=mode,
                line={"color": color},
                marker={"size": 6},
                connectgaps=False,
                hovertemplate=f"{html.escape(name)}<br>%{{x}}: %{{y:.3g}}<extra></extra>",
            ),
            row=1,
            col=1,
        )
        fig.add_trace(
            go.Scatter(
                x=zero_x,
                y=[i] * len(zero_x),
                name=html.escape(name),
                legendgroup=name,
                showlegend=False,
                mode="markers",
                marker={"color": color, "size": 7, "symbol": "square"},
                hovertemplate=f"{html.escape(name)}<br>%{{x}}: exactly 0<extra></extra>",
            ),
            row=2,
            col=1,
        )
    fig.update_yaxes(type="log", title_text=y_title, exponentformat="power", row=1, col=1)
    if not positive_seen:  # an empty log axis still needs a sensible range
        fig.update_yaxes(range=[-12, -2], row=1, col=1)
    fig.update_yaxes(
        range=[-0.7, rows - 0.3],
        tickvals=[(rows - 1) / 2],
        ticktext=["exactly 0"],
        showgrid=False,
        zeroline=False,
        row=2,
        col=1,
    )
    fig.update_xaxes(title_text=x_title, row=2, col=1)
    xs_all = [x for _, xs, _ in series for x in xs]
    if all(isinstance(x, int) for x in xs_all):  # whole steps: no tick at step 0.2
        fig.update_xaxes(dtick=max(1, (max(xs_all, default=0) - min(xs_all, default=0)) // 10))
    else:  # names (the ablation's fixes), in the order given, on both panels
        order = list(dict.fromkeys(xs_all))
        fig.update_xaxes(type="category", categoryorder="array", categoryarray=order)
    legend, legend_px = _legend([name for name, _, _ in series], plot_px=320 + 14 * rows)
    fig.update_layout(
        title=title,
        height=420 + 14 * rows + legend_px,
        template="plotly_white",
        legend=legend,
        margin={"l": 70, "r": 20, "t": 50, "b": 50 + legend_px},
    )
    return fig


# The legend goes below the plot in columns as wide as its longest label, so 30 runs never
# squeeze the plot or hide behind a scroll bar; the columns are counted for a 1,400-px page.
PLOT_PX, CHAR_PX, SYMBOL_PX = 1260, 7, 50


def _legend(names: list[str], plot_px: int) -> tuple[dict, int]:
    """The legend's layout below the plot, and the pixels it takes."""
    entry = min(PLOT_PX, SYMBOL_PX + CHAR_PX * max((len(n) for n in names), default=1))
    columns = max(1, PLOT_PX // entry)
    legend = {
        "font": {"size": 11},
        "orientation": "h",
        "entrywidth": entry,
        "yanchor": "top",
        "y": -60 / plot_px,  # paper units: just below the x axis title
        "xanchor": "left",
        "x": 0,
    }
    return legend, 20 * -(-len(names) // columns) + 40


def _plotted(sources: Sources, key: str) -> tuple[list[Run], dict[str, str]]:
    """The runs with a `key` value to plot, in table order, and their legend labels."""
    axes = sweep_axes(sources.runs)
    runs = ordered([r for r in sources.runs if r.series(key)], axes)
    return runs, labels(sources.runs, axes)


def kl_figure(sources: Sources) -> go.Figure:
    runs, names = _plotted(sources, KL)
    series = []
    for r in runs:
        points = r.points(KL)
        series.append((names[r.name], [x for x, _ in points], [y for _, y in points]))
    return zero_band_figure("gen_kl_error per step, every run", series, "step", "gen_kl_error")


def line_figure(sources: Sources, key: str, title: str, y_range=None) -> go.Figure | None:
    """`key` per step on a linear axis for every run that logged it (None: no run did)."""
    runs, names = _plotted(sources, key)
    if not runs:
        return None
    fig = go.Figure()
    for i, r in enumerate(runs):
        xs, ys = zip(*r.points(key))
        name = html.escape(names[r.name])
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=ys,
                mode="lines+markers",
                name=name,
                line={"color": PALETTE[i % len(PALETTE)]},
                hovertemplate=f"{name}<br>%{{x}}: %{{y:.4g}}<extra></extra>",
            )
        )
    legend, legend_px = _legend([names[r.name] for r in runs], plot_px=280)
    steps = [x for r in runs for x, _ in r.points(key)]
    fig.update_layout(
        title=title,
        xaxis={"title": "step", "dtick": max(1, (max(steps) - min(steps)) // 10)},
        yaxis={"title": key, **({"range": y_range} if y_range else {})},
        height=380 + legend_px,
        template="plotly_white",
        legend=legend,
        margin={"l": 70, "r": 20, "t": 50, "b": 50 + legend_px},
    )
    return fig


def reward_figure(sources: Sources) -> go.Figure | None:
    return line_figure(sources, "reward/mean", "reward/mean per step, every run")


def val_figure(sources: Sources) -> go.Figure | None:
    """val/accuracy at the steps each run validated (rl.val_every), to read beside the KL."""
    return line_figure(
        sources,
        "val/accuracy",
        "val/accuracy (greedy, validation split) per step, every run",
        y_range=[-0.02, 1.02],
    )


def ablation_figure(data: dict[str, dict[str, float]]) -> go.Figure:
    series = [(group, list(values), list(values.values())) for group, values in data.items()]
    return zero_band_figure(
        "What each fix contributes: max gen_kl_error with that fix off",
        series,
        "fix turned off",
        "max gen_kl_error",
        mode="markers",
    )


def _figure_html(fig: go.Figure, div_id: str) -> str:
    return fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id)


def treatment_section(sources: Sources) -> list[str]:
    """The treatment comparison (zkl/report/treatments.py): its table and per-step figures."""
    runs = treatments.arms(sources)
    if not runs:
        return []
    parts = ["<h2>Treatments</h2>", treatments.treatment_table(runs).to_html("treatments")]
    for div, fig in treatments.figures(runs, zero_band_figure):
        parts.append(_figure_html(fig, div))
    return parts


def _table_html(table_id: str, table: Table) -> str:
    return f"<h2>{html.escape(table.title)}</h2>{table.to_html(table_id)}"


def render(sources: Sources, title: str, source_paths: list[str]) -> str:
    """The whole page as one HTML string; plotly's JavaScript is inlined once."""
    parts = [f"<h1>{html.escape(title)}</h1>"]
    listed = ", ".join(html.escape(p) for p in source_paths)
    parts.append(
        f"<p class='note'>{len(sources.runs)} runs from {listed}; metrics.jsonl is the source.</p>"
    )
    tables = all_tables(sources)
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
        parts.append(_figure_html(kl_figure(sources), "kl-per-step"))
    for div_id, fig in (
        ("reward-per-step", reward_figure(sources)),
        ("val-accuracy-per-step", val_figure(sources)),
    ):
        if fig is not None:
            parts.append(_figure_html(fig, div_id))
    parts += treatment_section(sources)
    data = ablation(sources.runs)
    for table_id, table in tables:
        if zero and table_id == "grid":
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
