"""Zero mode in fp32 on the CPU (a stricter oracle than bf16, whose rounding hides order
differences) at widths whose activations are not whole vector registers: every schedule of
the scheduler and every scoring micro-batch give the same logprobs, bit for bit.

gpt-oss at issue 45's widths (hidden 48, experts of 40, 6 query / 2 kv heads, 5 experts
top-3, window 6 on layers 0 and 2, shorter than every prompt, sinks, YaRN): batch 1, 3 and
all, prefill chunks, both KV modes (persist reads the prefix cache on its second call),
scoring whole and in micro-batches. Llama and Qwen2 with MLPs of 1000 on two threads, where
the threads split the gate rows mid-row.

With an activation that rounds an element by its place in the tensor (the fix off) the same
runs are not exact. Torch's own CPU kernels do that where their vector loop leaves a scalar
tail, which depends on the CPU's vector width (16 fp32 lanes on AVX-512, 8 on AVX2, none at
`ATEN_CPU_CAPABILITY=default`), so a CPU can hide it at a given width (issue 57: a machine
where torch's silu gave the two-thread Llama runs alike). The negative tests therefore take
`place_rounded`: our formula, with each thread's share's last `numel % 16` elements rounded
another way, as an AVX-512 tail is; tests/ops/test_activations.py measures torch's own.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from tests.models.test_hf_peer import randomize_
from zkl import invariance
from zkl.generation.sampling import SamplingParams
from zkl.generation.scheduler import Request, Scheduler
from zkl.models.build import build_model
from zkl.models.config import ModelConfig, MoEConfig, RopeConfig
from zkl.ops import activations
from zkl.trainer.scoring import score

GPT_OSS = ModelConfig(
    name="gpt_oss_issue45",
    family="gpt_oss",
    vocab_size=96,
    hidden_size=48,
    num_hidden_layers=3,
    num_attention_heads=6,
    num_key_value_heads=2,
    head_dim=16,
    intermediate_size=40,
    moe=MoEConfig(num_experts=5, num_experts_per_tok=3, intermediate_size=40),
    rope=RopeConfig(type="yarn", theta=150000.0, factor=8.0, original_max_position_embeddings=32),
    qkv_bias=True,
    o_proj_bias=True,
    qk_norm=False,
    tie_word_embeddings=False,
    attention_sinks=True,
    sliding_window=6,
    layer_types=["sliding_attention", "full_attention", "sliding_attention"],
)
DENSE = dict(
    vocab_size=96,
    hidden_size=48,
    num_hidden_layers=2,
    num_attention_heads=6,
    num_key_value_heads=2,
    head_dim=16,
    intermediate_size=1000,
    qk_norm=False,
)
LLAMA = ModelConfig(name="llama_wide_mlp", family="llama", **DENSE)
QWEN2 = ModelConfig(name="qwen2_wide_mlp", family="qwen2", qkv_bias=True, **DENSE)

# (max_batch_size, prefill_chunk, kv mode): one request at a time, ragged small batches with
# chunked prefill, everything at once; persist runs twice (the second call hits the cache).
SCHEDULES = [(1, 0, "recompute"), (3, 5, "recompute"), (16, 0, "recompute"), (3, 0, "persist")]
MICRO_BATCHES = (0, 1, 5)


def _model(cfg: ModelConfig) -> torch.nn.Module:
    model = build_model(cfg, torch.float32, seed=1)
    randomize_(model, 2)  # every bias, sink and norm non-trivial
    return model.eval()


def _requests() -> list[Request]:
    """Four prompts of 9..35 tokens (past the window; odd lengths: mid-row thread splits),
    two samples each, so persist mode finds shared prefixes."""
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 96, (n,), generator=g).tolist() for n in (9, 17, 33, 35)]
    return [
        Request(2 * i + s, p, SamplingParams(max_new_tokens=12, seed=100 + 2 * i + s))
        for i, p in enumerate(prompts)
        for s in range(2)
    ]


def _runs(model) -> list[tuple[list[list[int]], torch.Tensor]]:
    """Every schedule's (tokens, generated logprobs) and every micro-batch's scoring of the
    first schedule's tokens, in zero mode; logprobs as one flat tensor in request order."""
    requests, runs = _requests(), []
    with invariance.enabled(invariance.FIXES), torch.no_grad():
        for batch, chunk, kv in SCHEDULES:
            scheduler = Scheduler(
                model, max_batch_size=batch, eos_id=None, kv_mode=kv, prefill_chunk=chunk
            )
            for _ in range(2 if kv == "persist" else 1):
                done = sorted(scheduler.generate(requests), key=lambda c: c.request_id)
                runs.append(([c.tokens for c in done], torch.cat([c.logprobs for c in done])))
            if kv == "persist":
                assert scheduler.stats.prefix_hit_tokens > 0
        prompts, tokens = [r.prompt for r in requests], runs[0][0]
        for micro in MICRO_BATCHES:
            runs.append((tokens, torch.cat(score(model, prompts, tokens, None, micro))))
    return runs


LANES = 16  # an AVX-512 vector of fp32
GRAIN = 32768  # torch's elementwise grain: smaller tensors run on one thread


def place_rounded(fn: Callable[[torch.Tensor], torch.Tensor]) -> Callable:
    """`fn`, except that the last `numel % LANES` elements of each thread's share (two
    halves from GRAIN elements on) are computed in float64 and rounded once, as torch's CPU
    kernels round a vector loop's scalar tail otherwise than its lanes: which elements that
    is depends on the tensor's size, not on the element."""

    def act(x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1)
        out = fn(flat).clone()
        n = flat.numel()
        shares = [(0, n // 2), (n // 2, n)] if n >= GRAIN else [(0, n)]
        for lo, hi in shares:
            tail = (hi - lo) % LANES
            if tail:
                out[hi - tail : hi] = fn(flat[hi - tail : hi].double()).to(x.dtype)
        return out.view(x.shape)

    return act


def _all_equal(runs) -> bool:
    tokens, logprobs = runs[0]
    return all(t == tokens and torch.equal(lp, logprobs) for t, lp in runs[1:])


def test_gpt_oss_every_schedule_and_micro_batch_is_exact():
    assert _all_equal(_runs(_model(GPT_OSS)))


def test_gpt_oss_with_a_place_rounded_sigmoid_is_not(monkeypatch):
    monkeypatch.setattr(activations, "sigmoid", place_rounded(activations.sigmoid))
    assert not _all_equal(_runs(_model(GPT_OSS)))


@pytest.mark.parametrize(
    "cfg", [LLAMA, pytest.param(QWEN2, marks=pytest.mark.slow)], ids=lambda c: c.family
)
def test_dense_on_two_threads_every_schedule_is_exact(cfg):
    torch.set_num_threads(2)
    assert _all_equal(_runs(_model(cfg)))


def test_dense_on_two_threads_with_a_place_rounded_silu_is_not(monkeypatch):
    monkeypatch.setattr(activations, "silu", place_rounded(activations.silu))
    torch.set_num_threads(2)
    assert not _all_equal(_runs(_model(LLAMA)))
