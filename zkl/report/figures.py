"""The report's plotly figures: a curve per arm, drawn in the arm's style (zkl/report/style.py).

gen_kl_error spans many decades and is often exactly 0, which a log axis cannot show. A
zero-band figure has two panels on one x axis: a log-scale panel for the positive values
and, below it, a strip labelled "exactly 0" where each curve's zero points sit on their own
row. A signed quantity (chi2 is E[rho^2] - 1, below 0 at many steps) has no place on a log
axis: a zero-band figure given any negative value is drawn on a linear axis instead, so no
value is ever dropped. Curves with equal values are named in the figure's title and drawn
one inside the other (the lower ones wider), so each of them stays in sight.
"""

from __future__ import annotations

import html
import math
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from zkl.report.style import Style

TITLE_CHARS = 190  # a line of the title's small print across a 1,400-px page
NEST = 3.0  # px between equal curves drawn one inside the other


@dataclass
class Curve:
    name: str
    xs: Sequence
    ys: Sequence[float]
    style: Style


def _number(y) -> bool:
    return isinstance(y, float | int) and not isinstance(y, bool) and math.isfinite(y)


def signed(curves: list[Curve]) -> bool:
    """Some curve has a value below 0."""
    return any(_number(y) and y < 0 for c in curves for y in c.ys)


def _equal(curves: list[Curve]) -> list[list[int]]:
    """The indices of the curves whose (x, y) values are equal, in groups of two or more."""
    groups: dict[tuple, list[int]] = {}
    for i, c in enumerate(curves):
        if c.xs:
            groups.setdefault((tuple(c.xs), tuple(c.ys)), []).append(i)
    return [group for group in groups.values() if len(group) > 1]


def same_curves(curves: list[Curve]) -> list[list[str]]:
    """The names of the curves whose values are equal, in groups of two or more."""
    return [[curves[i].name for i in group] for group in _equal(curves)]


def _nesting(curves: list[Curve]) -> list[float]:
    """Each curve's extra width: of k equal curves the first drawn (lowest) is the widest,
    each next one NEST px narrower (less for many), so each shows as a rim around the next."""
    extra = [0.0] * len(curves)
    for group in _equal(curves):
        step = min(NEST, 12 / (len(group) - 1))
        for j, i in enumerate(group):
            extra[i] = step * (len(group) - 1 - j)
    return extra


def _title(title: str, curves: list[Curve]) -> tuple[str, int]:
    """The title, with the groups of equal curves named below it; and its lines."""
    same = [" = ".join(names) for names in same_curves(curves)]
    if not same:
        return title, 1
    lines = textwrap.wrap(
        "equal values, drawn one inside the other: " + "; ".join(same), TITLE_CHARS
    )
    said = "<br>".join(f"<sup>{html.escape(line)}</sup>" for line in lines)
    return f"{title}<br>{said}", 1 + len(lines)


def _hover(name: str, value: str = "%{y:.4g}") -> str:
    return f"{html.escape(name)}<br>%{{x}}: {value}<extra></extra>"


def _x_axis(fig: go.Figure, curves: list[Curve]) -> None:
    xs_all = [x for c in curves for x in c.xs]
    if all(isinstance(x, int) for x in xs_all):  # whole steps: no tick at step 0.2
        fig.update_xaxes(dtick=max(1, (max(xs_all, default=0) - min(xs_all, default=0)) // 10))
    else:  # names (the ablation's fixes), in the order given, on every panel
        order = list(dict.fromkeys(xs_all))
        fig.update_xaxes(type="category", categoryorder="array", categoryarray=order)


def zero_band_figure(
    title: str, curves: list[Curve], x_title: str, y_title: str, mode: str = "lines+markers"
) -> go.Figure:
    """Positive values on a log axis; exact zeros on their own row in an "exactly 0" strip
    (a linear axis where some value is negative)."""
    if signed(curves):
        return line_figure(title, curves, x_title, y_title, mode=mode)
    rows = max(len(curves), 1)
    band = min(0.45, 0.06 + 0.025 * rows)
    fig = make_subplots(
        rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.03, row_heights=[1 - band, band]
    )
    positive_seen = False
    for i, (c, wider) in enumerate(zip(curves, _nesting(curves))):
        top = [y if (_number(y) and y > 0) else None for y in c.ys]
        positive_seen |= any(y is not None for y in top)
        zero_x = [x for x, y in zip(c.xs, c.ys) if y == 0]
        name = html.escape(c.name)  # plotly renders HTML in names: shown as text
        fig.add_trace(
            go.Scatter(
                x=list(c.xs),
                y=top,
                name=name,
                legendgroup=name,
                mode=mode,
                line=c.style.line(wider),
                marker=c.style.marker(wider),
                connectgaps=False,
                hovertemplate=_hover(c.name, "%{y:.3g}"),
            ),
            row=1,
            col=1,
        )
        fig.add_trace(
            go.Scatter(
                x=zero_x,
                y=[i] * len(zero_x),
                name=name,
                legendgroup=name,
                showlegend=False,
                mode="markers",
                marker=c.style.marker(),
                hovertemplate=_hover(c.name, "exactly 0"),
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
    _x_axis(fig, curves)
    legend, legend_px = _legend([c.name for c in curves], plot_px=320 + 14 * rows)
    text, lines = _title(title, curves)
    fig.update_layout(
        title=text,
        height=404 + 14 * rows + legend_px + 18 * lines,
        template="plotly_white",
        legend=legend,
        margin={"l": 70, "r": 20, "t": 34 + 18 * lines, "b": 50 + legend_px},
    )
    return fig


def line_figure(
    title: str,
    curves: list[Curve],
    x_title: str,
    y_title: str,
    y_range: list[float] | None = None,
    mode: str = "lines+markers",
) -> go.Figure:
    """Every value on a linear axis, 0 drawn as a line: rewards, accuracies, signed values."""
    fig = go.Figure()
    for c, wider in zip(curves, _nesting(curves)):
        fig.add_trace(
            go.Scatter(
                x=list(c.xs),
                y=list(c.ys),
                mode=mode,
                name=html.escape(c.name),
                line=c.style.line(wider),
                marker=c.style.marker(wider),
                hovertemplate=_hover(c.name),
            ),
        )
    legend, legend_px = _legend([c.name for c in curves], plot_px=280)
    text, lines = _title(title, curves)
    fig.update_layout(
        title=text,
        xaxis={"title": x_title},
        yaxis={
            "title": y_title,
            "zeroline": True,
            "zerolinecolor": "#888",
            **({"range": y_range} if y_range else {}),
        },
        height=364 + legend_px + 18 * lines,
        template="plotly_white",
        legend=legend,
        margin={"l": 70, "r": 20, "t": 34 + 18 * lines, "b": 50 + legend_px},
    )
    _x_axis(fig, curves)
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
        "itemsizing": "constant",  # a nested (widened) curve's marker keeps the legend's size
        "orientation": "h",
        "entrywidth": entry,
        "yanchor": "top",
        "y": -60 / plot_px,  # paper units: just below the x axis title
        "xanchor": "left",
        "x": 0,
    }
    return legend, 20 * -(-len(names) // columns) + 40
