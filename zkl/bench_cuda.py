"""The CUDA benchmark table (`python -m zkl.bench device=cuda`): what zero mode costs on a GPU.

One process, one set of seeded weights, the same requests for every mode. Rows:
- generation tokens/s, zero vs default mode, graphs on in both, at several batch sizes;
- the train step (scoring forward + backward) zero vs default;
- the invariant Triton GEMM vs `torch.mm` (cuBLAS) at 4096^3 and at the model's shapes;
- the decode step vs the memory roofline (bytes a step must read / measured copy bandwidth);
- zkl generation vs transformers' `generate` (static cache), when transformers is installed.
Timings are medians of CUDA-event timed repeats after a warm-up.
"""

from __future__ import annotations

import gc
import statistics
import sys
import time
from collections.abc import Callable

import torch

from zkl import invariance
from zkl.generation.decode import Sampler, decode_one_token
from zkl.generation.engine import GenerationEngine, Request
from zkl.generation.prefill import Admitted, prefill
from zkl.generation.sampling import SamplingParams
from zkl.ops.triton.gemm import gemm
from zkl.trainer.scoring import sequence_logprobs

BATCHES = (1, 16, 64, 256)
PROMPT_LEN = 128
NEW_TOKENS = 128
TRAIN_SEQS, TRAIN_LEN = 16, 512  # the train step: 8192 tokens a forward + backward
MODES = {"zero": frozenset(invariance.FIXES), "default": frozenset()}


def cuda_time(fn: Callable[[], object], repeats: int = 5, warmup: int = 1) -> float:
    """Median seconds of `fn` (CUDA events around each call, after `warmup` calls)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def graph_time(fn: Callable[[], object], calls: int = 20, replays: int = 5) -> float:
    """Seconds per call of `fn`, `calls` calls captured in one CUDA graph and replayed.

    A decode-shaped GEMM runs in microseconds, under the host's launch time: timed call by
    call it measures the launcher, and the engine replays graphs anyway.
    """
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return cuda_time(graph.replay, repeats=replays) / calls


def bench_requests(batch: int, vocab: int, seed: int = 0) -> list[Request]:
    """`batch` requests of PROMPT_LEN random tokens, each producing exactly NEW_TOKENS."""
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(0, vocab, (batch, PROMPT_LEN), generator=g).tolist()
    params = [SamplingParams(max_new_tokens=NEW_TOKENS, seed=i) for i in range(batch)]
    return [Request(i, p, sp) for i, (p, sp) in enumerate(zip(prompts, params))]


def generation(model: torch.nn.Module, batch: int, fixes: frozenset[str]) -> dict[str, object]:
    """Tokens/s of one batch (end to end and decode only) with graphs on, after a warm-up.

    Should capture fail, the row is measured eagerly and says so (`graphs` 0 and the error),
    so one broken capture costs one figure's comparability, not the whole table.
    """
    try:
        return {**_generation(model, batch, fixes, "on"), "graphs": 1}
    except Exception as exc:  # noqa: BLE001 - reported in the row, and on stderr
        print(f"zkl.bench: graphs failed at batch {batch}: {exc!r}", file=sys.stderr)
        gc.collect()
        torch.cuda.empty_cache()
        return {**_generation(model, batch, fixes, "off"), "graphs": 0, "graphs_error": repr(exc)}


def _generation(
    model: torch.nn.Module, batch: int, fixes: frozenset[str], graphs: str
) -> dict[str, float]:
    requests = bench_requests(batch, model.cfg.vocab_size)
    with invariance.enabled(fixes):
        engine = GenerationEngine(
            model, max_batch_size=batch, eos_id=None, sync_every=16, cuda_graphs=graphs
        )
        engine.generate(requests)  # capture and warm-up
        samples = []
        for _ in range(3):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            done = engine.generate(requests)
            torch.cuda.synchronize()
            total = time.perf_counter() - t0
            samples.append((total, engine.stats.decode_s, engine.stats.decode_steps))
    total, decode_s, steps = min(samples)
    tokens = sum(len(c.tokens) for c in done)
    return {
        "gen_tokens_per_s": tokens / total,
        "decode_tokens_per_s": batch * steps / decode_s,
        "decode_step_ms": 1e3 * decode_s / steps,
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


def gemm_shapes(cfg) -> list[tuple[str, int, int]]:
    """(name, K, N) of the model's Linear layers."""
    h, d = cfg.hidden_size, cfg.head_dim
    q, kv = cfg.num_attention_heads * d, cfg.num_key_value_heads * d
    return [
        ("qkv", h, q + 2 * kv),
        ("o_proj", q, h),
        ("gate_up", h, 2 * cfg.intermediate_size),
        ("down", cfg.intermediate_size, h),
        ("lm_head", h, cfg.vocab_size),
    ]


