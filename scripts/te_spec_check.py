"""Build the Transformer Engine specs on a machine without a GPU, and check zero mode there.

Transformer Engine's modules refuse to be made where `torch.cuda.is_available()` is false, yet
in zero mode every slot runs zkl's kernels, so the TE and inference-optimized models can be
built and run on the CPU when that question (and the device queries made while building)
are answered as on an H100. This checks the spec code against the installed megatron-core
and Transformer Engine before any GPU time: each engine's model is built for `tiny_dense`
and `tiny_moe`, in bf16 and fp32 (the stricter oracle); its zero-mode logits must equal the
native engine's bitwise, and zkl's scheduler over it (chunked prefill, continuous batching,
decode over the KV cache) must give logprobs equal to scoring's bitwise.

    python scripts/te_spec_check.py
in Python 3.12 with zkl's dependencies, megatron-core and Transformer Engine: for instance
scripts/stage_te.sh's .te_build/venv after `pip install --no-deps .whl/*.whl` (make-wheels.sh).
"""

from __future__ import annotations

import sys

import torch

torch.cuda.is_available = lambda: True
torch.cuda.current_device = lambda: 0
torch.cuda.get_device_capability = lambda *_: (9, 0)

from zkl import invariance  # noqa: E402
from zkl.engines import TRANSFORMER_ENGINE, megatron_engines  # noqa: E402
from zkl.generation.sampling import SamplingParams  # noqa: E402
from zkl.generation.scheduler import Request, Scheduler  # noqa: E402
from zkl.megatron.model import build_megatron_model  # noqa: E402
from zkl.models.build import build_model  # noqa: E402
from zkl.run.compose import compose  # noqa: E402
from zkl.trainer.scoring import score  # noqa: E402

# the engines built on Transformer Engine, from the registry
ENGINES = [e.name for e in megatron_engines() if TRANSFORMER_ENGINE in e.needs]
MODELS = ("tiny_dense", "tiny_moe")


def check(engine: str, model: str) -> bool:
    cfg = compose([f"model={model}"]).model
    tokens = torch.randint(0, cfg.vocab_size, (8, 48), generator=torch.Generator().manual_seed(1))
    positions = torch.arange(48).expand(8, 48)
    ok = True
    for dtype in (torch.bfloat16, torch.float32):
        with invariance.enabled(invariance.FIXES), torch.no_grad():
            mega = build_megatron_model(cfg, engine, dtype, 0, "cpu")
            native = build_model(cfg, dtype, seed=0, device="cpu")
            a, b = mega(tokens, positions), native(tokens, positions)
        diff = (a.float() - b.float()).abs().max().item()
        label = f"{engine:20s} {model:11s} {str(dtype).removeprefix('torch.'):8s}"
        print(f"{label} zero mode, logits == native: {torch.equal(a, b)} (max {diff})")
        generated = generated_equals_scored(mega, cfg.vocab_size)
        print(f"{label} zero mode, generated logprobs == scored: {generated}")
        ok = ok and torch.equal(a, b) and generated
    return ok


def generated_equals_scored(model: torch.nn.Module, vocab_size: int) -> bool:
    g = torch.Generator().manual_seed(2)
    lengths = torch.randint(3, 20, (6,), generator=g).tolist()
    requests = [
        Request(
            i,
            torch.randint(2, vocab_size, (n,), generator=g).tolist(),
            SamplingParams(max_new_tokens=8, seed=i),
        )
        for i, n in enumerate(lengths)
    ]
    with invariance.enabled(invariance.FIXES), torch.no_grad():
        done = Scheduler(model, max_batch_size=4, eos_id=1, prefill_chunk=5).generate(requests)
        scored = score(model, [c.prompt for c in done], [c.tokens for c in done])
    return all(torch.equal(c.logprobs, s) for c, s in zip(done, scored))


if __name__ == "__main__":
    results = [check(engine, model) for engine in ENGINES for model in MODELS]
    sys.exit(0 if all(results) else 1)
