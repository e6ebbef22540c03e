"""The one training loop every engine and layout uses.

One step: rollout (gen path) -> score (train path) -> mismatch metrics -> rewards ->
advantages -> corrections -> update -> refit, each one call into the part that owns it. The
metrics of every step land in the run directory before the next step starts. The config is
checked where a run is entered (zkl/run/validate.py `check_run`), before this loop starts.
`cfg` is the run's `zkl.run.schema.ZklConfig`, taken duck-typed (the schema composes the
parts, this one among them); the loop reads its parts' fields.
"""

from __future__ import annotations

import math
import time
from dataclasses import fields
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from zkl import invariance, threads
from zkl.data.rewards import RewardError
from zkl.data.tasks import build_task
from zkl.distributed import launch
from zkl.errors import NonFinite, RunFault
from zkl.generation.sampling import SamplingParams
from zkl.generation.scheduler import Completion, Request, SchedulerStats
from zkl.layouts.generator import build_generator
from zkl.rl.correction import behavior_logprobs, correction_weights, diagnostics
from zkl.rl.evaluate import val_due, validate_policy
from zkl.rl.grpo import group_advantages
from zkl.rl.loss import grpo_loss
from zkl.rl.metrics import mismatch_metrics, rollout_metrics, timing_metrics
from zkl.rl.trained import warn_untrained
from zkl.state import checkpoint, run_lock
from zkl.state import sharded as sharded_checkpoint
from zkl.state.resume import prepare as prepare_resume
from zkl.tracking.run_log import NullLog, RunLog, read_metrics
from zkl.trainer.batch import UpdateBatch
from zkl.trainer.build import build_policy
from zkl.trainer.policy import Policy

TIMING_PREFIXES = ("timing/", "perf/")


def sampled_requests(sp, prompts: list[list[int]], seeds: list[int]) -> list[Request]:
    """Request i samples prompts[i] under `sp` (the `sampling` config) with seed seeds[i]."""
    return [
        Request(i, prompt, SamplingParams(sp.temperature, sp.top_p, sp.top_k, sp.max_new_tokens, s))
        for i, (prompt, s) in enumerate(zip(prompts, seeds, strict=True))
    ]


def make_requests(cfg: Any, task, step: int) -> tuple[list, list[Request]]:
    """G samples of each prompt of this step; each request's seed is fixed by (seed, step, i)."""
    problems = task.problems(cfg.seed, step, cfg.rl.prompts_per_step)
    prompts = [p for p in map(task.prompt, problems) for _ in range(cfg.rl.samples_per_prompt)]
    seeds = [(cfg.seed * 1_000_003 + step * 10_007 + i) % (2**63) for i in range(len(prompts))]
    return problems, sampled_requests(cfg.sampling, prompts, seeds)


def arrival_order(requests: list[Request], group: int) -> list[Request]:
    """Sample g of every prompt before sample g + 1 of any: batches mix prompts of different
    lengths, as a rollout service sees them (results never depend on the order)."""
    return sorted(requests, key=lambda r: (r.request_id % group, r.request_id))


def token_records(
    step: int, task, completions: list[Completion], lp_train, rewards, limit: str
) -> list[dict[str, Any]]:
    """The first `limit` samples' tokens, logprobs and rewards (`tracking.dump_tokens`), with
    the decoded texts beside the ids where the task's tokenizer decodes (HF tokenizers)."""
    count = len(completions) if limit == "all" else min(int(limit), len(completions))
    decoded = getattr(task, "text_fields", None)
    return [
        {
            "step": step,
            "sample": c.request_id,
            "prompt": c.prompt,
            "response": c.tokens,
            "lp_gen": c.logprobs.tolist(),
            "lp_sampled": c.lp_sampled.tolist(),
            "lp_train": lp.tolist(),
            "reward": r,
            **(decoded(c.prompt, c.tokens) if decoded else {}),
        }
        for c, lp, r in zip(completions[:count], lp_train[:count], rewards[:count])
    ]


