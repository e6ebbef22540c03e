"""The report's opening on a real treatments sweep: what was compared in words, the arms by
name, the winner of each question computed from the runs' files (ties said as ties, a
question without data said so), report.md with every table of the page, legends by arm
name, a colour per arm, equal curves in sight and signed diagnostics on a linear axis.

tests/testdata/treatments_sweep is `sweeps/mismatch_treatments.yaml` run small on a CPU, each
run's config.yaml and metrics.jsonl kept (12 arms, 4 steps, validation every 2 steps):
    python -m zkl.lab.warm_start warm_start/tiny_dense --steps 20 num_threads=1
    python -m zkl.lab.warm_start warm_start/tiny_moe model=tiny_moe --steps 20 num_threads=1
    python -m zkl -m --config-dir sweeps --config-name mismatch_treatments rl.steps=4 \
        rl.val_every=2 rl.val_prompts=8 rl.prompts_per_step=4 rl.samples_per_prompt=4 \
        tracking.wandb.mode=disabled
"""

from __future__ import annotations

import itertools
import json
import math
import os
import shutil
from pathlib import Path

import pytest
from headless import chromium, colour_counts, measure, needs_chromium, png_size
from html_tables import parse_tables

from zkl.report import page, treatments
from zkl.report.__main__ import main
from zkl.report.contents import all_tables
from zkl.report.figures import Curve, line_figure, zero_band_figure
from zkl.report.naming import arms_of
from zkl.report.runs import Sources, discover
from zkl.report.style import PALETTE, style
from zkl.report.summary import compared

DATA = Path(__file__).parents[1] / "testdata" / "treatments_sweep"
ARMS = {  # run directory -> the arm's name (the treatment, from the run's config)
    "0": "zero", "1": "default", "2": "default+token_tis", "3": "default+token_mis",
    "4": "default+seq_tis", "5": "default+seq_mis", "6": "default+geo_mis",
    "7": "default+icepop", "8": "fp16 default", "9": "fp16 zero", "10": "tiny_moe default",
    "11": "tiny_moe default+replay",
}  # fmt: skip
TIMING = ("timing/gen_s", "timing/score_s", "timing/update_s", "timing/refit_s")


@pytest.fixture
def sweep(tmp_path) -> Path:
    shutil.copytree(DATA, tmp_path / "sweep")
    return tmp_path / "sweep"


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _expected_winners(root: Path) -> dict[str, tuple[set[str], float]]:
    """Each question's best arms and value, read from the files without the report's code."""
    values: dict[str, dict[str, float]] = {"mismatch": {}, "accuracy": {}, "step": {}}
    for run_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        rows, name = _rows(run_dir), ARMS[run_dir.name]
        kl = [r["train/gen_kl_error"] for r in rows]
        values["mismatch"][name] = sum(kl) / len(kl)
        val = [r["val/accuracy"] for r in rows if "val/accuracy" in r]
        if val:
            values["accuracy"][name] = val[-1]
        values["step"][name] = sum(sum(r[k] for k in TIMING) for r in rows) / len(rows)
    out = {}
    for question, by_arm in values.items():
        if by_arm:
            best = (max if question == "accuracy" else min)(by_arm.values())
            out[question] = ({a for a, v in by_arm.items() if v == best}, best)
    return out


def _winners(root: Path) -> dict[str, dict[str, tuple[str, object]]]:
    assert main([str(root)]) == 0
    rows = parse_tables((root / "report.html").read_text())["winners"]
    return {r["question"][0]: r for r in rows}


def _named(cell: str, names: set[str]) -> bool:
    """The winner cell names exactly `names`: one arm, or a tie said as a tie."""
    if len(names) == 1:
        return cell == next(iter(names))
    if not cell.startswith("tie: "):
        return False
    if ", all but " in cell:
        rest = set(cell.split(", all but ")[1].split(", "))
        return set(ARMS.values()) - rest == names
    return set(cell.removeprefix("tie: ").split(", ")) == names


