"""`python -m zkl.cert`: certify beds (model x layout x precision x kv) bitwise.

Step-0 (`cert.steps=0`): generate with the initial weights under several schedules
(batch sizes, arrival orders, chunked prefill, prompts of varied length behind a shared
prefix) and score every rollout with several micro-batch groupings; every token must agree
bitwise. Multi-step (`cert.steps=N`): N real GRPO steps with updates and refits, every step
exactly zero. `cert.ablate=true` turns each fix off in turn and reports what it contributes.
The process exits 1 when any bed is not exactly zero.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import random
import sys
from pathlib import Path
from typing import Any

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from zkl import invariance
from zkl.config import CONF_DIR, ConfigError, ZklConfig, load_group_option, to_object, validate
from zkl.generation.engine import Request
from zkl.generation.sampling import SamplingParams
from zkl.layouts import build_generator
from zkl.metrics import mismatch_metrics
from zkl.rl import loop
from zkl.rl.policy import Policy
from zkl.rl.task import SYSTEM, build_task
from zkl.scoring import score

# (max_batch_size, prefill_chunk, arrival order, scoring micro-batch)
SCHEDULES = [
    (1, 0, "natural", 0),
    (3, 5, "reversed", 1),
    (8, 0, "shuffled", 7),
    (5, 16, "shuffled", 3),
]
NUM_PROMPTS = 12


def bed_name(cfg: ZklConfig) -> str:
    return f"{cfg.model.name}/{cfg.layout.name}/{cfg.precision.name}/kv_{cfg.kv.mode}"


def beds(cfg: ZklConfig) -> list[ZklConfig]:
    """Every combination of the `cert.*` axes, each a full config."""
    groups = ("model", "precision", "layout", "kv")
    axes = (cfg.cert.models, cfg.cert.precisions, cfg.cert.layouts, cfg.cert.kv)
    out = []
    for options in itertools.product(*axes):
        bed = cfg
        for group, option in zip(groups, options):
            bed = load_group_option(bed, group, option)
        out.append(bed)
    return out


def cert_requests(cfg: ZklConfig, task, seed: int) -> list[Request]:
    """Prompts of varied length behind the task's shared system prefix."""
    rng = random.Random(seed)
    tok = task.tokenizer
    alphabet = tok.encode("0123456789+=abcdefghij ")
    prefix = tok.encode(SYSTEM)
    requests = []
    for i in range(NUM_PROMPTS):
        tail = [rng.choice(alphabet) for _ in range(rng.randint(1, 24))]
        sp = cfg.sampling
        params = SamplingParams(sp.temperature, sp.top_p, sp.top_k, sp.max_new_tokens, seed + i)
        requests.append(Request(i, prefix + tail, params))
    return requests


def certify_step0(cfg: ZklConfig) -> dict[str, Any]:
    """Generate under every schedule, score under several groupings, compare every token."""
    task = build_task(cfg.task.name, cfg.task.max_operand)
    requests = cert_requests(cfg, task, cfg.seed)
    validate(
        cfg,
        len(task.tokenizer),
        max(len(r.prompt) for r in requests) + 1 + cfg.sampling.max_new_tokens,
    )
    fixes = invariance.resolve(cfg.zero_train_gen_mismatch, vars(cfg.fixes))
    lp_train, lp_gen = [], []
    with invariance.enabled(fixes):
        policy = Policy(cfg)
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
    metrics["steps"] = 1
    return metrics