def run(
    cfg: Any, run_dir: str | Path, progress: bool | None = None, task: Any = None
) -> list[dict[str, Any]]:
    """Run `cfg.rl.steps` GRPO steps; return the metric rows (also in run_dir/metrics.jsonl).

    `cfg` is checked already (zkl/run/validate.py `check_run`, by the entry point); `task` is
    the task that check built, so a dataset task reads its file and tokenizer once (None:
    built here). A resumed run (zkl/state/resume.py) starts at its checkpoint's step; the
    rows returned include the earlier steps' rows, read back from metrics.jsonl. The run holds
    the run directory's lock (zkl/state/run_lock.py) before it reads or writes anything there.
    """
    task = task if task is not None else build_task(cfg)
    if not launch.owns_run_dir():  # a rank its spawner (or rank 0) holds the lock for
        return _join_and_run(cfg, task, run_dir, progress)
    with run_lock.held(run_dir):
        if launch.must_spawn(cfg):  # trainer.world_size ranks started here, each running `run`
            prepare_resume(cfg, run_dir)  # its refusals, before any rank starts
            return launch.spawn(run, cfg, run_dir, progress)
        return _join_and_run(cfg, task, run_dir, progress)


def _join_and_run(cfg: Any, task, run_dir, progress: bool | None) -> list[dict[str, Any]]:
    world = launch.join(cfg)
    finished = False
    try:
        rows = _run(cfg, task, run_dir, progress, world)
        finished = True
        return rows
    except RuntimeError as err:  # gloo's "connection reset by peer": which rank is gone
        if world.watchdog is not None and not isinstance(err, RunFault):
            world.watchdog.diagnose()
        raise
    finally:
        launch.leave(world, finished)


def _run(cfg: Any, task, run_dir, progress: bool | None, world) -> list[dict[str, Any]]:
    resume = sharded_checkpoint.prepare(cfg, run_dir, world)
    threads.apply(cfg)
    fixes = invariance.from_config(cfg)
    rows: list[dict[str, Any]] = read_metrics(run_dir) if resume.step else []
    log = RunLog(run_dir, cfg, wandb_id=resume.wandb_id) if world.is_main else NullLog()
    log.replay_to_wandb(rows)
    generator = None
    try:
        with invariance.enabled(fixes):
            policy = build_policy(cfg, grpo_loss(cfg.rl), world)
            checkpoint.restore(resume, policy)
            generator = build_generator(cfg, policy, task.tokenizer.eos_id, run_dir)
            generator.refit(policy.refit_state(), policy.version)
            show = (cfg.tracking.progress if progress is None else progress) and world.is_main
            steps = range(resume.step, cfg.rl.steps)
            bar = tqdm(steps, "grpo", cfg.rl.steps, disable=not show, initial=resume.step)
            with bar, checkpoint.Saver(cfg, run_dir, policy, log, resume.step, world) as saver:
                for step in bar:  # `with bar`: an interrupt leaves the bar's line finished
                    saver.before_step()
                    val = validate_step(cfg, task, generator, step)
                    row = train_step(cfg, task, policy, generator, step, log, val)
                    rows.append(row)
                    if world.is_main:
                        warn_untrained(rows, cfg.rl.warn_untrained_after, cfg.rl.lr)
                    saver.after_step(step)
    except KeyboardInterrupt as err:  # the Saver's says where the steps stand; before them:
        if str(err):
            raise
        where = checkpoint.standing(cfg, run_dir, resume.step, resume.step)
        raise KeyboardInterrupt(where) from None  # the run stands where it started
    finally:
        if generator is not None:
            generator.close()
        log.close()
    return rows


def validate_step(cfg: Any, task, generator, step: int) -> dict[str, Any]:
    """The `val/*` metrics of the weights step `step` generates with, when validation is due."""
    if not val_due(step, cfg.rl.val_every, cfg.rl.steps):
        return {}
    try:
        return validate_policy(cfg, task, generator)
    except RewardError as err:
        raise RewardError(
            f"validation before step {step}: {err}; every earlier step is logged. Fix the "
            "function or choose another task.reward."
        ) from None


