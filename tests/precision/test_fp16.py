"""`+precision=fp16`: fp16 compute, fp32 masters, dynamic loss scaling; zero mode exactly 0 in
fp16 as in bf16, default mode not; what cannot run fp16 says so in one sentence."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import SMALL, make_cfg
from zkl.errors import ConfigError
from zkl.precision.fp16 import DynamicLossScaler
from zkl.rl.loop import run
from zkl.run.validate import validate


def test_the_scaler_skips_an_overflow_backs_off_and_grows():
    scaler = DynamicLossScaler(scale=8.0, growth_interval=2)
    w = torch.zeros(3, requires_grad=True)
    scaler.scale_loss((w * torch.tensor([1.0, 2.0, 3.0])).sum()).backward()
    assert w.grad.tolist() == [8.0, 16.0, 24.0]  # scaled
    assert scaler.unscale([w]) and w.grad.tolist() == [1.0, 2.0, 3.0]
    scaler.update(True)
    assert scaler.scale == 8.0
    w.grad = torch.tensor([1.0, float("inf"), 0.0])
    assert not scaler.unscale([w])  # an overflow: the caller skips the step
    scaler.update(False)
    assert (scaler.scale, scaler.skipped, scaler.clean_steps) == (4.0, 1, 0)
    w.grad = torch.tensor([float("nan"), 0.0, 0.0])
    assert not scaler.unscale([w])
    scaler.update(False)
    for _ in range(2):
        scaler.update(True)
    assert (scaler.scale, scaler.skipped) == (4.0, 2)  # 2 -> grown back after 2 clean steps
    restored = DynamicLossScaler()
    restored.load_state_dict(scaler.state_dict())
    assert restored.state_dict() == scaler.state_dict()


def test_an_overflowing_update_is_skipped_and_the_weights_stay(tmp_path):
    """A loss scale of 2^100 overflows fp16 gradients: no weight moves, the scale halves."""
    from zkl import invariance
    from zkl.rl.loss import grpo_loss
    from zkl.trainer.batch import UpdateBatch
    from zkl.trainer.build import build_policy

    cfg = make_cfg("+precision=fp16")
    with invariance.enabled(invariance.from_config(cfg)):
        policy = build_policy(cfg, grpo_loss(cfg.rl))
        policy.scaler.scale = 2.0**100
        prompts, responses = [[2, 3, 4], [5, 6]], [[7, 8], [9]]
        old, _ = policy.score(prompts, responses, [1.0, 1.0])
        before = {n: t.clone() for n, t in policy.refit_state().items()}
        stats = policy.update(
            UpdateBatch(prompts, responses, old, torch.tensor([1.0, -1.0]), [1.0, 1.0])
        )
    assert stats["optim/skipped_steps"] == 1 and stats["optim/loss_scale"] == 2.0**99
    assert stats["weights/changed_tensors"] == 0
    assert all(torch.equal(before[n], t) for n, t in policy.refit_state().items())
    assert policy.model.embed_tokens.weight.dtype == torch.float16


@pytest.mark.parametrize(
    "override, key",
    [
        ("precision.linear_quant=mxfp8", "precision.linear_quant"),
        ("precision.master_weights_fp32=false", "precision.master_weights_fp32"),
        ("trainer.world_size=2", "trainer.world_size"),
    ],
)
def test_fp16_with_a_recipe_that_cannot_run_it_stops_in_one_sentence(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        validate(make_cfg("+precision=fp16", override))


@pytest.mark.slow
@pytest.mark.parametrize("model", ["tiny_dense", "tiny_moe"])
@pytest.mark.parametrize("layout", ["colocated", "dedicated"])
def test_fp16_zero_mode_is_exactly_zero_for_ten_steps(model, layout, tmp_path):
    rows = run(make_cfg("+precision=fp16", f"+layout={layout}", f"model={model}",
                        "rl.steps=10", *SMALL), tmp_path)  # fmt: skip
    assert len(rows) == 10
    assert all(r["train/max_abs_logprob_diff"] == 0.0 for r in rows)
    assert all(r["train/gen_kl_error"] == 0.0 for r in rows)
    assert all(r["weights/changed_tensors"] > 0 for r in rows)  # it trained


@pytest.mark.slow
def test_fp16_default_mode_is_not_zero(tmp_path):
    cfg = make_cfg("+precision=fp16", "zero_train_gen_mismatch=false", "rl.steps=2", *SMALL)
    rows = run(cfg, tmp_path)
    assert all(r["train/gen_kl_error"] > 0 for r in rows)