def certify_steps(cfg: ZklConfig, run_dir: Path) -> dict[str, Any]:
    """N real GRPO steps; the bed's metrics are the worst step's."""
    cfg = dataclasses.replace(cfg, rl=dataclasses.replace(cfg.rl, steps=cfg.cert.steps))
    rows = loop.run(cfg, run_dir, progress=False)
    worst = max(rows, key=lambda r: r["train/max_abs_logprob_diff"])
    metrics = {k: v for k, v in worst.items() if k.startswith("train/")}
    metrics["train/bitwise_equal_frac"] = min(r["train/bitwise_equal_frac"] for r in rows)
    metrics["train/gen_kl_error"] = max(r["train/gen_kl_error"] for r in rows)
    metrics["tokens"] = int(sum(r["gen/response_tokens"] for r in rows))
    metrics["steps"] = len(rows)
    metrics["nonzero_steps"] = sum(r["train/max_abs_logprob_diff"] != 0.0 for r in rows)
    return metrics


def certify(cfg: ZklConfig, run_dir: Path) -> dict[str, Any]:
    if cfg.cert.steps > 0:
        return certify_steps(cfg, run_dir)
    return certify_step0(cfg)


def with_fix(cfg: ZklConfig, name: str, value: bool) -> ZklConfig:
    return dataclasses.replace(cfg, fixes=dataclasses.replace(cfg.fixes, **{name: value}))


def run_cert(cfg: ZklConfig, run_dir: str | Path) -> list[dict[str, Any]]:
    """Certify every bed (and, with cert.ablate, every bed with each fix off); print a table."""
    run_dir = Path(run_dir)
    results = []
    all_beds = beds(cfg)
    for bed in all_beds:  # every bed must be valid before any work starts
        validate(bed)
    for bed in all_beds:
        variants = [("all fixes" if bed.zero_train_gen_mismatch else "no fixes", bed)]
        if cfg.cert.ablate:
            variants += [(f"-{name}", with_fix(bed, name, False)) for name in invariance.FIXES]
        for label, variant in variants:
            slug = f"{bed_name(bed)}/{label}".replace("/", "__")
            metrics = certify(variant, run_dir / "beds" / slug)
            results.append({"bed": bed_name(bed), "variant": label, **metrics})
    for r in results:
        r["passed"] = r["train/max_abs_logprob_diff"] == 0.0
    with open(run_dir / "cert.jsonl", "w") as f:
        for r in results:
            f.write(json.dumps(r) + "\n")
    print(format_table(results, cfg.cert.ablate))
    return results


def format_table(results: list[dict[str, Any]], ablate: bool) -> str:
    head = f"{'bed':44} {'variant':30} {'steps':>5} {'tokens':>7} {'max_abs_diff':>12} "
    head += f"{'gen_kl_error':>12} {'bitwise':>8}  result"
    lines = [head, "-" * len(head)]
    for r in results:
        verdict = "PASS" if r["passed"] else "FAIL"
        if ablate and r["variant"].startswith("-"):
            verdict = "no effect on this machine" if r["passed"] else "contributes error"
        lines.append(
            f"{r['bed']:44} {r['variant']:30} {r['steps']:>5} {r['tokens']:>7} "
            f"{r['train/max_abs_logprob_diff']:>12.3g} {r['train/gen_kl_error']:>12.3g} "
            f"{r['train/bitwise_equal_frac']:>8.3f}  {verdict}"
        )
    return "\n".join(lines)


@hydra.main(config_path=CONF_DIR, config_name="config", version_base=None)
def main(dcfg: DictConfig) -> None:
    cfg = to_object(dcfg)
    try:
        results = run_cert(cfg, HydraConfig.get().runtime.output_dir)
    except ConfigError as err:
        print(f"zkl.cert: {err}", file=sys.stderr)
        if HydraConfig.get().mode == RunMode.MULTIRUN:
            raise
        sys.exit(2)
    certified = [r for r in results if not r["variant"].startswith("-")]
    passed = all(r["passed"] for r in certified)
    if HydraConfig.get().mode == RunMode.MULTIRUN:  # one job of a sweep: fail it, not the sweep
        if not passed:
            raise RuntimeError("a certified bed is not exactly zero (see cert.jsonl)")
        return
    sys.exit(0 if passed else 1)


if __name__ == "__main__":
    main()
