"""Raw against raw on CUDA (`python -m pytest -m gpu`): decode eager and replayed from CUDA
graphs, colocated and dedicated, report `lp_gen` of softmax(logits / T) before the top-k /
top-p filter, so zero mode stays exactly 0 with a filter and default mode's gen_kl_error
with top_k=5 stays of the order of default mode's without it (tests/generation/test_raw_logprobs.py
has the CPU side and the bound's reason). Skipped without a CUDA device."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import make_cfg
from tests.generation.test_raw_logprobs import (
    MODES,
    RATIO_BOUND,
    _requests,
    _rollout,
    _runs,
    _shared,
)
from zkl.models.build import build_model
from zkl.rl.metrics import mismatch_metrics

pytestmark = pytest.mark.gpu


def _model():
    return build_model(make_cfg("model=tiny_dense").model, torch.bfloat16, seed=1, device="cuda")


@pytest.mark.parametrize("graphs", ["off", "on"])
def test_zero_exact_and_default_top_k_within_bound_with_and_without_graphs(graphs):
    model = _model()
    gen_kl = {}
    for mode in MODES:
        for top_k in (0, 5):
            done, lp_train = _rollout(model, mode, _requests(0.9, top_k, 1.0), cuda_graphs=graphs)
            row = mismatch_metrics(torch.cat(lp_train), torch.cat([c.logprobs for c in done]))
            gen_kl[mode, top_k] = row["train/gen_kl_error"]
            if mode == "zero":
                assert row["train/max_abs_logprob_diff"] == 0.0, top_k
    plain, cut = gen_kl["default", 0], gen_kl["default", 5]
    assert plain > 0.0 and plain / RATIO_BOUND <= cut <= plain * RATIO_BOUND, gen_kl


@pytest.mark.parametrize("graphs", ["off", "on"])
def test_default_mode_reported_logprob_ignores_the_filter_with_and_without_graphs(graphs):
    """Same seeds with and without top_k=32: on each response's shared prefix, default mode's
    reported logprobs are bitwise equal though the filter cut mass there."""
    model = _model()
    plain, _ = _rollout(model, "default", _requests(0.9, 0, 1.0), cuda_graphs=graphs)
    cut, _ = _rollout(model, "default", _requests(0.9, 32, 1.0), cuda_graphs=graphs)
    shared = cut_mass = 0
    for a, b in zip(plain, cut):
        n = _shared(a, b)
        assert torch.equal(a.logprobs[:n], b.logprobs[:n]), a.request_id
        shared += n
        cut_mass += int((b.lp_sampled[:n] > b.logprobs[:n]).sum())
    assert shared >= 16 and cut_mass > 0


@pytest.mark.parametrize("layout", ["colocated", "dedicated"])
def test_run_metrics_compare_raw_with_raw_on_gpu_with_graphs(tmp_path, layout):
    rows = _runs(tmp_path, layout, "device=cuda", "scheduler.cuda_graphs=on")
    for filtered in (False, True):
        zero = rows["zero", filtered]
        assert zero["train/gen_kl_error"] == 0.0 and zero["train/max_abs_logprob_diff"] == 0.0
    plain, cut = (rows["default", f]["train/gen_kl_error"] for f in (False, True))
    assert plain > 0.0 and plain / RATIO_BOUND <= cut <= plain * RATIO_BOUND