def train_step(
    cfg: Any, task, policy: Policy, generator, step: int, log: RunLog, extra=None
) -> dict:
    """rollout -> score -> rewards -> advantages -> corrections -> update -> refit, logged
    (with `extra`) before returning.

    Each part is asked once: the generator for completions, the trainer (`policy`) for the
    train path's logprobs, then for an update (its statistics include how many refit tensors
    changed), then for its refit state, which the generator receives.
    """
    group = cfg.rl.samples_per_prompt
    problems, requests = make_requests(cfg, task, step)
    marks = [time.perf_counter()]  # the clock before and after each part (timing/*)
    completions, stats = rollout(policy.world, generator, requests, group)
    marks.append(time.perf_counter())
    prompts = [c.prompt for c in completions]
    responses = [c.tokens for c in completions]
    temps = [r.params.temperature for r in requests]
    routes = [c.routes for c in completions] if cfg.rl.records_routes else None
    replayed = routes if cfg.rl.routing_replay else None
    lp_train, routing = policy.score(prompts, responses, temps, routes, cfg.rl.routing_replay)
    marks.append(time.perf_counter())
    lp_gen = torch.cat([c.logprobs for c in completions])
    lp_train_flat = torch.cat(lp_train)
    row: dict[str, Any] = {"step": step, **mismatch_metrics(lp_train_flat, lp_gen), **(extra or {})}
    rewards = step_rewards(task, problems, completions, group, step, log, row)
    reward_t = torch.tensor(rewards)
    advantages = group_advantages(reward_t, group)
    lp_behavior = behavior_logprobs(completions, cfg.rl.correction.behavior)
    weights = correction_weights(lp_train, lp_behavior, cfg.rl.correction)
    row.update(diagnostics(lp_train, lp_behavior, weights))
    row.update(routing)
    batch = UpdateBatch(prompts, responses, lp_train, advantages, temps, weights, replayed)
    row.update(policy.update(batch))
    marks.append(time.perf_counter())
    generator.refit(policy.refit_state(), policy.version)
    marks.append(time.perf_counter())
    train_tokens = sum(len(p) + len(r) for p, r in zip(prompts, responses))
    row.update(rollout_metrics(completions, stats, reward_t, advantages))
    row.update(timing_metrics(marks, lp_gen.numel(), train_tokens))
    if policy.device.type == "cuda":
        row["perf/peak_gpu_mem_gb"] = torch.cuda.max_memory_allocated(policy.device) / 2**30
    records = token_records(step, task, completions, lp_train, rewards, cfg.tracking.dump_tokens)
    log.log(step, row, records)  # the records first, the row as the step's commit
    check_finite(cfg, step, lp_gen, lp_train_flat, row)
    return row


def rollout(
    world, generator, requests: list[Request], group: int
) -> tuple[list[Completion], SchedulerStats]:
    """This rank's share of `requests` generated in arrival order, every rank's completions
    gathered back in request order (groups of `group`), and the ranks' scheduler counters."""
    completions, stats = generator.generate(arrival_order(world.share(requests), group))
    completions.sort(key=lambda c: c.request_id)
    return world.gather(completions), sum_stats(world.gather([stats]))


def step_rewards(
    task, problems: list, completions: list[Completion], group: int, step: int, log, row: dict
) -> list[float]:
    """Each completion's reward for its prompt's problem. A reward function that fails stops
    the run with one sentence after the step's rollout metrics (`row`) are logged; no update
    is made."""
    try:
        return [task.reward(problems[i // group], c.tokens) for i, c in enumerate(completions)]
    except RewardError as err:
        log.log(step, row)
        raise RewardError(
            f"step {step}: {err}; the step is logged, no update was made. Fix the function "
            "or choose another task.reward."
        ) from None


def sum_stats(parts: list[SchedulerStats]) -> SchedulerStats:
    """The ranks' scheduler counters added up (one scheduler's own at world size 1)."""
    return SchedulerStats(
        **{f.name: sum(getattr(p, f.name) for p in parts) for f in fields(parts[0])}
    )


def check_finite(cfg: Any, step: int, lp_gen, lp_train, row: dict[str, Any]) -> None:
    """Stop the run (after the step is logged) at the first NaN or inf it produced."""
    parts = {"the generator's logprobs": lp_gen, "the trainer's logprobs": lp_train}
    bad = [name for name, t in parts.items() if not bool(torch.isfinite(t).all())]
    bad += [k for k, v in row.items() if k.startswith(("loss/", "optim/")) and not math.isfinite(v)]
    if bad:
        raise NonFinite(
            f"step {step}: {', '.join(bad)} not finite (NaN or inf), so no later step could "
            f"be compared; the step is logged. Lower rl.lr (now {cfg.rl.lr}) or check the "
            "model's numerics."
        )
