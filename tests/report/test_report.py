"""`python -m zkl.report`: tables that match the runs' files, zeros never dropped, offline page."""

from __future__ import annotations

import json
import os
import re
import shutil
import zlib
from pathlib import Path

import pytest
from headless import chromium, needs_chromium, png_size
from html_tables import parse_tables
from omegaconf import OmegaConf

from tests.conftest import make_cfg
from zkl.errors import ConfigError
from zkl.report import page, wandb_report
from zkl.report.__main__ import main
from zkl.report.axes import sweep_axes
from zkl.report.contents import all_tables
from zkl.report.runs import discover
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
    assert sweep_axes(sources.runs) == ["model.name", "seed", "sampling.max_new_tokens", "fixes"]
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
    assert rows["3"]["status"][0] == "failed" and tables["failed"][0]["error"][0] == BAD
    assert [r["run"][0] for r in tables["failed"]] == ["3", "4"]
    assert tables["bench"][0]["gen tok/s zero"][1] == 900.0
    md = (sweep / "report.md").read_text()
    assert md_escape(BAD) in md and "### Runs" in md and "### Throughput" in md
    row = "| 2 | 4e-05 | 4e-05 | 5e-05 | 0 | tiny\\_moe | 0 | 6 | minus\\_logprob\\_path "
    row += "| complete | 3 |"
    assert row in md


def test_zero_band_keeps_every_zero(sweep):
    fig = page.kl_figure(discover([sweep]))
    traces = {}
    for trace in fig.data:
        traces.setdefault(trace.name, []).append(trace)
    assert sorted(traces) == [  # the axes' values only; seed and max_new_tokens differ
        "tiny_dense seed=0 max_new_tokens=6 all_fixes",
        "tiny_dense seed=1 max_new_tokens=6 all_fixes",
        "tiny_moe seed=0 max_new_tokens=6 all_fixes",
        "tiny_moe seed=0 max_new_tokens=6 minus_logprob_path",
    ]
    top, band = traces["tiny_moe seed=0 max_new_tokens=6 all_fixes"]
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
    assert html.count("Plotly.newPlot(") == 2 and "plotly.js v" in html  # KL, reward
    names = [r["run"][0] for r in parse_tables(html)["runs"]]
    assert sorted(names) == ["0", "2"] or sorted(names) == sorted(
        [f"{sweep.name}/0", f"{sweep.name}/2"]
    )
    assert main([str(tmp_path / "missing")]) == 2


