"""The GRPO loop: zero mismatch at every step while weights change, refit, KV modes, tracking."""

from __future__ import annotations

import json

import pytest
import torch

from tests.conftest import SMALL, make_cfg
from zkl.invariance import FIXES
from zkl.rl.grpo import group_advantages
from zkl.rl.loop import TIMING_PREFIXES, run
from zkl.rl.loss import clipped_pg_loss
from zkl.tracking.run_log import read_metrics

pytestmark = pytest.mark.slow  # whole experiments: `pytest -m "not slow"` skips them


def _zero(row) -> bool:
    return row["train/max_abs_logprob_diff"] == 0.0 and row["train/gen_kl_error"] == 0.0


def test_group_advantages_and_loss():
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.5, 0.5]), group_size=2)
    assert torch.allclose(adv, torch.tensor([0.7071, -0.7071, 0.0, 0.0]), atol=1e-4)
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    mask = torch.tensor([[True, True]])
    loss, stats = clipped_pg_loss(logp, logp.detach(), torch.tensor([2.0]), mask, 0.2)
    loss.backward()
    assert loss.item() == pytest.approx(-2.0)  # ratio 1: -A per token
    assert torch.allclose(logp.grad, torch.tensor([[-1.0, -1.0]]))
    old = torch.tensor([[-1.5, -2.0]])  # ratio e^0.5 > 1.2 on token 0: clipped for A > 0
    loss, stats = clipped_pg_loss(logp.detach(), old, torch.tensor([1.0]), mask, 0.2)
    assert loss.item() == pytest.approx(-(1.2 + 1.0) / 2)
    assert stats["loss/clip_frac"] == 0.5


@pytest.mark.parametrize("layout", ["colocated", "dedicated"])
def test_twenty_steps_zero_while_learning(layout, tmp_path):
    """The issue's run: +precision=bf16 +layout=..., 20 GRPO steps on CPU."""
    rows = run(make_cfg("+precision=bf16", f"+layout={layout}"), tmp_path)
    assert len(rows) == 20
    assert all(_zero(r) for r in rows)
    assert all(r["optim/update_norm"] > 0 and r["weights/changed_tensors"] > 0 for r in rows)
    assert all(r["rl/zero_adv_frac"] < 1 for r in rows)
    assert [r["gen/weight_version"] for r in rows] == list(range(20))  # every refit seen
    # not lockstep: prompts of different lengths share prefill batches, and requests join
    # batches mid-decode while responses still vary in length
    assert all(r["gen/ragged_prefills"] > 0 for r in rows)
    assert all(r["gen/joined_running"] > 0 for r in rows[:3])
    first = sum(r["reward/mean"] for r in rows[:5]) / 5
    last = sum(r["reward/mean"] for r in rows[-5:]) / 5
    assert last > first
    assert read_metrics(tmp_path) == rows


def test_default_mode_mismatch_every_step(tmp_path):
    rows = run(make_cfg("zero_train_gen_mismatch=false", "rl.steps=4", *SMALL), tmp_path)
    assert all(r["train/gen_kl_error"] > 0 for r in rows)


@pytest.mark.parametrize("model", ["tiny_dense", "tiny_moe"])
def test_stale_prefix_cache_after_refit(model, tmp_path):
    """kv=persist without version tags reuses KV of old weights after the first refit."""
    base = [f"model={model}", "kv=persist", "rl.steps=4", *SMALL]
    stale = run(make_cfg(*base, "fixes.kv_invalidate_on_refit=false"), tmp_path / "off")
    assert _zero(stale[0])
    assert all(not _zero(r) for r in stale[1:])
    assert all(r["gen/prefix_hit_tokens"] > 0 for r in stale[1:])
    fixed = run(make_cfg(*base), tmp_path / "on")
    assert all(_zero(r) for r in fixed)
    assert all(r["gen/prefix_hit_tokens"] > 0 for r in fixed)  # the cache is really used
    recompute = run(
        make_cfg(f"model={model}", "kv=recompute", "rl.steps=4", *SMALL), tmp_path / "rc"
    )
    assert all(_zero(r) for r in recompute)
    assert all(r["gen/prefix_hit_tokens"] == 0 for r in recompute)


@pytest.mark.parametrize("layout", ["colocated", "dedicated"])
def test_refit_exactness(layout, tmp_path):
    """A converting refit rounds the fp32 norms/router to bf16: mismatch from step 0."""
    base = [f"+layout={layout}", "model=tiny_moe", "rl.steps=2", *SMALL]
    off = run(make_cfg(*base, "fixes.refit_exactness=false"), tmp_path / "off")
    assert all(not _zero(r) for r in off)
    on = run(make_cfg(*base), tmp_path / "on")
    assert all(_zero(r) for r in on)


