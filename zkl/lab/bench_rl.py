"""The RL-shaped CUDA bench (`python -m zkl.bench device=cuda bench.workload=rl`).

Reasoning RL generates long responses after long prompts and trains on those lengths, so
this times, zero mode against the matched default path (the same weights and requests):
- generation alone at each `bench.gen_shapes` shape (prompt x response tokens x rollouts,
  EOS off): tokens/s, decode step, the decode roofline fraction (weights plus the KV bytes
  each step must read), peak memory;
- the whole GRPO step (generation, scoring, update, refit: the loop's own `train_step`) at
  each `bench.step_shapes` shape, with the memory estimate beside the measured peak.

Each mode gets a warm-up first (kernels compiled, probes run, graphs captured), then the
timed run; the policy's state is restored before every step, so every timed step starts
from the same weights. The update runs one minibatch per sequence (`rl.num_minibatches` =
rollouts), so a long sequence's activations are one sequence's.
"""

from __future__ import annotations

import copy
import gc
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from zkl import invariance, memory
from zkl.data.tasks import ResidueTask, build_task
from zkl.generation.scheduler import Scheduler
from zkl.lab.roofline import copy_bandwidth, decode_bytes
from zkl.lab.workload import MODES
from zkl.layouts.generator import build_generator
from zkl.rl.loop import make_requests, train_step
from zkl.rl.loss import grpo_loss
from zkl.run.validate import validate_run
from zkl.trainer.build import build_policy
from zkl.trainer.policy import Policy

SCORE_TOKENS = 65536  # tokens a scoring forward


def parse_shape(shape: str) -> tuple[int, int, int]:
    """'PROMPTxRESPONSExROLLOUTS' -> ints, e.g. '4096x4096x64'."""
    try:
        prompt, response, rollouts = (int(part) for part in shape.lower().split("x"))
    except ValueError:
        raise ValueError(f"bench shape {shape!r} is not PROMPTxRESPONSExROLLOUTS") from None
    if prompt <= ResidueTask.PREFIX_LEN or response < 1 or rollouts < 1 or rollouts % 8:
        raise ValueError(
            f"bench shape {shape!r} needs a prompt over {ResidueTask.PREFIX_LEN} tokens, a "
            "response of at least 1 and rollouts a multiple of 8"
        )
    return prompt, response, rollouts