# Tile configs (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages) timed beside the one M picks, each
# checked bitwise against the fixed tile: the data behind `zkl.ops.triton.gemm.config_for`.
TILE_CANDIDATES = (
    (128, 256, 64, 8, 3),
    (128, 128, 128, 8, 3),
    (128, 128, 64, 8, 4),
    (64, 128, 64, 4, 4),
    (64, 64, 128, 4, 4),
    (64, 32, 256, 4, 4),
    (64, 16, 256, 4, 4),
    (64, 64, 64, 4, 4),
)


def gemm_rows(cfg, configs=TILE_CANDIDATES) -> dict[str, float]:
    """The invariant GEMM vs cuBLAS at 4096^3 and the model's train and decode shapes, and at
    each shape every candidate tile: its speed over cuBLAS and whether its bits are the
    fixed tile's. One pass: the inputs and the cuBLAS timing serve every config."""
    shapes = [("4096^3", 4096, 4096, 4096)]
    for m, label in ((TRAIN_SEQS * TRAIN_LEN, "train"), (64, "decode64"), (256, "decode256")):
        shapes += [(f"{label}/{name}_M{m}_K{k}_N{n}", m, k, n) for name, k, n in gemm_shapes(cfg)]
    out: dict[str, float] = {}
    for label, m, k, n in shapes:
        out.update(gemm_at(label, m, k, n, configs))
    return out


