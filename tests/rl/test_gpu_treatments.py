"""The mismatch treatments on CUDA (`python -m pytest -m gpu`): fp16 zero mode exactly 0 and
default mode not, `lp_sampled` under top-k / top-p with decode replayed from CUDA graphs, and
routing replay bitwise unchanged in zero mode. Skipped without a CUDA device."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import SMALL, make_cfg
from zkl import invariance
from zkl.generation.sampling import SamplingParams
from zkl.generation.scheduler import Request, Scheduler
from zkl.models.build import build_model
from zkl.rl.loop import run
from zkl.trainer.scoring import score

pytestmark = pytest.mark.gpu
DEV = "cuda"


def _requests(n: int, top_k: int = 0, top_p: float = 1.0) -> list[Request]:
    g = torch.Generator().manual_seed(0)
    return [
        Request(i, torch.randint(2, 60, (int(m),), generator=g).tolist(),
                SamplingParams(0.9, top_p, top_k, max_new_tokens=7, seed=i))
        for i, m in enumerate(torch.randint(3, 30, (n,), generator=g))
    ]  # fmt: skip


@pytest.mark.parametrize("model", ["tiny_dense", "tiny_moe"])
@pytest.mark.parametrize("layout", ["colocated", "dedicated"])
def test_fp16_zero_on_gpu_and_default_not(tmp_path, model, layout):
    common = [f"model={model}", "+precision=fp16", f"+layout={layout}", "device=cuda"]
    common += ["rl.steps=10", *SMALL]
    zero = run(make_cfg(*common), tmp_path / "zero")
    assert all(r["train/max_abs_logprob_diff"] == 0.0 for r in zero)
    assert all(r["weights/changed_tensors"] > 0 for r in zero)
    default = run(make_cfg(*common, "zero_train_gen_mismatch=false"), tmp_path / "default")
    assert all(r["train/gen_kl_error"] > 0.0 for r in default)


def test_fp16_zero_with_cuda_graphs_on(tmp_path):
    cfg = make_cfg("model=tiny_dense", "+precision=fp16", "device=cuda", "scheduler.cuda_graphs=on",
                   "rl.steps=3", *SMALL)  # fmt: skip
    rows = run(cfg, tmp_path)
    assert all(r["train/max_abs_logprob_diff"] == 0.0 for r in rows)


@pytest.mark.parametrize("graphs", ["off", "on"])
def test_lp_sampled_on_gpu_with_and_without_graphs(graphs):
    cfg = make_cfg("model=tiny_dense")
    model = build_model(cfg.model, torch.bfloat16, seed=1, device=DEV)
    with invariance.enabled(invariance.FIXES):
        for top_k, top_p in ((0, 1.0), (5, 1.0), (0, 0.7)):
            scheduler = Scheduler(model, max_batch_size=4, eos_id=1, cuda_graphs=graphs)
            done = scheduler.generate(_requests(9, top_k, top_p))
            prompts, responses = [c.prompt for c in done], [c.tokens for c in done]
            lp_train = score(model, prompts, responses, [0.9] * len(done))  # as sampled
            for c, lp in zip(done, lp_train):
                assert torch.equal(c.logprobs, lp)  # raw against raw stays exactly zero
                if top_k == 0 and top_p == 1.0:
                    assert torch.equal(c.lp_sampled, c.logprobs)
                else:
                    assert bool((c.lp_sampled >= c.logprobs).all())


def test_routing_replay_on_gpu_zero_mode_unchanged_and_default_measured(tmp_path):
    cfg = make_cfg("model=tiny_moe")
    model = build_model(cfg.model, torch.bfloat16, seed=1, device=DEV)
    with invariance.enabled(invariance.FIXES):
        scheduler = Scheduler(model, max_batch_size=4, eos_id=1, record_routes=True)
        done = scheduler.generate(_requests(9))
        prompts, responses = [c.prompt for c in done], [c.tokens for c in done]
        plain = score(model, prompts, responses)
        replayed = score(model, prompts, responses, routes=[c.routes for c in done])
    assert all(torch.equal(a, b) for a, b in zip(plain, replayed))
    common = ["model=tiny_moe", "device=cuda", "rl.steps=3", *SMALL]
    zero = run(make_cfg(*common, "rl.routing_replay=true"), tmp_path / "zero")
    assert all(r["train/max_abs_logprob_diff"] == 0.0 for r in zero)
    assert all(r["routing/token_mismatch_frac"] == 0.0 for r in zero)
    default = run(make_cfg(*common, "rl.routing_replay=true", "zero_train_gen_mismatch=false"),
                  tmp_path / "default")  # fmt: skip
    assert all(0.0 <= r["routing/token_mismatch_frac"] <= 1.0 for r in default)