def test_every_arm_is_named_by_one_rule_in_the_summary_the_table_and_every_legend(sweep):
    sources = discover([sweep])
    arms = arms_of(sources.runs)
    assert arms.by_treatment and {r.name: arms.name(r) for r in arms.runs} == ARMS
    assert main([str(sweep)]) == 0
    html = (sweep / "report.html").read_text()
    table = parse_tables(html)["treatments"]
    assert {r["run"][0]: r["arm"][0] for r in table} == ARMS
    names = [arms.name(r) for r in arms.runs]
    assert [r["arm"][0] for r in table] == names  # the table in the arms' order
    for name in names:
        assert f"</svg> {name}</span>" in html  # the arms list, each with its line's style
    figures = [page.kl_figure(sources, arms), page.reward_figure(sources, arms)]
    figures += [page.val_figure(sources, arms)]
    figures += [fig for _, fig in treatments.figures(treatments.arms(sources, arms), arms)]
    assert len(figures) == 14  # kl, reward, val; val/reward, routes, 9 diagnostics
    for fig in figures:  # a legend entry per arm, by its name, in one colour across figures
        shown = [(t.name, t.line.color) for t in fig.data if t.showlegend is not False]
        expected = [(n, arms.style(r).color) for n, r in zip(names, arms.runs)]
        if fig.layout.title.text.startswith("routing/"):  # the MoE arms alone record routes
            expected = [e for e in expected if e[0].startswith("tiny_moe")]
        assert shown == expected, fig.layout.title.text


def test_compared_in_words(sweep):
    text = compared(arms_of(discover([sweep]).runs))
    assert text.startswith("12 arms that differ in model (tiny_dense, tiny_moe); ")
    for part in (
        "precision (bf16, fp16)",
        "off-policy correction (geo_mis, icepop, none, seq_mis, seq_tis, token_mis, token_tis)",
        "routing replay (off, on)",
        "fixes on (all_fixes, no_fixes)",
        "The same in every arm: ",
        "task add, steps 4, seed 0.",
    ):
        assert part in text, part


def test_winners_are_computed_and_ties_said(sweep):
    expected = _expected_winners(sweep)
    got = _winners(sweep)
    for question, key in (
        ("lowest mismatch", "mismatch"),
        ("best final val/accuracy", "accuracy"),
        ("fastest step", "step"),
    ):
        names, value = expected[key]
        assert _named(got[question]["winner"][0], names), (question, got[question])
        assert got[question]["value"][1] == value
    # What this sweep shows: zero mode's two arms tie at exactly 0, one arm trails on accuracy.
    assert got["lowest mismatch"]["winner"][0] == "tie: fp16 zero, zero"
    assert got["lowest mismatch"]["value"][0] == "exactly 0"
    assert got["best final val/accuracy"]["winner"][0] == "tie: 11 arms, all but default+geo_mis"
    shutil.rmtree(sweep / "9")  # without fp16 zero, zero alone has the lowest mismatch
    got = _winners(sweep)
    assert got["lowest mismatch"]["winner"][0] == "zero"
    assert got["lowest mismatch"]["next best"][0] == "fp16 default (4.478e-07)"


def _shift_accuracy(run_dir: Path, first: float, final: float) -> None:
    """The run's first validation set to `first` and every later one to `final`."""
    rows, seen = _rows(run_dir), False
    for row in rows:
        if "val/accuracy" in row:
            row["val/accuracy"], seen = (final if seen else first), True
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_arms_that_started_apart_are_judged_by_their_gain(sweep):
    """The tiny_moe arms start (and stay) at 0.625 while the dense ones start at 0.125: the
    best final accuracy would crown them for their start; the gain crowns `zero` (+0.25)."""
    for moe in ("10", "11"):
        _shift_accuracy(sweep / moe, 0.625, 0.625)
    _shift_accuracy(sweep / "0", 0.125, 0.375)
    got = _winners(sweep)
    assert "best final val/accuracy" not in got
    gain = got["largest val/accuracy gain"]
    assert gain["winner"][0] == "zero" and gain["value"][1] == 0.25
    assert "the arms started apart (0.125 to 0.625)" in gain["measured as"][0]
    for moe in ("10", "11"):  # the same arms starting where the others start: final compares
        _shift_accuracy(sweep / moe, 0.125, 0.625)
    got = _winners(sweep)
    assert got["best final val/accuracy"]["winner"][0] == "tie: tiny_moe default, " + (
        "tiny_moe default+replay"
    )