def gemm_at(label: str, m: int, k: int, n: int, configs=TILE_CANDIDATES) -> dict[str, float]:
    """`gemm/<label>/…`: TFLOP/s of the invariant GEMM (the tile M picks) and of cuBLAS, their
    ratio, and whether its bits are the fixed tile's (bf16); `tiles/<label>/<config>/…`: each
    candidate tile's speed over cuBLAS and its bits vs the fixed tile."""
    from zkl.ops.triton.gemm import config_for, fixed_config

    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
    w = (torch.randn(n, k, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
    w_t = w.t()
    reference = gemm(x, w, config=fixed_config(k, n, torch.bfloat16))
    ours = graph_time(lambda: gemm(x, w))
    cublas = graph_time(lambda: torch.mm(x, w_t))
    flops = 2.0 * m * k * n
    out = {
        f"gemm/{label}/zkl_tflops": flops / ours / 1e12,
        f"gemm/{label}/cublas_tflops": flops / cublas / 1e12,
        f"gemm/{label}/zkl_over_cublas": cublas / ours,
        f"gemm/{label}/zkl_bitwise_fixed": float(torch.equal(gemm(x, w), reference)),
        f"gemm/{label}/tile": "x".join(map(str, config_for(m, k, n, torch.bfloat16))),
    }
    for config in configs:
        key = f"tiles/{label}/{'x'.join(map(str, config))}"
        try:
            seconds = graph_time(lambda c=config: gemm(x, w, config=c))
            same = torch.equal(gemm(x, w, config=config), reference)
        except Exception as exc:  # noqa: BLE001 - e.g. a tile too big for shared memory
            out[f"{key}/error"] = type(exc).__name__
            continue
        out[f"{key}/over_cublas"] = cublas / seconds
        out[f"{key}/bitwise_equal"] = float(same)
    return out


def copy_bandwidth() -> float:
    """Bytes/s of a device-to-device copy of 2 GiB (read + write counted)."""
    src = torch.empty(1 << 30, dtype=torch.int16, device="cuda")
    dst = torch.empty_like(src)
    seconds = cuda_time(lambda: dst.copy_(src), repeats=10, warmup=2)
    return 2 * src.numel() * src.element_size() / seconds


def decode_bytes(model: torch.nn.Module, batch: int, mean_keys: float) -> float:
    """Bytes one decode step must move: every weight but the embedding's gathered rows, once,
    plus each row's cached K/V up to its position and the new K/V it writes."""
    cfg = model.cfg
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    if not cfg.tie_word_embeddings:  # the embedding table is only gathered, a row per token
        weights -= model.embed_tokens.weight.numel() * model.embed_tokens.weight.element_size()
    per_token_kv = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim
    per_token_kv *= model.embed_tokens.weight.element_size()
    return weights + batch * (mean_keys + 1) * per_token_kv


def hf_generate(model: torch.nn.Module, batch: int) -> dict[str, float] | str:
    """Tokens/s of transformers' `generate` (static cache) on the same weights and batch.

    transformers is not a zkl dependency: imported here only; a string says why it was skipped.
    """
    try:
        import transformers
    except ImportError:
        return "transformers is not installed"
    cfg = model.cfg
    if cfg.family != "qwen2" or cfg.num_experts:
        return f"the comparison maps only dense qwen2 models, not {cfg.family}"
    hf_cfg = transformers.Qwen2Config(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        rope_theta=cfg.rope_theta,
        rms_norm_eps=cfg.rms_norm_eps,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=cfg.tie_word_embeddings,
    )
    device = model.embed_tokens.weight.device
    with torch.device(device):
        hf = transformers.Qwen2ForCausalLM(hf_cfg).to(torch.bfloat16).eval()
    state = {
        (name if name.startswith("lm_head") else f"model.{name}"): p
        for name, p in model.state_dict().items()
    }
    missing, unexpected = hf.load_state_dict(state, strict=False)
    missing = [m for m in missing if not (cfg.tie_word_embeddings and m == "lm_head.weight")]
    if missing or unexpected:
        return f"weights do not map onto transformers' Qwen2: {(missing + unexpected)[:3]}"
    requests = bench_requests(batch, cfg.vocab_size)
    ids = torch.tensor([r.prompt for r in requests], device=device)
    kwargs = dict(
        max_new_tokens=NEW_TOKENS,
        min_new_tokens=NEW_TOKENS,
        do_sample=False,
        cache_implementation="static",
        disable_compile=True,  # a compile would not fit the benchmark's time budget
        pad_token_id=0,
    )
    with torch.no_grad():
        seconds = cuda_time(lambda: hf.generate(ids, **kwargs), repeats=2, warmup=1)
    return {"gen_tokens_per_s": batch * NEW_TOKENS / seconds, "version": transformers.__version__}


def run_cuda_bench(
    model: torch.nn.Module,
    batches: tuple[int, ...] = BATCHES,
    checkpoint: Callable[[dict], None] | None = None,
) -> dict:
    """Every row of the CUDA table, as one flat dict (also the JSON written by zkl.bench).

    `checkpoint(partial)` is called after each section, so a run cut short by a time limit
    still leaves the rows it measured.
    """
    save = checkpoint or (lambda partial: None)
    out: dict[str, object] = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "prompt_len": PROMPT_LEN,
        "new_tokens": NEW_TOKENS,
    }
    try:
        import triton

        out["triton"] = triton.__version__
    except ImportError:  # pragma: no cover - the CUDA path imports Triton already
        pass
    bandwidth = copy_bandwidth()
    out["copy_bandwidth_tb_s"] = bandwidth / 1e12
    # The figures the speed goals are set at first (batch 64, train step, GEMMs with the tile
    # candidates beside them, transformers), the other batch sizes last, so a time-boxed run
    # that is cut short still leaves those.
    hf_batch = 64 if 64 in batches else batches[-1]
    _generation_rows(out, model, hf_batch, bandwidth)
    save(out)
    for mode, fixes in MODES.items():
        out[f"train/{mode}/step_s"] = train_step(model, fixes)
    out["train/zero_over_default_time"] = out["train/zero/step_s"] / out["train/default/step_s"]
    save(out)
    out.update(gemm_rows(model.cfg))
    save(out)
    try:
        hf = hf_generate(model, hf_batch)
    except Exception as exc:  # noqa: BLE001 - a peer's failure is a row, not the table's end
        print(f"zkl.bench: transformers' generate failed: {exc!r}", file=sys.stderr)
        hf = f"failed: {exc!r}"
    if isinstance(hf, str):
        out["hf/skipped"] = hf
    else:
        out[f"hf/b{hf_batch}/gen_tokens_per_s"] = hf["gen_tokens_per_s"]
        out["hf/version"] = hf["version"]
        zkl_rate = out[f"gen/b{hf_batch}/zero/gen_tokens_per_s"]
        out[f"hf/b{hf_batch}/zkl_zero_over_hf"] = zkl_rate / hf["gen_tokens_per_s"]
    save(out)
    for batch in batches:
        if batch != hf_batch:
            _generation_rows(out, model, batch, bandwidth)
            save(out)
    return out


def _generation_rows(out: dict, model: torch.nn.Module, batch: int, bandwidth: float) -> None:
    """Zero vs default generation at one batch size, and the decode step vs the roofline."""
    for mode, fixes in MODES.items():
        for key, value in generation(model, batch, fixes).items():
            out[f"gen/b{batch}/{mode}/{key}"] = value
    zero, default = (out[f"gen/b{batch}/{m}/gen_tokens_per_s"] for m in MODES)
    out[f"gen/b{batch}/zero_over_default"] = zero / default
    step_s = out[f"gen/b{batch}/zero/decode_step_ms"] / 1e3
    mean_keys = PROMPT_LEN + NEW_TOKENS / 2
    roofline_s = decode_bytes(model, batch, mean_keys) / bandwidth
    out[f"roofline/b{batch}/step_ms"] = 1e3 * roofline_s
    out[f"roofline/b{batch}/zero_fraction"] = roofline_s / step_s
    default_step_s = out[f"gen/b{batch}/default/decode_step_ms"] / 1e3
    out[f"roofline/b{batch}/default_fraction"] = roofline_s / default_step_s
    gc.collect()  # each engine holds its graphs' memory pool until collected
    torch.cuda.empty_cache()


def profile_decode_step(model: torch.nn.Module, batch: int, fixes: frozenset[str]) -> str:
    """A torch.profiler table of one eager decode step at `batch` rows (kernels by CUDA time).

    Eager, not replayed, so the table names every kernel; the graph replay runs the same ones.
    """
    from torch.profiler import ProfilerActivity, profile

    from zkl.precision import weight_cache

    device = model.embed_tokens.weight.device
    requests = bench_requests(batch, model.cfg.vocab_size)
    engine = GenerationEngine(model, max_batch_size=batch, eos_id=None, cuda_graphs="off")
    with invariance.enabled(fixes), torch.no_grad(), weight_cache(engine.quant_cache):
        sampler = Sampler(top_k=False, top_p=False, eos_id=None)
        cache, state = engine.new_buffers(PROMPT_LEN + 8, 8)
        admitted = [Admitted(slot, r.prompt, r.params) for slot, r in enumerate(requests)]
        prefill(model, cache, state, admitted, sampler, None, 0, 0)
        rows = torch.arange(batch, device=device)
        for _ in range(3):  # compile and warm up
            decode_one_token(model, cache, state, rows, sampler)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            decode_one_token(model, cache, state, rows, sampler)
            torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="cuda_time_total", row_limit=30)


def format_table(result: dict) -> str:
    """The result as aligned `key value` lines (floats to 4 significant digits)."""
    lines = []
    for key, value in result.items():
        text = f"{value:.4g}" if isinstance(value, float) else str(value)
        lines.append(f"{key:60} {text}")
    return "\n".join(lines)
