"""How an arm is drawn: one colour, dash, width and marker per arm, the same in every figure.

The 24 colours are unique and far apart on a white page (the ten of D3, then the farthest
of plotly's qualitative palettes, chosen greedily by CIELAB distance: no two closer than
ΔE 27). Curves that cross or run close stay apart by their dash patterns and their open
markers of different shapes; curves that are equal are drawn nested (zkl/report/figures.py
widens the ones below), so every one of them stays in sight.
"""

from __future__ import annotations

from dataclasses import dataclass

PALETTE = (
    "#1F77B4", "#FF7F0E", "#2CA02C", "#D62728", "#9467BD", "#8C564B", "#E377C2", "#7F7F7F",
    "#BCBD22", "#17BECF", "#511CFB", "#FE00FA", "#620042", "#FC0080", "#A6761D", "#222A2A",
    "#1616A7", "#11A579", "#B10DA1", "#F8A19F", "#0D2A63", "#3283FE", "#6C7C32", "#E6AB02",
)  # fmt: skip
DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")
# each dash as an SVG stroke-dasharray (the arm list's swatches draw the plots' lines)
SVG_DASHES = {"dash": "6,3", "dot": "2,2", "dashdot": "6,2,2,2", "longdash": "10,3",
              "longdashdot": "10,2,2,2"}  # fmt: skip
WIDTH, MARKER = 2.5, 8  # a line's width and a marker's size, in px
SYMBOLS = (
    "circle-open", "square-open", "diamond-open", "triangle-up-open", "x-thin-open",
    "cross-open", "star-open", "hexagon-open", "triangle-down-open", "pentagon-open",
    "hourglass-open", "bowtie-open",
)  # fmt: skip


@dataclass(frozen=True)
class Style:
    color: str
    dash: str
    symbol: str

    def line(self, wider: float = 0.0) -> dict:
        return {"color": self.color, "dash": self.dash, "width": WIDTH + wider}

    def marker(self, wider: float = 0.0) -> dict:
        size = MARKER + 1.5 * wider
        return {"color": self.color, "symbol": self.symbol, "size": size, "line": {"width": 1.5}}


def style(index: int) -> Style:
    """The style of the arm at `index` in the report's arm order."""
    return Style(
        color=PALETTE[index % len(PALETTE)],
        dash=DASHES[index % len(DASHES)],
        symbol=SYMBOLS[index % len(SYMBOLS)],
    )
