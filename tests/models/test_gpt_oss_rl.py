"""`model.checkpoint=DIR` alone on a transformers-written gpt-oss (sinks, sliding and full
layers, biased MoE; the add task's prompts are ~38 tokens, past the window of 4): GRPO
steps exactly zero across layouts, KV modes and precisions while the weights train; every
fix off, the same run is not zero."""

from __future__ import annotations

import pytest

from tests.conftest import make_cfg
from tests.models.test_gpt_oss_peer import make_hf
from zkl.rl.loop import run

pytestmark = pytest.mark.slow  # whole experiments

SMALL = ["rl.prompts_per_step=2", "rl.samples_per_prompt=4", "rl.steps=2"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    directory = tmp_path_factory.mktemp("gpt_oss")
    make_hf().save_pretrained(directory)
    return directory


@pytest.mark.parametrize(
    "layout,kv,precision",
    [
        ("colocated", "recompute", "bf16"),
        ("dedicated", "persist", "mxfp8"),
        ("colocated", "persist", "mxfp8"),
        ("dedicated", "recompute", "bf16"),
    ],
)
def test_steps_exactly_zero(checkpoint, tmp_path, layout, kv, precision):
    overrides = [f"layout={layout}", f"kv={kv}", f"precision={precision}", *SMALL]
    cfg = make_cfg(f"model.checkpoint={checkpoint}", *overrides)
    assert cfg.model.family == "gpt_oss" and cfg.model.sliding_window == 4
    rows = run(cfg, tmp_path)
    assert len(rows) == 2
    for r in rows:
        assert r["train/max_abs_logprob_diff"] == 0.0 and r["train/gen_kl_error"] == 0.0
        assert r["optim/update_norm"] > 0 and r["weights/changed_tensors"] > 0


def test_every_fix_off_is_not_zero(checkpoint, tmp_path):
    cfg = make_cfg(f"model.checkpoint={checkpoint}", "zero_train_gen_mismatch=false", *SMALL)
    rows = run(cfg, tmp_path)
    assert all(r["train/gen_kl_error"] > 0 for r in rows)