def test_a_question_without_data_says_so(sweep):
    for run_dir in sweep.iterdir():
        if run_dir.is_dir():
            rows = [
                {k: v for k, v in r.items() if not k.startswith("val/")} for r in _rows(run_dir)
            ]
            (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = _winners(sweep)
    winner = got["best final val/accuracy"]["winner"][0]
    assert winner.startswith("no data: no arm logged val/accuracy") and "rl.val_every" in winner
    assert got["best final val/accuracy"]["value"] == ("", None)
    assert got["lowest mismatch"]["winner"][0] == "tie: fp16 zero, zero"  # the others still


def test_report_md_carries_every_table_of_the_page(sweep):
    assert main([str(sweep)]) == 0
    html = (sweep / "report.html").read_text()
    md = (sweep / "report.md").read_text()
    tables = all_tables(discover([sweep]))
    assert set(parse_tables(html)) == {table_id for table_id, _ in tables}
    assert [i for i, _ in tables][:2] == ["winners", "treatments"]
    for _, table in tables:
        assert table.to_markdown() in md, table.title
    assert "**Compared:** 12 arms that differ in" in md
    assert "**Arms:** default, default+geo\\_mis, default+icepop" in md


def test_colours_are_unique_for_24_arms_and_far_apart(sweep, tmp_path):
    for run_dir in [p for p in sweep.iterdir() if p.is_dir()]:  # each arm again, seed 1
        again = sweep / f"{run_dir.name}b"
        shutil.copytree(run_dir, again)
        config = again / "config.yaml"
        config.write_text(config.read_text().replace("\nseed: 0\n", "\nseed: 1\n"))
    sources = discover([sweep])
    arms = arms_of(sources.runs)
    names = [arms.name(r) for r in arms.runs]
    assert len(names) == 24 and "zero seed=0" in names and "zero seed=1" in names
    colours = [t.line.color for t in page.reward_figure(sources, arms).data]
    assert len(set(colours)) == 24
    lab = [_lab(c) for c in PALETTE]
    assert min(math.dist(a, b) for a, b in itertools.combinations(lab, 2)) > 25  # CIE76 ΔE


def _lab(colour: str) -> tuple[float, float, float]:
    """CIELAB of an sRGB #RRGGBB (D65)."""
    rgb = [int(colour[i : i + 2], 16) / 255 for i in (1, 3, 5)]
    r, g, b = [((c + 0.055) / 1.055) ** 2.4 if c > 0.04045 else c / 12.92 for c in rgb]
    xyz = (
        (0.4124 * r + 0.3576 * g + 0.1805 * b) / 0.95047,
        0.2126 * r + 0.7152 * g + 0.0722 * b,
        (0.0193 * r + 0.1192 * g + 0.9505 * b) / 1.08883,
    )
    fx, fy, fz = [t ** (1 / 3) if t > 0.008856 else 7.787 * t + 16 / 116 for t in xyz]
    return 116 * fy - 16, 500 * (fx - fy), 200 * (fy - fz)


def test_equal_curves_are_named_and_drawn_apart(sweep):
    sources = discover([sweep])
    arms = arms_of(sources.runs)
    fig = page.kl_figure(sources, arms)
    equal = ["default+icepop", "default+token_mis", "default+token_tis"]  # the same values
    assert " = ".join(equal) in fig.layout.title.text
    top = {t.name: t for t in fig.data if t.showlegend is not False}
    drawn = [(top[n].line.dash, top[n].line.width, top[n].marker.symbol) for n in equal]
    assert len({d for d, _, _ in drawn}) == 3 and len({s for _, _, s in drawn}) == 3
    widths = [w for _, w, _ in drawn]
    assert widths == sorted(widths, reverse=True) and len(set(widths)) == 3  # nested
    assert top["default"].line.width < widths[0]  # a curve equal to no other is not widened


def test_signed_diagnostics_are_drawn_on_a_linear_axis_with_every_value(sweep):
    sources = discover([sweep])
    arms = arms_of(sources.runs)
    figs = dict(treatments.figures(treatments.arms(sources, arms), arms))
    for div, key in (
        ("treatment-rollout-corr-chi2-token", "rollout_corr/chi2_token"),
        ("treatment-rollout-corr-chi2-seq", "rollout_corr/chi2_seq"),
    ):
        fig = figs[div]
        assert fig.layout.yaxis.type in (None, "linear")
        by_name = {t.name: list(t.y) for t in fig.data}
        negative = 0
        for run in arms.runs:
            logged = run.series(key)
            assert by_name[arms.name(run)] == logged  # every value, negatives included
            negative += sum(v < 0 for v in logged)
        assert negative > 0  # the real sweep has chi2 below 0 at many steps
    # Any zero-band figure given a negative value draws it on a linear axis, never drops it.
    curves = [Curve("a", [0, 1, 2], [1e-6, 0.0, -2e-6], style(0))]
    assert zero_band_figure("t", curves, "step", "y").layout.yaxis.type in (None, "linear")
    assert list(zero_band_figure("t", curves, "step", "y").data[0].y) == [1e-6, 0.0, -2e-6]
    assert line_figure("t", curves, "step", "y").layout.yaxis.zeroline is True


FIRST_SCREEN = """
const box = e => { const r = e.getBoundingClientRect();
  return {x: r.x, y: r.y + scrollY, width: r.width, height: r.height,
          bottom: r.bottom + scrollY}; };
const byId = id => box(document.getElementById(id));
return {
  compared: byId('compared'), arms: byId('arms'), winners: byId('winners'),
  treatments: byId('treatments'),
  names: [...document.querySelectorAll('#arms .arm')].map(e => [e.textContent.trim(), box(e)]),
  winner_cells: [...document.querySelectorAll('#winners tbody tr')].map(
    tr => [tr.children[0].textContent, tr.children[1].textContent]),
  page_width: document.documentElement.scrollWidth,
};"""


@pytest.mark.slow
def test_the_first_screen_holds_the_summary_and_the_arm_names(sweep, tmp_path):
    """At 1400 x 900, before any scroll: what was compared, every arm by name in its colour,
    the winners and the Treatments table (the DOM's boxes, and the screenshot's pixels).

    Keep the screenshot with ZKL_KEEP_SCREENSHOT=path.png and look at it.
    """
    needs_chromium()
    assert main([str(sweep)]) == 0
    report = sweep / "report.html"
    found = measure(report, FIRST_SCREEN)
    assert found["page_width"] <= 1400
    for part in ("compared", "arms", "winners", "treatments"):
        assert found[part]["y"] > 0 and found[part]["bottom"] <= 900, (part, found[part])
    arms = arms_of(discover([sweep]).runs)
    assert [name for name, _ in found["names"]] == [arms.name(r) for r in arms.runs]
    for name, where in found["names"]:
        assert where["bottom"] <= 900 and where["x"] + where["width"] <= 1400, name
    questions = [q for q, _ in found["winner_cells"]]
    assert questions == ["lowest mismatch", "best final val/accuracy", "fastest step"]
    shot = tmp_path / "first.png"
    chromium("--window-size=1400,900", f"--screenshot={shot}", report.as_uri())
    assert png_size(shot)[:2] == (1400, 900)
    colours = [arms.style(r).color for r in arms.runs]
    box = {k: round(found["arms"][k]) for k in ("x", "y", "width", "height")}
    counts = colour_counts(shot, box, [*colours, *PALETTE[len(colours) :]])
    for colour in colours:  # each arm's line drawn beside its name, in the first screen
        assert counts[colour] >= 10, (colour, counts)
    for colour in PALETTE[len(colours) :]:  # and no other arm's colour there
        assert counts[colour] == 0, (colour, counts)
    if os.environ.get("ZKL_KEEP_SCREENSHOT"):
        shutil.copy(shot, os.environ["ZKL_KEEP_SCREENSHOT"])


@pytest.mark.slow
def test_equal_curves_stay_in_sight_in_the_browser(sweep, tmp_path):
    """The three equal gen_kl_error curves of the sweep, photographed: each arm's colour is on
    the plot; drawn as one (the same width, solid, the same marker), the lower ones vanish."""
    needs_chromium()
    equal = ["default+icepop", "default+token_mis", "default+token_tis"]
    keep = [r for r in discover([sweep]).runs if ARMS[r.name] in equal]
    only, arms = Sources(runs=keep), arms_of(keep)
    colours = [arms.style(r).color for r in arms.runs]

    def photographed(fig, name: str) -> dict[str, int]:
        fig.update_layout(showlegend=False, title_text="", width=1400, height=700)
        html = tmp_path / f"{name}.html"
        html.write_text(fig.to_html(include_plotlyjs=True, full_html=True))
        shot = tmp_path / f"{name}.png"
        chromium("--window-size=1400,700", f"--screenshot={shot}", html.as_uri())
        return colour_counts(shot, {"x": 0, "y": 0, "width": 1400, "height": 700}, colours)

    nested = photographed(page.kl_figure(only, arms), "nested")
    for colour in colours:
        assert nested[colour] >= 50, nested
    as_one = page.kl_figure(only, arms)
    as_one.update_traces(
        line={"width": 2.5, "dash": "solid"}, marker={"symbol": "circle", "size": 8}
    )
    hidden = photographed(as_one, "as_one")
    assert min(hidden[c] for c in colours[:-1]) < 10, hidden  # the check can fail
