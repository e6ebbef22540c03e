"""The report with damaged, linked and hostile runs: every other run still reported, one page."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from html_tables import parse_tables
from omegaconf import OmegaConf

from tests.conftest import make_cfg
from zkl.report import page
from zkl.report.__main__ import main
from zkl.report.contents import all_tables, markdown
from zkl.report.runs import discover
from zkl.tracking.errors import ERROR_FILE

KL = "train/gen_kl_error"


def _run(run_dir: Path, kls: list, model: str = "tiny_dense", **extra) -> None:
    """A run directory written as RunLog writes one, without building anything."""
    run_dir.mkdir(parents=True)
    cfg = make_cfg(f"model={model}", f"rl.steps={len(kls)}", *extra.get("overrides", []))
    OmegaConf.save(OmegaConf.structured(cfg), run_dir / "config.yaml")
    rows = [{"step": i, KL: kl, "train/max_abs_logprob_diff": 0.0} for i, kl in enumerate(kls)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture
def damaged(tmp_path) -> Path:
    root = tmp_path / "sweep"
    _run(root / "0", [0.0, 0.0])
    _run(root / "1", [0.0, "nan?"])  # a non-numeric gen_kl_error
    _run(root / "2", [0.0, 0.0])
    with open(root / "2" / "metrics.jsonl", "a") as f:
        f.write(json.dumps({KL: 0.0}) + "\n")  # a row without step
    _run(root / "3", [0.0, 0.0])
    (root / "3" / "config.yaml").write_text("model: {name: [tiny\n")  # torn YAML
    _run(root / "4", [0.0, 0.0])
    (root / "4" / "bench.json").write_text("{not json")
    cert = root / "cert"
    cert.mkdir()
    good = {"bed": "b", "variant": "all_fixes", "mode": "step0", "steps": 1, "tokens": 3}
    good |= {"train/max_abs_logprob_diff": 0.0, "train/gen_kl_error": 0.0, "result": "PASS"}
    (cert / "cert.jsonl").write_text(json.dumps(good) + "\n" + json.dumps({"bed": "b"}) + "\n")
    return root


def test_a_damaged_run_is_a_failed_run_with_its_reason(damaged):
    sources = discover([damaged])
    by_name = {r.name: r for r in sources.runs}
    assert set(by_name) == {"0", "1", "2", "3", "4"}
    assert by_name["0"].status == "complete" and by_name["4"].status == "complete"
    assert "non-numeric train/gen_kl_error" in by_name["1"].reason
    assert "row 3 has no step" in by_name["2"].reason
    assert "config.yaml cannot be read" in by_name["3"].reason
    for name in ("1", "2", "3"):
        assert by_name[name].status == "failed", name
    skipped = dict(sources.skipped)
    assert any("bench.json cannot be read" in why for why in skipped.values())
    assert any("lack one of" in why for why in skipped.values())
    assert [len(rows) for _, rows in sources.cert] == [1]
    assert main([str(damaged)]) == 0
    tables = parse_tables((damaged / "report.html").read_text())
    assert {r["run"][0] for r in tables["failed"]} == {"1", "2", "3"}
    assert "runs have gen_kl_error exactly 0" in (damaged / "report.html").read_text()


def test_symlinked_runs_are_followed_once(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    _run(elsewhere / "7", [0.0])
    root = tmp_path / "sweep"
    _run(root / "0", [0.0])
    os.symlink(elsewhere / "7", root / "linked")
    os.symlink(root / "0", root / "again")  # the same run twice: reported once, listed
    os.symlink(root, root / "0" / "loop")  # a cycle must end
    sources = discover([root])
    assert sorted(r.name for r in sources.runs) == ["0", "linked"]
    assert any("again" in path for path, _ in sources.skipped)


def test_labels_and_markdown_cells_are_escaped(tmp_path):
    root = tmp_path / "sweep"
    _run(root / "0", [1e-3])
    hostile = "<a href='http://x'>click</a> **bold** [l](http://y) | `c`"
    (root / "0" / ERROR_FILE).write_text(hostile + "\n")
    sources = discover([root])
    fig = page.kl_figure(sources)
    assert all("<a " not in trace.name for trace in fig.data)
    bad = root / "<b>x"
    _run(bad, [0.0])
    fig = page.kl_figure(discover([root]))
    names = [t.name for t in fig.data]
    assert any("&lt;b&gt;" in n for n in names) and all("<b>" not in n for n in names)
    md = markdown(sources, "t")
    assert "<a " not in md and "**bold**" not in md and "[l](http" not in md
    assert "\\*\\*bold\\*\\*" in md and "\\|" in md


def test_bad_out_and_unwritable_dir_are_one_sentence(tmp_path, capsys):
    root = tmp_path / "sweep"
    _run(root / "0", [0.0])
    assert main([str(root), "--out", str(tmp_path / "missing" / "r.html")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("zkl.report: cannot write") and "--out" in err and "\n" not in err
    if os.geteuid() != 0:  # root writes anywhere
        root.chmod(stat.S_IRUSR | stat.S_IXUSR)
        try:
            assert main([str(root)]) == 2
        finally:
            root.chmod(stat.S_IRWXU)


def test_common_settings_cert_verdicts_and_baseline_first(tmp_path):
    root = tmp_path / "sweep"
    _run(root / "0", [1e-5], model="tiny_moe", overrides=["fixes.logprob_path=false", "kv=persist"])
    _run(root / "1", [0.0], model="tiny_moe", overrides=["kv=persist"])
    cert = root / "cert"
    cert.mkdir()
    base = {"bed": "b", "steps": 1, "tokens": 3, "train/gen_kl_error": 0.0}
    rows = [
        base | {"variant": "all_fixes", "mode": "step0-fp32", "result": "PASS"},
        base | {"variant": "minus_batch_invariant_gemm", "mode": "step0-fp32"},
        base | {"variant": "minus_moe_combine_order", "mode": "step0"},
    ]
    rows[1] |= {"train/max_abs_logprob_diff": 4.8e-7, "result": "contributes error"}
    rows[2] |= {"train/max_abs_logprob_diff": 0.0, "result": "no effect: no MoE layer"}
    rows[0]["train/max_abs_logprob_diff"] = 0.0
    (cert / "cert.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    tables = dict(all_tables(discover([root])))
    settings = {r[0].text: r[1].text for r in tables["settings"].rows}
    assert settings["model.name"] == "tiny_moe" and settings["kv.mode"] == "persist"
    assert settings["precision.name"] == "bf16" and settings["layout.name"] == "colocated"
    runs = tables["runs"]
    fixes_col = runs.headers.index("fixes")
    assert [r[fixes_col].text for r in runs.rows] == ["all_fixes", "minus_logprob_path"]
    cert_table = tables["cert"]
    assert "mode" in cert_table.headers and "result" in cert_table.headers
    results = [r[cert_table.headers.index("result")].text for r in cert_table.rows]
    assert results == ["PASS", "contributes error", "no effect: no MoE layer"]
    modes = [r[cert_table.headers.index("mode")].text for r in cert_table.rows]
    assert modes == ["step0-fp32", "step0-fp32", "step0"]


@pytest.mark.slow
def test_twenty_runs_stay_readable(tmp_path):
    root = tmp_path / "sweep"
    for i in range(20):
        _run(root / str(i), [1e-6 * (i + 1), 0.0], overrides=[f"seed={i}"])
    html = page.render(discover([root]), "t", [str(root)])
    fig = page.kl_figure(discover([root]))
    legend = fig.layout.legend
    assert legend.y < 0 and legend.xanchor == "left"  # below the plot: its width is the page's
    assert fig.layout.margin.r <= 40
    assert "position: sticky" in page.STYLE and "td:first-child" in page.STYLE
    assert html.count("Plotly.newPlot(") == 1  # no reward logged: the KL plot alone
    assert html.count("plotly.js v") == 1  # the library inlined once
    without_library = len(html) - len(page.get_plotlyjs())
    assert without_library < 200_000, without_library
