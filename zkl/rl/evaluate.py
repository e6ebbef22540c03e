"""Validation accuracy through the run's own generator: greedy, one response a problem.

Greedy is top-k 1 on the same scheduler and weights the rollouts use (a fixed seed keys the
sampler, so ties break the same way every time). `val/accuracy` is the fraction of
validation problems answered right: the task's `is_correct(problem, response)` where it has
one (`add`: the number the response starts with is the sum), else a reward of 1.0;
`val/reward` is the mean reward.
Validation requests start at a request id no rollout uses, and a prompt's logprobs do not
depend on what ran before it, so validating never changes a training step's numbers.
"""

from __future__ import annotations

from typing import Any

from zkl.generation.sampling import SamplingParams
from zkl.generation.scheduler import Request

VAL_SEED = 0x7A11DA7E
VAL_REQUEST_BASE = 1 << 40  # above every rollout's request id


def val_due(step: int, val_every: int, steps: int) -> bool:
    """Validate before every `val_every`-th step (step 0 included) and before the last one."""
    return val_every > 0 and (step % val_every == 0 or step == steps - 1)


def answered_right(task, problem, response: list[int], reward: float) -> bool:
    """Whether `val/accuracy` counts a response: the task's `is_correct` where it has one,
    else its reward (`reward`) being 1.0."""
    judge = getattr(task, "is_correct", None)
    return bool(judge(problem, response)) if judge else reward == 1.0


def validate_policy(cfg, task, generator) -> dict[str, Any]:
    """`val/accuracy`, `val/reward` and `val/num_problems` on the task's validation problems."""
    problems = task.validation_problems(cfg.rl.val_prompts)
    if not problems:
        return {}
    params = SamplingParams(1.0, 1.0, 1, cfg.sampling.max_new_tokens, VAL_SEED)
    requests = [
        Request(VAL_REQUEST_BASE + i, task.prompt(p), params) for i, p in enumerate(problems)
    ]
    completions, _ = generator.generate(requests)
    completions.sort(key=lambda c: c.request_id)
    pairs = list(zip(problems, completions, strict=True))
    rewards = [task.reward(p, c.tokens) for p, c in pairs]
    right = [answered_right(task, p, c.tokens, r) for (p, c), r in zip(pairs, rewards)]
    return {
        "val/accuracy": sum(right) / len(right),
        "val/reward": sum(rewards) / len(rewards),
        "val/num_problems": len(rewards),
    }