def _without_timing(rows):
    return [{k: v for k, v in r.items() if not k.startswith(TIMING_PREFIXES)} for r in rows]


def test_colocated_equals_dedicated_and_runs_repeat(tmp_path):
    base = ["model=tiny_moe", "kv=persist", "rl.steps=3", *SMALL]
    colocated = run(make_cfg(*base, "+layout=colocated"), tmp_path / "c")
    again = run(make_cfg(*base, "+layout=colocated"), tmp_path / "c2")
    dedicated = run(make_cfg(*base, "+layout=dedicated"), tmp_path / "d")
    assert _without_timing(colocated) == _without_timing(again)
    assert _without_timing(colocated) == _without_timing(dedicated)
    tokens = [(tmp_path / d / "tokens.jsonl").read_text() for d in ("c", "c2", "d")]
    assert tokens[0] == tokens[1] == tokens[2]


def test_default_mode_runs_repeat_too(tmp_path):
    base = ["zero_train_gen_mismatch=false", "rl.steps=2", *SMALL]
    a = run(make_cfg(*base, "+layout=colocated"), tmp_path / "a")
    b = run(make_cfg(*base, "+layout=dedicated"), tmp_path / "b")
    assert _without_timing(a) == _without_timing(b)


def test_token_dump_recomputes_the_metrics(tmp_path):
    rows = run(
        make_cfg("zero_train_gen_mismatch=false", "rl.steps=2", "tracking.dump_tokens=all", *SMALL),
        tmp_path,
    )
    from zkl.rl.metrics import mismatch_metrics

    records = [json.loads(line) for line in (tmp_path / "tokens.jsonl").read_text().splitlines()]
    assert len(records) == 2 * 16
    for step, row in enumerate(rows):
        recs = [r for r in records if r["step"] == step]
        lp_train = torch.tensor([x for r in recs for x in r["lp_train"]])
        lp_gen = torch.tensor([x for r in recs for x in r["lp_gen"]])
        again = mismatch_metrics(lp_train, lp_gen)
        assert again == {k: v for k, v in row.items() if k in again}
        assert all(len(r["response"]) == len(r["lp_gen"]) for r in recs)


def test_wandb_offline_run_has_every_step(tmp_path, wandb_runs):
    cfg = make_cfg("rl.steps=3", *SMALL, "tracking.wandb.mode=offline", quiet=False)
    rows = run(cfg, tmp_path, progress=False)
    (wb,) = wandb_runs.runs
    assert wb.group == "tiny_dense-colocated-native-bf16-recompute-zero"
    assert "precision:bf16" in wb.tags
    assert not [t for t in wb.tags if t.startswith("fix_off:")]
    assert wandb_runs.steps() == [0, 1, 2]
    assert [row for _, row in wandb_runs.logged[0]] == read_metrics(tmp_path) == rows
    assert all(row["train/gen_kl_error"] == 0.0 for row in rows)
    (log,) = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
    assert log.name == f"run-{wb.id}.wandb" and log.stat().st_size > 0


def test_a_crash_keeps_the_logged_steps(tmp_path, monkeypatch):
    from zkl.trainer import policy

    real_update = policy.Policy.update

    def failing_update(self, batch):
        if self.version == 2:
            raise RuntimeError("injected failure")
        return real_update(self, batch)

    monkeypatch.setattr(policy.Policy, "update", failing_update)
    with pytest.raises(RuntimeError, match="injected"):
        run(make_cfg("rl.steps=5", *SMALL), tmp_path)
    assert [r["step"] for r in read_metrics(tmp_path)] == [0, 1]


def test_wandb_group_and_tags_name_the_fixes_off():
    from zkl.tracking.run_log import axes, tags

    one = make_cfg("kv=persist", "fixes.kv_invalidate_on_refit=false")
    assert "-".join(axes(one).values()).endswith("-zero-minus_kv_invalidate_on_refit")
    assert [t for t in tags(one) if t.startswith("fix_off:")] == ["fix_off:kv_invalidate_on_refit"]
    two = make_cfg("fixes.logprob_path=false", "fixes.refit_exactness=false")
    assert axes(two)["fixes"] == "minus_logprob_path+refit_exactness"
    assert axes(two) != axes(make_cfg("fixes.logprob_path=false"))
    default = make_cfg("zero_train_gen_mismatch=false")
    assert "fixes" not in axes(default) and axes(default)["mode"] == "default"
    assert len([t for t in tags(default) if t.startswith("fix_off:")]) == len(FIXES)