def shaped_config(cfg: Any, prompt: int, response: int, rollouts: int) -> Any:
    """`cfg` at one RL shape: residue prompts of exactly `prompt` tokens, 8 samples a prompt."""
    c = copy.deepcopy(cfg)
    c.task.name = "residue"
    c.task.min_prompt_len = c.task.max_prompt_len = prompt - ResidueTask.PREFIX_LEN
    c.sampling.max_new_tokens = response
    c.sampling.ignore_eos = True
    c.rl.samples_per_prompt = 8
    c.rl.prompts_per_step = rollouts // 8
    c.rl.num_minibatches = rollouts
    c.rl.score_micro_batch = max(1, SCORE_TOKENS // (prompt + response))
    c.scheduler.max_batch_size = rollouts
    c.scheduler.cuda_graphs = "auto"
    c.tracking.dump_tokens = "0"
    return c


class _MemoryLog:
    """The loop's log, kept in memory: a bench writes no run directory per step."""

    def __init__(self) -> None:
        self.rows: list[dict] = []

    def log(self, step: int, row: dict, records: list | None = None) -> None:
        self.rows.append(row)

    def log_tokens(self, records: list) -> None:
        pass


def _fresh() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _peak_gb() -> float:
    """The device's peak since `_fresh` (0 on the CPU, where the smoke test runs)."""
    return torch.cuda.max_memory_allocated() / 1e9 if torch.cuda.is_available() else 0.0


def generation_rows(cfg: Any, shape: str, bandwidth: float) -> dict[str, object]:
    prompt, response, rollouts = parse_shape(shape)
    c = shaped_config(cfg, prompt, response, rollouts)
    task = build_task(c)
    policy = build_policy(c)
    _, requests = make_requests(c, task, step=0)
    out: dict[str, object] = {}
    key = f"rl_gen/{shape}"
    for mode, fixes in MODES.items():
        _fresh()
        with invariance.enabled(fixes):
            scheduler = Scheduler(
                policy.model, max_batch_size=rollouts, eos_id=None, sync_every=16,
                cuda_graphs="auto",
            )  # fmt: skip
            warm = [replace(r, params=replace(r.params, max_new_tokens=32)) for r in requests]
            scheduler.generate(warm)  # compile, probe, capture
            _sync()
            t0 = time.perf_counter()
            done = scheduler.generate(requests)
            _sync()
            seconds = time.perf_counter() - t0
        steps = scheduler.stats.decode_steps
        out[f"{key}/{mode}/gen_tokens_per_s"] = sum(len(d.tokens) for d in done) / seconds
        out[f"{key}/{mode}/decode_step_ms"] = 1e3 * scheduler.stats.decode_s / steps
        out[f"{key}/{mode}/graphs"] = int(getattr(scheduler.decoder, "capture", False))
        out[f"{key}/{mode}/peak_gb"] = _peak_gb()
        del scheduler, done
    out[f"{key}/zero_over_default"] = (
        out[f"{key}/zero/gen_tokens_per_s"] / out[f"{key}/default/gen_tokens_per_s"]
    )
    roofline_s = decode_bytes(policy.model, rollouts, prompt + response / 2) / bandwidth
    out[f"{key}/roofline_step_ms"] = 1e3 * roofline_s
    for mode in MODES:
        out[f"{key}/{mode}/roofline_fraction"] = (
            1e3 * roofline_s / out[f"{key}/{mode}/decode_step_ms"]
        )
    del policy
    return out


def step_rows(cfg: Any, shape: str) -> dict[str, object]:
    prompt, response, rollouts = parse_shape(shape)
    c = shaped_config(cfg, prompt, response, rollouts)
    task = build_task(c)
    out: dict[str, object] = {}
    key = f"rl_step/{shape}"
    positions = task.max_prompt_len + c.sampling.max_new_tokens
    configs, estimates = {}, {}
    for mode in MODES:  # both refusals before any work, against the device's free memory
        configs[mode] = replace(c, zero_train_gen_mismatch=mode == "zero")
        estimates[mode] = memory.peak(memory.estimate(configs[mode], positions))
        validate_run(configs[mode], task)
    policy = build_policy(c, grpo_loss(c.rl))
    initial = {k: v.to("cpu", copy=True) if torch.is_tensor(v) else copy.deepcopy(v)
               for k, v in policy.state_dict().items()}  # fmt: skip
    for mode, fixes in MODES.items():
        c, estimate = configs[mode], estimates[mode]
        with invariance.enabled(fixes):
            generator = build_generator(c, policy, task.tokenizer.eos_id)
            try:
                row = _timed_step(c, task, policy, generator, initial)
            finally:
                generator.close()
        for name in ("timing/gen_s", "timing/score_s", "timing/update_s", "timing/refit_s"):
            out[f"{key}/{mode}/{name.split('/')[1]}"] = row[name]
        out[f"{key}/{mode}/step_s"] = sum(row[n] for n in row if n.startswith("timing/"))
        out[f"{key}/{mode}/gen_kl_error"] = row["train/gen_kl_error"]
        peak = _peak_gb()
        out[f"{key}/{mode}/peak_gb"] = peak
        out[f"{key}/{mode}/estimate_gb"] = estimate / 1e9
        if peak:
            out[f"{key}/{mode}/estimate_over_peak"] = estimate / 1e9 / peak
    out[f"{key}/zero_over_default_time"] = out[f"{key}/zero/step_s"] / out[f"{key}/default/step_s"]
    del policy
    return out


def _timed_step(c, task, policy: Policy, generator, initial: dict) -> dict:
    """A warm-up step, then the timed step, each from the same initial state."""

    def restore() -> None:
        policy.load_state_dict(initial)
        generator.refit(policy.refit_state(), policy.version)

    restore()
    train_step(c, task, policy, generator, 0, _MemoryLog())
    _fresh()
    restore()
    _sync()
    log = _MemoryLog()
    train_step(c, task, policy, generator, 0, log)
    return log.rows[-1]


def run_rl_bench(cfg: Any, save: Callable[[dict], None], bandwidth: float | None = None) -> dict:
    """Every RL row, saved after each shape so a cut-short run keeps what it measured.

    `bandwidth` (bytes/s) defaults to a measured device copy (CUDA only)."""
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    out: dict[str, object] = {"device": device, "torch": torch.__version__}
    bandwidth = bandwidth or copy_bandwidth()
    out["copy_bandwidth_tb_s"] = bandwidth / 1e12
    for shape in cfg.bench.step_shapes:
        out.update(step_rows(cfg, shape))
        save(out)
    for shape in cfg.bench.gen_shapes:
        print(f"zkl.bench: generation at {shape}", flush=True)
        out.update(generation_rows(cfg, shape, bandwidth))
        save(out)
    return out
