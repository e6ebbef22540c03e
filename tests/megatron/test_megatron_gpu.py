"""Megatron engines on the GPU, each of `ENGINES`: default mode shows the mismatch, zero mode
is exactly 0 at step 0 and across refits, and the megatron and native engines agree on the
same weights. Skipped without CUDA or megatron-core; the Transformer Engine specs skip
without Transformer Engine. `inference_optimized` is a dedicated generator's engine, so its
runs take `+layout=dedicated`."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import SMALL, make_cfg
from tests.megatron import mixed_length_requests
from zkl import invariance
from zkl.engines import TRANSFORMER_ENGINE, engine_named, megatron_engines
from zkl.models.build import build_model
from zkl.rl.loop import run
from zkl.trainer.scoring import sequence_logprobs

pytestmark = pytest.mark.gpu
pytest.importorskip("megatron.core")
DEV = "cuda"
# Peer tolerance (default mode, bf16 logits of the tiny models): cuBLAS vs cuBLAS with other
# shapes (fused QKV / fc1), torch RMSNorm vs zkl's, megatron's masked softmax vs SDPA.
PEER_ATOL = 0.05
PEER_RTOL = 0.05


ENGINES = [e.name for e in megatron_engines()]
TE_ENGINES = [e.name for e in megatron_engines() if TRANSFORMER_ENGINE in e.needs]
COLOCATED_ENGINES = [e.name for e in megatron_engines() if not e.dedicated_only]


def _needs(engine: str) -> None:
    if engine in TE_ENGINES:
        pytest.importorskip("transformer_engine.pytorch")


def _cfg(model: str, *extra: str, engine: str = "megatron_local"):
    _needs(engine)
    layout = ["+layout=dedicated"] if engine_named(engine).dedicated_only else []
    return make_cfg(f"model={model}", f"engine={engine}", "device=cuda", *SMALL, *layout, *extra)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("model", ["tiny_dense", "tiny_moe"])
def test_megatron_default_mode_mismatch(tmp_path, model, engine):
    cfg = _cfg(model, "rl.steps=1", "zero_train_gen_mismatch=false", engine=engine)
    rows = run(cfg, tmp_path)
    assert rows[0]["train/max_abs_logprob_diff"] > 0.0
    assert rows[0]["train/gen_kl_error"] > 0.0


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("kv", ["recompute", "persist"])
@pytest.mark.parametrize("model", ["tiny_dense", "tiny_moe"])
def test_megatron_zero_mode_exact_over_refits(tmp_path, model, kv, engine):
    rows = run(_cfg(model, "rl.steps=3", f"kv={kv}", engine=engine), tmp_path)
    assert all(r["train/max_abs_logprob_diff"] == 0.0 for r in rows)
    assert all(r["train/bitwise_equal_frac"] == 1.0 for r in rows)
    assert all(r["optim/update_norm"] > 0 for r in rows)


@pytest.mark.parametrize("engine", COLOCATED_ENGINES)
def test_megatron_dedicated_equals_colocated(tmp_path, engine):
    colocated = run(_cfg("tiny_dense", "rl.steps=3", engine=engine), tmp_path / "c")
    dedicated = run(
        _cfg("tiny_dense", "rl.steps=3", "+layout=dedicated", engine=engine), tmp_path / "d"
    )
    keys = [k for k in colocated[0] if k.startswith(("train/", "reward/", "optim/"))]
    for a, b in zip(colocated, dedicated):
        assert {k: a[k] for k in keys} == {k: b[k] for k in keys}
        assert b["train/max_abs_logprob_diff"] == 0.0


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("model", ["tiny_dense", "tiny_moe"])
def test_megatron_peer_of_native(model, engine):
    """Same weights: logits within PEER_ATOL/RTOL by default; zero mode: the same logprobs
    (zkl's kernels in every slot, so the same kernels on the same operands)."""
    from zkl.megatron.model import build_megatron_model

    _needs(engine)
    cfg = make_cfg(f"model={model}").model
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, cfg.vocab_size, (4, 40), generator=g).to(DEV)
    positions = torch.arange(40, device=DEV).expand(4, 40)
    with invariance.enabled(()):
        mega = build_megatron_model(cfg, engine, torch.bfloat16, 0, DEV)
        native = build_model(cfg, torch.bfloat16, seed=0, device=DEV)
        with torch.no_grad():
            a, b = mega(tokens, positions).float(), native(tokens, positions).float()
        torch.testing.assert_close(a, b, atol=PEER_ATOL, rtol=PEER_RTOL)
    with invariance.enabled(invariance.FIXES), torch.no_grad():
        assert torch.equal(
            sequence_logprobs(mega, tokens, 0.7), sequence_logprobs(native, tokens, 0.7)
        )
        # fp32, the stricter oracle: every slot zkl's (the MLP's SwiGLU too) or it shows
        mega = build_megatron_model(cfg, engine, torch.float32, 0, DEV)
        native = build_model(cfg, torch.float32, seed=0, device=DEV)
        assert torch.equal(
            sequence_logprobs(mega, tokens, 0.7), sequence_logprobs(native, tokens, 0.7)
        )


@pytest.mark.parametrize("engine", TE_ENGINES)
def test_te_attention_serves_default_mode_over_the_cache(engine, monkeypatch):
    """Default mode on the TE engines attends through Transformer Engine's own
    `DotProductAttention`, on the train path and over zkl's cache (chunked prefill, continuous
    batching, decode), eager: generated logprobs within PEER_ATOL of scored ones, which a
    wrong mask would break by far more."""
    from zkl.generation.scheduler import Scheduler
    from zkl.megatron.model import build_megatron_model
    from zkl.trainer.scoring import score

    _needs(engine)
    from transformer_engine.pytorch import DotProductAttention as TEAttention

    calls = []
    te_forward = TEAttention.forward
    monkeypatch.setattr(
        TEAttention, "forward", lambda self, *a, **k: calls.append(1) or te_forward(self, *a, **k)
    )
    cfg = make_cfg("model=tiny_dense").model
    requests = mixed_length_requests(cfg.vocab_size, max_new_tokens=6)
    with invariance.enabled(()), torch.no_grad():
        model = build_megatron_model(cfg, engine, torch.bfloat16, 0, DEV)
        scheduler = Scheduler(
            model, max_batch_size=4, eos_id=1, prefill_chunk=5, cuda_graphs="off"
        )  # eager decode: in a graph zkl's attention runs (positions cannot be read back)
        done = scheduler.generate(requests)
        generating = len(calls)
        scored = score(model, [c.prompt for c in done], [c.tokens for c in done])
    assert generating > 0 and len(calls) > generating
    diff = max((c.logprobs.float() - s.float()).abs().max().item() for c, s in zip(done, scored))
    assert diff <= PEER_ATOL
