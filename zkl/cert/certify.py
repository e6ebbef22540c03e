"""How one bed is certified: step-0 schedules compared token by token, or N real GRPO steps
each exactly zero and each trained (the module docstring of `zkl.cert.certificate`)."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path
from typing import Any

import torch

from zkl import invariance
from zkl.cert.schema import CertRunConfig
from zkl.data.tasks import build_task
from zkl.errors import ConfigError
from zkl.generation.scheduler import Request
from zkl.layouts.generator import build_generator
from zkl.rl import loop
from zkl.rl.metrics import mismatch_metrics
from zkl.rl.trained import untrained_steps
from zkl.run.validate import check_run, validate
from zkl.trainer.build import build_policy
from zkl.trainer.scoring import score

# (max_batch_size, prefill_chunk, arrival order, scoring micro-batch)
SCHEDULES = [
    (1, 0, "natural", 0),
    (3, 5, "reversed", 1),
    (8, 0, "shuffled", 7),
    (5, 16, "shuffled", 3),
]
NUM_PROMPTS = 12


def cert_requests(cfg: CertRunConfig, task, seed: int) -> list[Request]:
    """Prompts of varied length behind the task's shared system prefix, one sample each."""
    prompts = task.varied_prompts(seed, NUM_PROMPTS)
    return loop.sampled_requests(cfg.sampling, prompts, [seed + i for i in range(len(prompts))])


def check(cfg: CertRunConfig) -> None:
    """Every config check the run of `cfg` makes, made before any bed starts."""
    task = build_task(cfg)
    if cfg.cert.steps == 0 and cfg.trainer.world_size > 1:
        raise ConfigError(
            "cert.steps=0 runs in one process; certify trainer.world_size="
            f"{cfg.trainer.world_size} with cert.steps=N (N >= 2): its ranks run N GRPO steps."
        )
    if cfg.cert.steps == 0:
        longest = max(len(r.prompt) for r in cert_requests(cfg, task, cfg.seed))
        validate(cfg, len(task.tokenizer), longest + 1 + cfg.sampling.max_new_tokens)
    else:
        check_run(cfg)  # the loop's steps start checked, as `python -m zkl` starts them


def certify_step0(cfg: CertRunConfig) -> dict[str, Any]:
    """Generate under every schedule, score under several groupings, compare every token."""
    check(cfg)
    task = build_task(cfg)
    requests = cert_requests(cfg, task, cfg.seed)
    lp_train, lp_gen = [], []
    with invariance.enabled(invariance.from_config(cfg)):
        policy = build_policy(cfg)
        generator = build_generator(cfg, policy, task.tokenizer.eos_id)
        try:
            generator.refit(policy.refit_state(), policy.version)
            for i, (batch_size, chunk, order, micro) in enumerate(SCHEDULES):
                generator.configure(batch_size, chunk)
                ordered = list(requests)
                if order == "reversed":
                    ordered.reverse()
                elif order == "shuffled":
                    random.Random(i).shuffle(ordered)
                completions, _ = generator.generate(ordered)
                scored = score(
                    policy.model,
                    [c.prompt for c in completions],
                    [c.tokens for c in completions],
                    [r.params.temperature for r in ordered],
                    micro,
                )
                lp_train += scored
                lp_gen += [c.logprobs for c in completions]
        finally:
            generator.close()
    metrics = mismatch_metrics(torch.cat(lp_train), torch.cat(lp_gen))
    metrics["tokens"] = int(sum(t.numel() for t in lp_gen))
    metrics.update(steps=1, update_norm=None, weight_version=0, reasons=[])
    return metrics


def certify_steps(cfg: CertRunConfig, run_dir: Path) -> dict[str, Any]:
    """N real GRPO steps; the bed's metrics are the worst step's."""
    cfg = dataclasses.replace(
        cfg,
        rl=dataclasses.replace(cfg.rl, steps=cfg.cert.steps),
        checkpoint=dataclasses.replace(cfg.checkpoint, save=False),  # a bed is never resumed
    )
    rows = loop.run(cfg, run_dir, progress=False)
    worst = max(rows, key=lambda r: r["train/max_abs_logprob_diff"])
    metrics = {k: v for k, v in worst.items() if k.startswith("train/")}
    metrics["train/bitwise_equal_frac"] = min(r["train/bitwise_equal_frac"] for r in rows)
    metrics["train/gen_kl_error"] = max(r["train/gen_kl_error"] for r in rows)
    metrics["tokens"] = int(sum(r["gen/response_tokens"] for r in rows))
    metrics["steps"] = len(rows)
    metrics["nonzero_steps"] = sum(r["train/max_abs_logprob_diff"] != 0.0 for r in rows)
    metrics["update_norm"] = min(r["optim/update_norm"] for r in rows)
    metrics["weight_version"] = rows[-1]["gen/weight_version"]
    metrics["reasons"] = untrained_steps(rows)
    return metrics


def certify(cfg: CertRunConfig, run_dir: Path) -> dict[str, Any]:
    if cfg.cert.steps > 0:
        return certify_steps(cfg, run_dir)
    return certify_step0(cfg)
