"""`python -m zkl.report`: tables that match the runs' files, zeros never dropped, offline page."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import zlib
from pathlib import Path

import pytest
from conftest import make_cfg
from html_tables import parse_tables
from omegaconf import OmegaConf

from zkl.errors import ConfigError
from zkl.report import page, wandb_report
from zkl.report.__main__ import main
from zkl.report.runs import discover, sweep_axes
from zkl.report.tables import ablation, md_escape
from zkl.tracking.errors import record_error
from zkl.tracking.run_log import RunLog

KL = "train/gen_kl_error"
BAD = "model.max_position_embeddings=128 is shorter than the 540 positions a prompt needs."


def _write_run(run_dir: Path, overrides: list[str], kls: list[float], steps: int = 3) -> None:
    log = RunLog(run_dir, make_cfg(f"rl.steps={steps}", *overrides))
    for step, kl in enumerate(kls):
        row = {
            KL: kl,
            "train/max_abs_logprob_diff": 10 * kl,
            "train/bitwise_equal_frac": 1.0 if kl == 0 else 0.25,
            "reward/mean": 0.1 * step,
        }
        log.log(step, row)
    log.close()


@pytest.fixture
def sweep(tmp_path) -> Path:
    """A sweep of every kind of run: zero, non-zero, an ablated fix, failed, cut short."""
    _write_run(tmp_path / "0", ["model=tiny_dense"], [0.0, 0.0, 0.0])
    _write_run(tmp_path / "1", ["model=tiny_moe"], [0.0, 1e-7, 0.0])
    _write_run(tmp_path / "2", ["model=tiny_moe", "fixes.logprob_path=false"], [3e-5, 5e-5, 4e-5])
    failed = tmp_path / "3"
    (failed / ".hydra").mkdir(parents=True)
    cfg = make_cfg("model=tiny_moe", "rl.steps=3", "sampling.max_new_tokens=500")
    OmegaConf.save(OmegaConf.structured(cfg), failed / ".hydra" / "config.yaml")
    record_error(failed, ConfigError(BAD))
    _write_run(tmp_path / "4", ["model=tiny_dense", "seed=1"], [2e-6])
    bench = {"threads": 2, "zero/gen_tokens_per_s": 900.0, "default/gen_tokens_per_s": 1000.0}
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "bench.json").write_text(json.dumps(bench))
    return tmp_path


def test_tables_match_the_runs_files(sweep):
    sources = discover([sweep])
    status = {r.name: r.status for r in sources.runs}
    assert status == {"0": "complete", "1": "complete", "2": "complete", "3": "failed"} | {
        "4": "incomplete"
    }
    assert sweep_axes(sources.runs) == ["model.name", "sampling.max_new_tokens", "seed", "fixes"]
    assert main([str(sweep)]) == 0
    tables = parse_tables((sweep / "report.html").read_text())
    rows = {row["run"][0]: row for row in tables["runs"]}
    assert set(rows) == {"0", "1", "2", "3", "4"}
    for name in ("0", "1", "2", "4"):
        kl = [json.loads(x)[KL] for x in (sweep / name / "metrics.jsonl").read_text().splitlines()]
        row = rows[name]
        assert row["gen_kl_error final"][1] == kl[-1]
        assert row["gen_kl_error mean"][1] == sum(kl) / len(kl)
        assert row["gen_kl_error max"][1] == max(kl)
        assert row["steps exactly 0"][1] == kl.count(0.0)
    assert rows["2"]["fixes"][0] == "minus_logprob_path" and rows["1"]["fixes"][0] == "all_fixes"
    assert rows["3"]["status"][0] == "failed" and rows["3"]["error"][0] == BAD
    assert [r["run"][0] for r in tables["failed"]] == ["3", "4"]
    assert tables["bench"][0]["gen tok/s zero"][1] == 900.0
    md = (sweep / "report.md").read_text()
    assert md_escape(BAD) in md and "### Runs" in md and "### Throughput" in md
    row = "| 2 | tiny\\_moe | 6 | 0 | minus\\_logprob\\_path | complete | 3 | 4e-05 | 4e-05 "
    row += "| 5e-05 |"
    assert row in md


def test_zero_band_keeps_every_zero(sweep):
    fig = page.kl_figure(discover([sweep]))
    traces = {}
    for trace in fig.data:
        traces.setdefault(trace.name, []).append(trace)
    assert sorted(traces) == ["0 tiny_dense/6/0/all_fixes", "1 tiny_moe/6/0/all_fixes"] + [
        "2 tiny_moe/6/0/minus_logprob_path",
        "4 tiny_dense/6/1/all_fixes",
    ]
    top, band = traces["1 tiny_moe/6/0/all_fixes"]
    assert list(band.x) == [0, 2] and list(top.y) == [None, 1e-7, None]
    assert fig.layout.yaxis.type == "log"
    assert list(fig.layout.yaxis2.ticktext) == ["exactly 0"]
    for name, (top, band) in traces.items():  # every value lands in exactly one panel
        assert sum(y is not None for y in top.y) + len(band.x) == len(top.x), name


def test_ablation_chart(sweep):
    data = ablation(discover([sweep]).runs)
    group = "model.name=tiny_moe, seed=0"
    assert data == {group: {"none": 1e-7, "logprob_path": 5e-5}}
    fig = page.ablation_figure(data)
    assert list(fig.data[0].x) == ["none", "logprob_path"]


def test_page_opens_offline(sweep, tmp_path):
    out = tmp_path / "elsewhere.html"
    assert main([str(sweep / "0"), str(sweep / "2"), "--out", str(out)]) == 0
    html = out.read_text()
    assert not re.search(r"<script[^>]+src=", html)  # no script fetched from anywhere
    assert html.count("Plotly.newPlot(") == 1 and "plotly.js v" in html
    names = [r["run"][0] for r in parse_tables(html)["runs"]]
    assert sorted(names) == ["0", "2"] or sorted(names) == sorted(
        [f"{sweep.name}/0", f"{sweep.name}/2"]
    )
    assert main([str(tmp_path / "missing")]) == 2


def test_wandb_report_spec(sweep):
    """The W&B Report is built offline; only saving it needs W&B online."""
    from wandb_workspaces import expr

    sources = discover([sweep])
    report = wandb_report.build(sources, "team", "zkl", "precision sweep")
    assert (report.entity, report.project, report.title) == ("team", "zkl", "precision sweep")
    grid = next(b for b in report.blocks if type(b).__name__ == "PanelGrid")
    groups = sorted(r.wandb_group for r in sources.runs)
    assert [rs.name for rs in grid.runsets] == sorted(set(groups))
    for rs in grid.runsets:
        assert (rs.entity, rs.project) == ("team", "zkl")
        assert rs.name in json.dumps(expr.expr_to_filters(rs.filters).model_dump())
    kl_plot = grid.panels[0]
    assert kl_plot.y == [KL] and kl_plot.log_y is True and kl_plot.x == "Step"
    markdown = next(b for b in report.blocks if type(b).__name__ == "MarkdownBlock").text
    assert md_escape(BAD) in markdown


def _png_size(path: Path) -> tuple[int, int, int]:
    """(width, height, bytes of image data) of a PNG."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    idat, pos = 0, 8
    while pos < len(data):
        length = int.from_bytes(data[pos : pos + 4], "big")
        if data[pos + 4 : pos + 8] == b"IDAT":
            idat += length
        pos += 12 + length
    return width, height, idat


