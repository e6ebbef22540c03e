"""The CUDA benchmark table (`python -m zkl.bench device=cuda`): what zero mode costs on a GPU.

One process, one set of seeded weights, the same requests for every mode. Rows:
- generation tokens/s, zero vs default mode, graphs on in both, at several batch sizes;
- the train step (scoring forward + backward) zero vs default;
- the invariant Triton GEMM vs `torch.mm` (cuBLAS) at 4096^3 and at the model's shapes, with
  the candidate tiles (`bench_gemm`);
- the decode step vs the memory roofline (`roofline`);
- zkl generation vs transformers' `generate` (`bench_hf`), when transformers is installed.
For an MoE model the table is generation at batches 16, 64 and 256 with peak memory, the
train step and the roofline over the bytes of the experts a step actually reads (the dense
GEMM tiles and transformers' dense comparison do not apply).
Timings are medians of CUDA-event timed repeats after a warm-up.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable, Iterator

import torch
import triton
from torch.profiler import ProfilerActivity, profile

from zkl import invariance
from zkl.console import say
from zkl.generation.decode import Sampler, decode_one_token
from zkl.generation.prefill import Admitted, prefill
from zkl.generation.scheduler import Scheduler
from zkl.lab.bench_gemm import gemm_rows
from zkl.lab.bench_hf import hf_generate
from zkl.lab.roofline import copy_bandwidth, decode_bytes, moe_layers
from zkl.lab.timing import cuda_time
from zkl.lab.workload import (
    MODES,
    NEW_TOKENS,
    PROMPT_LEN,
    TRAIN_LEN,
    TRAIN_SEQS,
    bench_requests,
)
from zkl.ops import fastest_attention
from zkl.precision.recipes import weight_cache
from zkl.trainer.scoring import sequence_logprobs

BATCHES = (1, 16, 64, 256)
MOE_BATCHES = (16, 64, 256)


def generation(model: torch.nn.Module, batch: int, fixes: frozenset[str]) -> dict[str, object]:
    """Tokens/s of one batch (end to end and decode only) with graphs on, after a warm-up.

    Should capture fail, the row is measured eagerly and says so (`graphs` 0 and the error),
    so one broken capture costs one figure's comparability, not the whole table.
    """
    try:
        return {**_generation(model, batch, fixes, "on"), "graphs": 1}
    except Exception as exc:  # noqa: BLE001 - reported in the row, and on stderr
        say(f"zkl.bench: graphs failed at batch {batch}: {exc!r}")
        gc.collect()
        torch.cuda.empty_cache()
        return {**_generation(model, batch, fixes, "off"), "graphs": 0, "graphs_error": repr(exc)}


def _generation(
    model: torch.nn.Module, batch: int, fixes: frozenset[str], graphs: str
) -> dict[str, float]:
    requests = bench_requests(batch, model.cfg.vocab_size)
    with invariance.enabled(fixes):
        scheduler = Scheduler(
            model, max_batch_size=batch, eos_id=None, sync_every=16, cuda_graphs=graphs
        )
        scheduler.generate(requests)  # capture and warm-up
        torch.cuda.reset_peak_memory_stats()
        samples = []
        for _ in range(3):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            done = scheduler.generate(requests)
            torch.cuda.synchronize()
            total = time.perf_counter() - t0
            samples.append((total, scheduler.stats.decode_s, scheduler.stats.decode_steps))
    total, decode_s, steps = min(samples)
    tokens = sum(len(c.tokens) for c in done)
    return {
        "gen_tokens_per_s": tokens / total,
        "decode_tokens_per_s": batch * steps / decode_s,
        "decode_step_ms": 1e3 * decode_s / steps,
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30,
    }


def train_step(model: torch.nn.Module, fixes: frozenset[str]) -> float:
    """Seconds of one scoring forward + backward over TRAIN_SEQS x TRAIN_LEN tokens."""
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, model.cfg.vocab_size, (TRAIN_SEQS, TRAIN_LEN), generator=g)
    tokens = tokens.to(model.embed_tokens.weight.device)

    def step() -> None:
        model.zero_grad(set_to_none=True)
        sequence_logprobs(model, tokens).mean().backward()

    with invariance.enabled(fixes):
        seconds = cuda_time(step, repeats=3)
    model.zero_grad(set_to_none=True)
    return seconds


def run_cuda_bench(
    model: torch.nn.Module,
    batches: tuple[int, ...] | None = None,
    checkpoint: Callable[[dict], None] | None = None,
) -> dict:
    """Every row of the CUDA table, as one flat dict (also the JSON written by zkl.bench).

    `checkpoint(partial)` is called after each section, so a run cut short by a time limit
    still leaves the rows it measured.
    """
    keep = checkpoint or (lambda partial: None)

    def save(partial: dict) -> None:
        partial["default/attention_forms"] = attention_forms()
        keep(partial)

    moe = model.cfg.is_moe
    batches = batches or (MOE_BATCHES if moe else BATCHES)
    out: dict[str, object] = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "prompt_len": PROMPT_LEN,
        "new_tokens": NEW_TOKENS,
    }
    out["triton"] = triton.__version__
    bandwidth = copy_bandwidth()
    out["copy_bandwidth_tb_s"] = bandwidth / 1e12
    # The figures the speed goals are set at first (batch 64, train step, GEMMs with the tile
    # candidates beside them, transformers), the other batch sizes last, so a time-boxed run
    # that is cut short still leaves those.
    first_batch = 64 if 64 in batches else batches[-1]
    _generation_rows(out, model, first_batch, bandwidth)
    save(out)
    for mode, fixes in MODES.items():
        out[f"train/{mode}/step_s"] = train_step(model, fixes)
    out["train/zero_over_default_time"] = out["train/zero/step_s"] / out["train/default/step_s"]
    save(out)
    if not moe:  # the dense GEMM tiles and transformers' dense model
        out.update(gemm_rows(model.cfg))
        save(out)
        out.update(_hf_rows(out, model, first_batch))
        save(out)
    for batch in batches:
        if batch != first_batch:
            _generation_rows(out, model, batch, bandwidth)
            save(out)
    out["default/attention_forms"] = attention_forms()
    return out


def attention_forms() -> str:
    """Which attention the default path ran at each shape it met (`fastest_attention`)."""
    chosen = fastest_attention.chosen()
    return "; ".join(
        f"{kind} b{batch} q{num_q} keys{keys}{' grad' if grad else ''}: {name}"
        for (kind, batch, num_q, keys, grad), name in sorted(chosen.items())
    )


def _hf_rows(out: dict, model: torch.nn.Module, batch: int) -> dict[str, object]:
    """transformers' `generate` at `batch` beside zkl's zero-mode rate in `out`."""
    try:
        hf = hf_generate(model, batch)
    except Exception as exc:  # noqa: BLE001 - a peer's failure is a row, not the table's end
        say(f"zkl.bench: transformers' generate failed: {exc!r}")
        hf = f"failed: {exc!r}"
    if isinstance(hf, str):
        return {"hf/skipped": hf}
    zkl_rate = out[f"gen/b{batch}/zero/gen_tokens_per_s"]
    return {
        f"hf/b{batch}/gen_tokens_per_s": hf["gen_tokens_per_s"],
        "hf/version": hf["version"],
        f"hf/b{batch}/zkl_zero_over_hf": zkl_rate / hf["gen_tokens_per_s"],
    }


def _generation_rows(out: dict, model: torch.nn.Module, batch: int, bandwidth: float) -> None:
    """Zero vs default generation at one batch size, and the decode step vs the roofline."""
    for mode, fixes in MODES.items():
        for key, value in generation(model, batch, fixes).items():
            out[f"gen/b{batch}/{mode}/{key}"] = value
    zero, default = (out[f"gen/b{batch}/{m}/gen_tokens_per_s"] for m in MODES)
    out[f"gen/b{batch}/zero_over_default"] = zero / default
    step_s = out[f"gen/b{batch}/zero/decode_step_ms"] / 1e3
    mean_keys = PROMPT_LEN + NEW_TOKENS / 2
    experts = experts_read(model, batch) if model.cfg.is_moe else None
    if experts is not None:
        out[f"roofline/b{batch}/experts_read_per_layer"] = sum(experts) / len(experts)
    roofline_s = decode_bytes(model, batch, mean_keys, experts) / bandwidth
    out[f"roofline/b{batch}/step_ms"] = 1e3 * roofline_s
    out[f"roofline/b{batch}/zero_fraction"] = roofline_s / step_s
    default_step_s = out[f"gen/b{batch}/default/decode_step_ms"] / 1e3
    out[f"roofline/b{batch}/default_fraction"] = roofline_s / default_step_s
    gc.collect()  # each scheduler holds its graphs' memory pool until collected
    torch.cuda.empty_cache()


def eager_decode_step(
    model: torch.nn.Module,
    batch: int,
    fixes: frozenset[str],
    around: Callable[[], contextlib.AbstractContextManager],
) -> None:
    """The bench's prompts prefilled at `batch` rows, three warm-up decode steps, then one
    more inside the context manager `around()`: eager, so every kernel and module runs from
    Python where a profiler or a hook sees it."""
    device = model.embed_tokens.weight.device
    requests = bench_requests(batch, model.cfg.vocab_size)
    scheduler = Scheduler(model, max_batch_size=batch, eos_id=None, cuda_graphs="off")
    with invariance.enabled(fixes), torch.no_grad(), weight_cache(scheduler.quant_cache):
        sampler = Sampler(top_k=False, top_p=False, eos_id=None)
        cache, state = scheduler.new_buffers(PROMPT_LEN + 8, 8)
        admitted = [Admitted(slot, r.prompt, r.params) for slot, r in enumerate(requests)]
        prefill(model, cache, state, admitted, sampler, None, 0, 0)
        rows = torch.arange(batch, device=device)
        for _ in range(3):  # compile and warm up
            decode_one_token(model, cache, state, rows, sampler)
        sync = torch.cuda.synchronize if device.type == "cuda" else lambda: None
        sync()
        with around():
            decode_one_token(model, cache, state, rows, sampler)
            sync()


def profile_decode_step(model: torch.nn.Module, batch: int, fixes: frozenset[str]) -> str:
    """A torch.profiler table of one eager decode step at `batch` rows (kernels by CUDA time).

    Eager, not replayed, so the table names every kernel; the graph replay runs the same ones.
    """
    prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
    eager_decode_step(model, batch, fixes, lambda: prof)
    return prof.key_averages().table(sort_by="cuda_time_total", row_limit=30)


def experts_read(model: torch.nn.Module, batch: int) -> list[int]:
    """Per MoE layer, how many distinct experts one zero-mode decode step at `batch` rows
    routes to: the experts whose weights that step must read."""
    counts: list[int] = []

    def count(layer: torch.nn.Module, args: tuple) -> None:
        top_i, _ = layer.route(args[0].reshape(-1, args[0].shape[-1]))
        counts.append(int(top_i.unique().numel()))

    @contextlib.contextmanager
    def hooked() -> Iterator[None]:
        handles = [m.register_forward_pre_hook(count) for m in moe_layers(model)]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    eager_decode_step(model, batch, MODES["zero"], hooked)
    return counts
