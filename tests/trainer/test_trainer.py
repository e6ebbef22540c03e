"""The trainer part: one GRPO step asks it once for each job, and its update counts the refit
tensors it changed."""

from __future__ import annotations

import torch

from tests.conftest import SMALL, make_cfg
from zkl import invariance
from zkl.rl.loop import run
from zkl.rl.loss import grpo_loss
from zkl.trainer.batch import UpdateBatch
from zkl.trainer.build import build_policy
from zkl.trainer.local import LocalPolicy


def test_a_step_asks_the_trainer_once_for_each_job(tmp_path, monkeypatch):
    """Scoring, the update and the refit state: once a step each (the refit state once more
    before step 0), and the row's weights/changed_tensors is the update's own count."""
    calls = {"score": 0, "update": 0, "refit_state": 0}
    updates = []

    def counted(name, record=None):
        real = getattr(LocalPolicy, name)

        def wrapper(self, *args):
            calls[name] += 1
            out = real(self, *args)
            if record is not None:
                record.append(out)
            return out

        monkeypatch.setattr(LocalPolicy, name, wrapper)

    counted("score")
    counted("update", updates)
    counted("refit_state")
    steps = 3
    rows = run(make_cfg(f"rl.steps={steps}", *SMALL), tmp_path)
    assert calls == {"score": steps, "update": steps, "refit_state": 1 + steps}
    for row, stats in zip(rows, updates, strict=True):
        assert row["weights/changed_tensors"] == stats["weights/changed_tensors"] > 0
        assert row["weights/version"] == stats["weights/version"] == row["step"] + 1


def _batch(policy: LocalPolicy, cfg) -> UpdateBatch:
    prompts = [[2, 3, 4, 5], [2, 3, 6], [7, 8, 9, 10, 11], [4, 4]]
    responses = [[12, 13], [14, 15, 16], [17], [18, 19, 20]]
    temps = [cfg.sampling.temperature] * len(prompts)
    old, _ = policy.score(prompts, responses, temps)
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5])
    return UpdateBatch(prompts, responses, old, advantages, temps)


def _changed_bits(before: dict[str, torch.Tensor], policy: LocalPolicy) -> int:
    after = policy.refit_state()
    return sum(not torch.equal(before[n], after[n]) for n in before)


def test_update_counts_the_refit_tensors_whose_bits_changed():
    """A real step changes tensors and says how many; a learning rate below bf16's
    resolution moves the fp32 masters but no bf16 weight, and the count is 0."""
    for lr, expect_change in (("1e-3", True), ("1e-12", False)):
        cfg = make_cfg("+precision=bf16", f"rl.lr={lr}", "rl.weight_decay=0.0")
        with invariance.enabled(invariance.from_config(cfg)):
            policy = build_policy(cfg, grpo_loss(cfg.rl))
            batch = _batch(policy, cfg)
            before = {n: t.clone() for n, t in policy.refit_state().items()}
            stats = policy.update(batch)
        assert stats["weights/changed_tensors"] == _changed_bits(before, policy)
        assert (stats["weights/changed_tensors"] > 0) == expect_change
        assert (stats["optim/update_norm"] > 0) == expect_change
        assert stats["weights/version"] == policy.version == 1