def test_wandb_without_an_entity_names_both_keys_before_any_work(sweep, capsys):
    """W&B's own error (`1 validation error for Runset / entity`) names neither key."""
    assert main([str(sweep), "--wandb"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--entity NAME" in err and "tracking.wandb.entity=NAME" in err
    assert not (sweep / "report.html").exists()  # refused before the page is written


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


@pytest.mark.slow
def test_page_renders_its_plots_in_headless_chromium(sweep, tmp_path):
    """The page as a browser shows it, offline: the plots are drawn (look at report.png)."""
    needs_chromium()
    assert main([str(sweep)]) == 0
    url = (sweep / "report.html").as_uri()
    dom = chromium("--dump-dom", url).stdout
    assert dom.count('class="main-svg"') >= 6  # three figures, each drawn as SVG layers
    assert "exactly 0" in dom and "What each fix contributes" in dom
    assert "reward/mean per step" in dom
    shot, blank = tmp_path / "report.png", tmp_path / "blank.png"
    chromium(f"--screenshot={shot}", "--window-size=1400,1800", url)
    (tmp_path / "blank.html").write_text("<html><body></body></html>")
    chromium(f"--screenshot={blank}", "--window-size=1400,1800", (tmp_path / "blank.html").as_uri())
    width, height, data = png_size(shot)
    assert (width, height) == (1400, 1800)
    assert data > 5 * png_size(blank)[2]  # far from one flat colour (blank: ~12x less)
    if os.environ.get("ZKL_KEEP_SCREENSHOT"):
        shutil.copy(shot, os.environ["ZKL_KEEP_SCREENSHOT"])
    assert zlib.crc32(shot.read_bytes()) != zlib.crc32(blank.read_bytes())


# Measures the laid-out page in the browser and writes what it found into the DOM.
PROBE = """<script>window.addEventListener('load', () => {
  const runs = document.getElementById('runs');
  const heads = [...runs.querySelectorAll('thead th')].map(th => th.textContent);
  const at = name => heads.indexOf(name);
  const cells = col => [...runs.querySelectorAll('tbody tr')].map(tr => tr.children[col]);
  const out = {
    page: [document.documentElement.scrollWidth, window.innerWidth],
    table: [runs.scrollWidth, runs.clientWidth],
    right: Object.fromEntries([...runs.querySelectorAll('thead th')].map(
      th => [th.textContent, th.getBoundingClientRect().right])),
    fixes: cells(at('fixes')).map(td => [td.textContent, td.scrollWidth, td.clientWidth]),
    legends: [...document.querySelectorAll('.legend .traces')].map(t => t.textContent),
  };
  const pre = document.createElement('pre');
  pre.id = 'probe';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});</script>"""


@pytest.mark.slow
def test_a_wide_sweep_fits_1400_px(tmp_path):
    """Seven axes, long fix sets and a long error: at 1,400 px nothing is cut or scrolled away.

    Keep the screenshot with ZKL_KEEP_SCREENSHOT=path.png and look at it.
    """
    needs_chromium()
    off = ["fixes.logprob_path=false", "fixes.kv_invalidate_on_refit=false"]
    off += ["fixes.refit_exactness=false", "fixes.quantized_weight_refresh=false"]
    for i, (model, precision, kv) in enumerate(
        [("tiny_dense", "bf16", "persist"), ("tiny_moe", "mxfp8", "recompute")] * 2
    ):
        axes = [f"model={model}", f"+precision={precision}", f"kv={kv}", f"seed={i % 3}"]
        axes += [f"sampling.max_new_tokens={6 + i}", f"+layout={('colocated', 'dedicated')[i % 2]}"]
        kls = [0.0, 0.0, 0.0] if i < 2 else [2e-5 * (i + 1), 0.0, 1e-6]
        _write_run(tmp_path / str(i), axes + (off if i >= 2 else []), kls)
    (tmp_path / "4").mkdir()
    (tmp_path / "4" / "error.txt").write_text(BAD + " " + BAD + "\n")
    assert main([str(tmp_path)]) == 0
    report = tmp_path / "report.html"
    probe = tmp_path / "probe.html"
    probe.write_text(report.read_text().replace("</body>", PROBE + "</body>"))
    dom = chromium("--window-size=1400,1800", "--dump-dom", probe.as_uri()).stdout
    found = json.loads(re.search(r'<pre id="probe">(.*?)</pre>', dom, re.S).group(1))
    assert found["page"][0] <= 1400, found["page"]  # no horizontal scroll of the page
    assert found["table"][0] <= found["table"][1], found["table"]  # the whole table in view
    for title in ("gen_kl_error final", "gen_kl_error mean", "gen_kl_error max", "fixes"):
        assert found["right"][title] <= 1400, (title, found["right"][title])
    fixes = {text for text, _, _ in found["fixes"]}
    off_label = "minus_logprob_path+kv_invalidate_on_refit+refit_exactness+quantized_weight_refresh"
    assert off_label in fixes
    for text, scroll, client in found["fixes"]:
        assert scroll <= client, f"the fixes cell {text!r} is cut"
    legend = " ".join(found["legends"])
    assert "tiny_moe mxfp8" in legend and "/" not in legend  # the axes' values, no paths
    shot = tmp_path / "wide.png"
    chromium(f"--screenshot={shot}", "--window-size=1400,2600", report.as_uri())
    assert png_size(shot)[:2] == (1400, 2600)
    if os.environ.get("ZKL_KEEP_SCREENSHOT"):
        shutil.copy(shot, os.environ["ZKL_KEEP_SCREENSHOT"].replace(".png", "_wide.png"))


def _refused(run_dir: Path, overrides: list[str], error: str | None, **edits) -> None:
    """A job Hydra composed and zkl refused: `.hydra/` (config, overrides), error.txt, no log."""
    (run_dir / ".hydra").mkdir(parents=True)
    tree = OmegaConf.to_container(OmegaConf.structured(make_cfg("rl.steps=3")))
    for key, value in edits.items():
        group, leaf = key.split("__")
        tree[group][leaf] = value
    OmegaConf.save(OmegaConf.create(tree), run_dir / ".hydra" / "config.yaml")
    OmegaConf.save(OmegaConf.create(overrides), run_dir / ".hydra" / "overrides.yaml")
    (run_dir / "metrics.jsonl").write_text("")
    if error:
        (run_dir / "error.txt").write_text(error + "\n")


def test_a_refused_run_is_failed_with_its_sentence_and_its_own_config(tmp_path):
    _write_run(tmp_path / "0", ["kv=persist"], [0.0, 0.0, 0.0])
    _write_run(tmp_path / "1", ["kv=recompute"], [0.0, 0.0, 0.0])
    ckpt = "/data/ckpts/qwen2_all"
    sentence = f"model.checkpoint={ckpt} has no config.json; name a checkpoint directory."
    args = {"model__checkpoint": ckpt, "task__name": "dataset"}
    _refused(tmp_path / "2", [f"model.checkpoint={ckpt}", "task=dataset"], sentence, **args)
    _refused(
        tmp_path / "3",
        ["model=tiny_moe", f"model.checkpoint={ckpt}"],
        BAD,
        **args,
        model__name="tiny_moe",
    )
    (tmp_path / "3" / "metrics.jsonl").unlink()  # `.hydra/` and error.txt alone
    _refused(tmp_path / "4", [], None)  # killed before it logged or recorded anything
    (tmp_path / "5").mkdir()
    (tmp_path / "5" / "error.txt").write_text(BAD + "\n")  # no config at all
    runs = {r.name: r for r in discover([tmp_path]).runs}
    assert runs["2"].status == "failed" and runs["2"].reason == sentence
    assert runs["2"].flat["model.name"] == "qwen2_all"  # zkl's name, not tiny_dense's
    assert runs["2"].flat["task.tokenizer"] == ckpt
    assert "model.hidden_size" not in runs["2"].flat  # config.json's, never the default's
    assert runs["3"].flat["model.name"] == "tiny_moe"  # a named group keeps its name
    assert runs["3"].status == "failed" and runs["3"].reason == BAD
    assert runs["4"].status == "incomplete" and runs["5"].status == "failed"
    assert main([str(tmp_path)]) == 0
    tables = parse_tables((tmp_path / "report.html").read_text())
    failed = {r["run"][0]: r for r in tables["failed"]}
    assert failed["2"]["error"][0] == sentence and failed["5"]["error"][0] == BAD
    assert failed["4"]["error"][0].startswith("no error recorded")
    rows = {r["run"][0]: r for r in tables["runs"]}
    assert rows["2"]["model"][0] == "qwen2_all" and rows["2"]["status"][0] == "failed"
    assert rows["5"]["model"][0] == "" and "kv" in rows["5"]


def test_only_the_varying_axes_label_the_runs(tmp_path):
    """A run without a config, or keys that follow from another axis, add no axis."""
    _write_run(tmp_path / "0", ["kv=persist"], [0.0, 0.0, 0.0])
    _write_run(tmp_path / "1", ["kv=recompute", "zero_train_gen_mismatch=false"], [1e-4] * 3)
    _refused(tmp_path / "2", [], BAD, model__checkpoint="/x/ckpt_a")
    (tmp_path / "3").mkdir()
    (tmp_path / "3" / "error.txt").write_text(BAD + "\n")
    sources = discover([tmp_path])
    assert sweep_axes(sources.runs) == ["model.name", "kv.mode", "fixes"]
    fig = page.kl_figure(sources)
    names = sorted({t.name for t in fig.data})
    assert names == ["tiny_dense kv=persist all_fixes", "tiny_dense kv=recompute no_fixes"]
    runs = dict(all_tables(sources))["runs"]
    assert runs.headers[:5] == ["run"] + [
        "gen_kl_error final",
        "gen_kl_error mean",
        "gen_kl_error max",
        "steps exactly 0",
    ]
    assert "val/accuracy final" not in runs.headers  # no run validated: no empty column
    reward = page.reward_figure(sources)
    assert sorted(t.name for t in reward.data) == names  # reward per step, every run


def test_a_sweep_exactly_zero_throughout_is_a_grid_not_an_empty_plot(tmp_path):
    for i, (model, kv) in enumerate(
        [("tiny_dense", "persist"), ("tiny_dense", "recompute"), ("tiny_moe", "persist")]
    ):
        _write_run(tmp_path / str(i), [f"model={model}", f"kv={kv}"], [0.0, 0.0, 0.0])
    assert main([str(tmp_path)]) == 0
    html = (tmp_path / "report.html").read_text()
    assert "kl-per-step" not in html and "Every logged step of every run is exactly 0" in html
    assert html.index("id='grid'") < html.index("reward-per-step")  # the grid leads
    grid = parse_tables(html)["grid"]
    assert [list(r) for r in grid][0] == ["model", "kv: persist", "kv: recompute"]
    assert [r["model"][0] for r in grid] == ["tiny_dense", "tiny_moe"]
    assert grid[0]["kv: persist"] == ("exactly 0 (3 steps)", 0.0)
    assert grid[1]["kv: recompute"] == ("", None)  # no such run
    _write_run(tmp_path / "3", ["model=tiny_moe", "kv=recompute"], [0.0, 2e-6, 0.0])
    assert main([str(tmp_path)]) == 0
    html = (tmp_path / "report.html").read_text()
    assert "kl-per-step" in html and "Every logged step" not in html
    assert parse_tables(html)["grid"][1]["kv: recompute"] == ("2e-06", 2e-6)
