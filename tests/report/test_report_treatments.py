"""The report's treatment grouping: every arm of a mismatch-treatment sweep in its table and
per-step figures, checked on the page a headless browser draws."""

from __future__ import annotations

import os
import shutil

import pytest
from headless import chromium, needs_chromium, png_size
from html_tables import parse_tables

from tests.conftest import make_cfg
from zkl.report.__main__ import main
from zkl.report.runs import discover
from zkl.report.treatments import arms, treatment
from zkl.tracking.run_log import RunLog

ARMS = {  # run dir -> (overrides, gen_kl_error per step)
    "0": (["zero_train_gen_mismatch=true"], [0.0, 0.0]),
    "1": (["zero_train_gen_mismatch=false"], [3e-6, 4e-6]),
    "2": (["zero_train_gen_mismatch=false", "rl.correction.mode=token_tis"], [2e-6, 3e-6]),
    "3": (["zero_train_gen_mismatch=false", "rl.correction.mode=geo_mis"], [5e-6, 1e-6]),
    "4": (["+precision=fp16", "zero_train_gen_mismatch=false"], [2e-7, 1e-7]),
    "5": (
        ["model=tiny_moe", "zero_train_gen_mismatch=false", "rl.routing_replay=true"],
        [1e-6, 2e-6],
    ),
}
NAMES = ["zero", "default", "default+token_tis", "default+geo_mis", "fp16 default",
         "tiny_moe default+replay"]  # fmt: skip


def _write(run_dir, overrides, kls):
    log = RunLog(run_dir, make_cfg("rl.steps=2", *overrides))
    for step, kl in enumerate(kls):
        row = {
            "train/gen_kl_error": kl,
            "train/max_abs_logprob_diff": 10 * kl,
            "reward/mean": 0.1 * (step + 1),
            "val/accuracy": 0.25 * step,
            "val/reward": 0.3 * step,
            "rollout_corr/k3_kl": kl,
            "rollout_corr/chi2_token": 2 * kl,
            "rollout_corr/eff_sample_size": 1.0 - kl,
            "rollout_corr/masked_fraction": 0.0 if kl == 0 else 0.01,
            "rollout_corr/ratio_max": 1.0 + kl,
            "timing/gen_s": 1.0,
            "timing/update_s": 0.5,
        }
        if "rl.routing_replay=true" in overrides:
            row["routing/token_mismatch_frac"] = 0.02
        log.log(step, row)
    log.close()


@pytest.fixture
def treatments_sweep(tmp_path):
    for name, (overrides, kls) in ARMS.items():
        _write(tmp_path / name, overrides, kls)
    return tmp_path


def test_runs_are_grouped_by_treatment_and_the_table_has_every_arm(treatments_sweep):
    runs = arms(discover([treatments_sweep]))
    assert sorted(treatment(r) for r in runs) == sorted(NAMES)
    assert main([str(treatments_sweep)]) == 0
    tables = parse_tables((treatments_sweep / "report.html").read_text())
    by = {r["arm"][0]: {k: v[1] for k, v in r.items()} for r in tables["treatments"]}
    assert sorted(by) == sorted(NAMES)
    assert by["zero"]["gen_kl_error mean"] == 0.0
    assert by["default"]["gen_kl_error mean"] == pytest.approx(3.5e-6)
    assert by["fp16 default"]["val/accuracy final"] == 0.25
    assert by["tiny_moe default+replay"]["routes differing (tokens)"] == 0.02
    assert by["default"]["step time s"] == 1.5


@pytest.mark.slow
def test_the_page_shows_every_arm_in_headless_chromium(treatments_sweep, tmp_path):
    needs_chromium()
    assert main([str(treatments_sweep)]) == 0
    url = (treatments_sweep / "report.html").as_uri()
    dom = chromium("--dump-dom", url).stdout
    for div in ("reward-per-step", "val-accuracy-per-step", "kl-per-step"):
        assert f'id="{div}"' in dom
    for div in ("val-reward", "rollout-corr-k3-kl", "rollout-corr-chi2-token"):
        assert f'id="treatment-{div}"' in dom
    legends = dom.split('class="legend"')[1:]
    assert len(legends) >= 5
    for name in NAMES:  # every arm by its name in the drawn legends, and no run's path
        assert f">{name}<" in legends[0], name
    shot = tmp_path / "treatments.png"
    chromium(f"--screenshot={shot}", "--window-size=1400,2400", url)
    width, height, data = png_size(shot)
    assert (width, height) == (1400, 2400) and data > 50_000
    if os.environ.get("ZKL_KEEP_SCREENSHOT"):
        shutil.copy(shot, os.environ["ZKL_KEEP_SCREENSHOT"])