def _chromium(*args: str) -> subprocess.CompletedProcess:
    cmd = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
    cmd += ["--virtual-time-budget=10000", *args]
    env = {**os.environ, "HOME": os.environ.get("HOME", "/tmp")}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.slow
def test_page_renders_its_plots_in_headless_chromium(sweep, tmp_path):
    """The page as a browser shows it, offline: the plots are drawn (look at report.png)."""
    if shutil.which("chromium") is None:
        if os.environ.get("CI"):
            pytest.fail("CI must install Debian's chromium (.ci/run does)")
        pytest.skip("needs Debian's chromium (apt-get install chromium)")
    assert main([str(sweep)]) == 0
    url = (sweep / "report.html").as_uri()
    dom = _chromium("--dump-dom", url).stdout
    assert dom.count('class="main-svg"') >= 4  # two figures, each drawn as SVG layers
    assert "exactly 0" in dom and "What each fix contributes" in dom
    shot, blank = tmp_path / "report.png", tmp_path / "blank.png"
    _chromium(f"--screenshot={shot}", "--window-size=1400,1800", url)
    (tmp_path / "blank.html").write_text("<html><body></body></html>")
    _chromium(
        f"--screenshot={blank}", "--window-size=1400,1800", (tmp_path / "blank.html").as_uri()
    )
    width, height, data = _png_size(shot)
    assert (width, height) == (1400, 1800)
    assert data > 5 * _png_size(blank)[2]  # far from one flat colour (blank: ~12x less)
    if os.environ.get("ZKL_KEEP_SCREENSHOT"):
        shutil.copy(shot, os.environ["ZKL_KEEP_SCREENSHOT"])
    assert zlib.crc32(shot.read_bytes()) != zlib.crc32(blank.read_bytes())
