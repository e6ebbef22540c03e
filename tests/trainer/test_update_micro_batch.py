"""`rl.update_micro_batch`: the update's forward and backward a few sequences at a time, their
gradients summed into one optimizer step a minibatch. The step is the whole minibatch's
(the same loss and gradient up to fp32 rounding), a run stays exactly zero, and the estimate
holds one piece's activations."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import SMALL, make_cfg
from zkl.errors import ConfigError
from zkl.memory import GB, HOST_ONLY, estimate, peak
from zkl.rl.config import check
from zkl.rl.loop import run
from zkl.rl.loss import grpo_loss
from zkl.trainer.batch import UpdateBatch, micro_batch_edges
from zkl.trainer.build import build_policy


def test_pieces_cover_the_range_in_order():
    assert micro_batch_edges(3, 10, 0) == [(3, 10)]
    assert micro_batch_edges(3, 10, 7) == [(3, 10)]
    assert micro_batch_edges(3, 10, 3) == [(3, 6), (6, 9), (9, 10)]
    assert micro_batch_edges(0, 4, 1) == [(0, 1), (1, 2), (2, 3), (3, 4)]


def _update(size: int):
    """One update of a fp32 tiny model on a fixed ragged rollout; its stats and gradients."""
    cfg = make_cfg(
        "+precision=fp32", "rl.prompts_per_step=2", "rl.samples_per_prompt=3",
        f"rl.update_micro_batch={size}",
    )  # fmt: skip
    policy = build_policy(cfg, grpo_loss(cfg.rl))
    g = torch.Generator().manual_seed(3)
    lengths = [(4, 3), (6, 2), (5, 5), (3, 1), (7, 4), (2, 6)]
    prompts = [torch.randint(2, 40, (p,), generator=g).tolist() for p, _ in lengths]
    responses = [torch.randint(2, 40, (r,), generator=g).tolist() for _, r in lengths]
    # old logprobs a little off the policy's, so the ratio is not 1 and some tokens clip
    old = [torch.randn(len(r), generator=g) * 0.3 - 3.0 for r in responses]
    batch = UpdateBatch(prompts, responses, old, torch.randn(6, generator=g), [1.0] * 6)
    grads: list[torch.Tensor] = []
    step = policy._step

    def keep_grads(update_sq):
        grads.extend(p.grad.clone() for p in policy.params)
        return step(update_sq)

    policy._step = keep_grads
    stats = policy.update(batch)
    return stats, grads


@pytest.mark.parametrize("size", [1, 2, 4])
def test_pieces_give_the_whole_minibatchs_loss_and_gradient(size):
    whole_stats, whole = _update(0)
    stats, grads = _update(size)
    for key in ("loss/pg_loss", "loss/clip_frac", "loss/ratio_mean", "optim/grad_norm"):
        assert stats[key] == pytest.approx(whole_stats[key], rel=1e-5, abs=1e-7), key
    assert whole_stats["loss/clip_frac"] > 0  # the statistics were summed, not the last piece's
    for a, b in zip(whole, grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)  # fp32: the sum's order differs
    assert any(not torch.equal(a, b) for a, b in zip(whole, grads))  # the pieces really ran


def test_a_run_with_pieces_stays_exactly_zero(tmp_path):
    rows = run(make_cfg(*SMALL, "rl.steps=2", "rl.update_micro_batch=3"), tmp_path)
    assert [r["train/gen_kl_error"] for r in rows] == [0.0, 0.0]
    assert all(r["train/max_abs_logprob_diff"] == 0.0 for r in rows)
    assert all(r["optim/update_norm"] > 0 for r in rows)


def test_a_negative_piece_is_refused_by_name():
    cfg = make_cfg("rl.update_micro_batch=-1")
    with pytest.raises(ConfigError, match=r"^rl.update_micro_batch=-1 must be >= 0"):
        check(cfg.rl)


# The RL tail the GPU runs: a 1.5B model, 6,000-token prompts, 6 rollouts, 300 new tokens.
LONG_PROMPTS = [
    "model=qwen2_5_1_5b", "task.name=residue", "task.min_prompt_len=5968",
    "task.max_prompt_len=5968", "sampling.max_new_tokens=300", "rl.prompts_per_step=1",
    "rl.samples_per_prompt=6", "scheduler.max_batch_size=6", "device=cuda",
]  # fmt: skip


def _gpu_gb(*extra: str) -> float:
    cfg = make_cfg(*LONG_PROMPTS, *extra)
    parts = estimate(cfg, 6000 + 300)
    return peak({k: v for k, v in parts.items() if k not in HOST_ONLY}) / GB


def test_the_estimate_holds_one_pieces_activations():
    whole, one = _gpu_gb(), _gpu_gb("rl.update_micro_batch=1")
    assert whole > 80 > one  # six sequences' activations at once do not fit an 80 GB GPU
    plain = estimate(make_cfg(*LONG_PROMPTS), 6300)["update activations"]
    piece = estimate(make_cfg(*LONG_PROMPTS, "rl.update_micro_batch=2"), 6300)
    assert plain / 3 < piece["update activations"] < plain / 2.5  # and one piece's logits
