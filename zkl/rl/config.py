"""The GRPO loop's config (the `rl` keys) and the check of its own keys, a leaf of the schema."""

from __future__ import annotations

from dataclasses import dataclass, field

from zkl.errors import ConfigError, positive

MAX_SAMPLES_PER_STEP = 2**20  # rl.prompts_per_step * rl.samples_per_prompt


@dataclass
class RLConfig:
    steps: int = 20
    prompts_per_step: int = 8
    samples_per_prompt: int = 8
    lr: float = 1e-2
    weight_decay: float = 0.0
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    clip_eps: float = 0.2
    kl_coef: float = 0.0  # k3 penalty against the initial policy
    grad_clip: float = 1.0
    num_minibatches: int = 1
    score_micro_batch: int = 0  # 0: the whole rollout in one scoring forward
    # Validation accuracy (greedy, through the generator) before every val_every-th step and
    # the last one; 0: off. val_prompts caps the validation problems (0: the whole split).
    val_every: int = 0
    val_prompts: int = 0


def check(rl: RLConfig) -> None:
    """One sentence naming the rl.* key that the loop or AdamW would fail on later."""
    for key in ("steps", "prompts_per_step", "samples_per_prompt", "lr", "num_minibatches"):
        positive(getattr(rl, key), f"rl.{key}")
    if rl.score_micro_batch < 0:
        raise ConfigError(f"rl.score_micro_batch={rl.score_micro_batch} must be >= 0.")
    if rl.clip_eps <= 0 or rl.grad_clip <= 0 or rl.kl_coef < 0:
        raise ConfigError("rl.clip_eps and rl.grad_clip must be positive and rl.kl_coef >= 0.")
    if rl.val_every < 0 or rl.val_prompts < 0:
        raise ConfigError("rl.val_every and rl.val_prompts must be >= 0 (0: off / all).")
    if rl.weight_decay < 0:
        raise ConfigError(f"rl.weight_decay={rl.weight_decay} must be >= 0.")
    if len(rl.betas) != 2 or not all(0 <= b < 1 for b in rl.betas):
        raise ConfigError(f"rl.betas={list(rl.betas)} must be two numbers in [0, 1).")
    samples = rl.prompts_per_step * rl.samples_per_prompt
    if samples > MAX_SAMPLES_PER_STEP:
        raise ConfigError(
            f"rl.prompts_per_step * rl.samples_per_prompt = {samples} samples a step; at most "
            f"{MAX_SAMPLES_PER_STEP} are allowed."
        )
    if rl.num_minibatches > samples:
        raise ConfigError(
            f"rl.num_minibatches={rl.num_minibatches} is more than the {samples} samples of a "
            "step (rl.prompts_per_step * rl.samples_per_prompt)."
        )
