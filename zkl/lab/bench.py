"""`python -m zkl.bench`: what zero-mismatch mode costs, measured side by side in one run.

Generation and scoring of the same rollout batch with every fix on and with every fix off,
interleaved REPEATS (5) times; reports tokens/s of each and the ratio. For a model with
Mamba layers a third mode, every fix but `mamba_chunked_decode`, isolates what that fix
costs decode (decode tokens/s: decode steps only, prefill excluded). With
`+layout=dedicated` it also times REPEATS refits to the generation process (GB/s of the
refit buffer) against the transport's own bandwidth between the two sides, measured in the
same run with buffers of the same size. The same Hydra config and overrides as
`python -m zkl`. On CUDA a model without Mamba layers gets the table of `bench_cuda`
instead (graphs, batch sizes, the train step, GEMMs, the roofline, transformers), or with
`+layout=dedicated` the refit figures alone (the scheduler's kernels do not depend on the
layout), except for an engine that runs dedicated only (`engine=inference_optimized`), whose
table this is.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from zkl import console, invariance, threads
from zkl.data.tasks import build_task
from zkl.device import resolve_device
from zkl.engines import engine_named
from zkl.lab import bench_rl
from zkl.lab.config import check_bench
from zkl.lab.schema import BenchRunConfig
from zkl.lab.timing import format_table
from zkl.lab.transport_peak import peak_gb_per_s
from zkl.lab.workload import MODES
from zkl.layouts.generator import build_generator
from zkl.layouts.generator_setup import build_scheduler
from zkl.layouts.refit import refit_payload
from zkl.layouts.transport import BROADCAST
from zkl.precision.recipes import DTYPES
from zkl.rl.loop import make_requests
from zkl.run.compose import to_object
from zkl.run.validate import validate_run
from zkl.trainer.build import build_policy
from zkl.trainer.policy import Policy
from zkl.trainer.scoring import score

REPEATS = 5


def measure(
    cfg: BenchRunConfig, fixes: frozenset[str], policy: Policy, requests
) -> tuple[float, float, float]:
    """(generation, scoring, decode-only) tokens/s of one rollout batch under `fixes`."""
    with invariance.enabled(fixes):
        scheduler = build_scheduler(cfg, policy.model, eos_id=-1)  # no EOS: fixed token count
        t0 = time.perf_counter()
        done = scheduler.generate(requests)
        t1 = time.perf_counter()
        score(policy.model, [c.prompt for c in done], [c.tokens for c in done])
        if policy.model.embed_tokens.weight.is_cuda:
            torch.cuda.synchronize()  # the scores are queued on the device until here
        t2 = time.perf_counter()
    gen_tokens = sum(len(c.tokens) for c in done)
    scored = sum(len(c.prompt) + len(c.tokens) for c in done)
    decoded = gen_tokens - len(done)  # each request's first token comes from its prefill
    return gen_tokens / (t1 - t0), scored / (t2 - t1), decoded / scheduler.stats.decode_s


def measure_refit(cfg: BenchRunConfig, policy: Policy, eos_id: int) -> dict[str, float]:
    """Refit GB/s to the dedicated generator, median of REPEATS, and the transport's peak.

    A refit is timed as the training loop times it (`timing/refit_s`): packing, the
    transfer, the generator's load and its ack. The peak (`transport_peak`) is bare
    broadcasts of a buffer of the same size (gloo on the CPU, NCCL between two GPUs), once
    the generator is closed; CUDA IPC on one GPU has no broadcast to compare against.
    """
    state = policy.refit_state()
    with invariance.enabled(MODES["zero"]):  # zero mode's exact refit
        payload = refit_payload(state, DTYPES[cfg.precision.compute_dtype])
        nbytes = sum(t.numel() * t.element_size() for t in payload.values())
        generator = build_generator(cfg, policy, eos_id)
        try:
            generator.refit(state, policy.version)  # warm-up: buffers, the first connection
            seconds = []
            for _ in range(REPEATS):
                t0 = time.perf_counter()
                generator.refit(state, policy.version)
                seconds.append(time.perf_counter() - t0)
        finally:
            generator.close()
    result = {"refit/bytes": nbytes, "refit/gb_per_s": nbytes / statistics.median(seconds) / 1e9}
    if generator.transport in BROADCAST:
        peak = peak_gb_per_s(cfg, nbytes, REPEATS)
        result["refit/peak_gb_per_s"] = peak
        result["ratio/refit_over_peak"] = result["refit/gb_per_s"] / peak
    return result


def run_bench(cfg: BenchRunConfig, run_dir: str | Path) -> dict[str, float]:
    task = build_task(cfg)
    validate_run(cfg, task)
    check_bench(cfg.bench, resolve_device(cfg.device).type == "cuda")
    threads.apply(cfg)  # as the run it measures
    say(f"building {cfg.model.name} on {cfg.device}; results go to {Path(run_dir) / 'bench.json'}")
    policy = build_policy(cfg)
    hybrid = getattr(policy.model, "num_mamba_layers", 0) > 0
    # A hybrid's figure of merit is its decode with the Mamba fix on vs off (below, on any
    # device); the CUDA table (graphs, GEMMs vs cuBLAS, transformers) is for dense models.
    if policy.model.embed_tokens.weight.is_cuda and cfg.bench.workload == "rl":
        del policy  # each RL shape builds its own
        return run_rl(cfg, run_dir)
    if policy.model.embed_tokens.weight.is_cuda and not hybrid:
        # The scheduler's own table is the same in any layout: a dedicated run gives the
        # refit figures, unless its engine runs dedicated only (then the table is its one).
        dedicated_only = engine_named(cfg.engine.name).dedicated_only
        if cfg.layout.name == "dedicated" and not dedicated_only:
            return write_result(measure_refit(cfg, policy, task.tokenizer.eos_id), run_dir)
        return run_cuda(policy.model, run_dir)
    _, requests = make_requests(cfg, task, step=0)
    modes = dict(MODES)
    if hybrid:
        modes["zero_without_mamba_fix"] = modes["zero"] - {"mamba_chunked_decode"}
    samples: dict[str, list[tuple[float, float, float]]] = {m: [] for m in modes}
    say(f"{len(requests)} requests; a warm-up, then {REPEATS} rounds of {', '.join(modes)}")
    measure(cfg, modes["zero"], policy, requests)  # warm-up
    for repeat in range(REPEATS):
        for mode, fixes in modes.items():
            samples[mode].append(measure(cfg, fixes, policy, requests))
        say(f"round {repeat + 1}/{REPEATS} done")
    result = {"threads": torch.get_num_threads(), "requests": len(requests)}
    for mode in modes:
        result[f"{mode}/gen_tokens_per_s"] = statistics.median(s[0] for s in samples[mode])
        result[f"{mode}/score_tokens_per_s"] = statistics.median(s[1] for s in samples[mode])
        result[f"{mode}/decode_tokens_per_s"] = statistics.median(s[2] for s in samples[mode])
    if cfg.layout.name == "dedicated":
        result.update(measure_refit(cfg, policy, task.tokenizer.eos_id))
    for kind in ("gen", "score"):
        key = f"{kind}_tokens_per_s"
        result[f"ratio/{kind}_zero_over_default"] = result[f"zero/{key}"] / result[f"default/{key}"]
    if hybrid:  # decode time with the fix over without it
        result["ratio/decode_time_mamba_fix_on_over_off"] = (
            result["zero_without_mamba_fix/decode_tokens_per_s"]
            / result["zero/decode_tokens_per_s"]
        )
    return write_result(result, run_dir)


def say(message: str) -> None:
    """Progress on stderr: a benchmark is minutes of silence otherwise."""
    console.say(f"zkl.bench: {message}")


def write_result(result: dict, run_dir: str | Path) -> dict:
    """bench.json in the run directory, one line per figure on stdout, then where it went."""
    path = Path(run_dir) / "bench.json"
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))
    for key, value in result.items():
        print(f"{key:36} {value:.4g}" if isinstance(value, float) else f"{key:36} {value}")
    print(f"results: {path}")
    return result


def run_cuda(model: torch.nn.Module, run_dir: str | Path) -> dict:
    """The CUDA table (`bench_cuda`): bench.json, and a profile of one decode step per mode."""
    from zkl.lab import bench_cuda  # needs Triton, optional on the CPU

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)

    def save(partial: dict) -> None:
        (run_dir / "bench.json").write_text(json.dumps(partial, indent=1))

    result = bench_cuda.run_cuda_bench(model, checkpoint=save)
    save(result)
    print(format_table(result))
    print(f"results: {run_dir / 'bench.json'}")
    for mode, fixes in MODES.items():
        table = bench_cuda.profile_decode_step(model, 64, fixes)
        (run_dir / f"profile_decode_b64_{mode}.txt").write_text(table)
    return result


def run_rl(cfg: BenchRunConfig, run_dir: str | Path) -> dict:
    """The RL-shaped rows (`bench_rl`), bench.json saved after every shape."""
    path = Path(run_dir) / "bench.json"
    path.parent.mkdir(parents=True, exist_ok=True)

    def save(partial: dict) -> None:
        path.write_text(json.dumps(partial, indent=1))

    result = bench_rl.run_rl_bench(cfg, save)
    save(result)
    print(format_table(result))
    print(f"zkl.bench: wrote {path}")
    return result


def bench(dcfg: DictConfig) -> None:
    run_bench(to_object(dcfg), HydraConfig.get().runtime.output_dir)
