"""The GRPO loop's config (the `rl` keys) and the check of its own keys, a leaf of the schema,
with the table of the corrections `rl.correction.mode` names."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from zkl.engines import engine_named
from zkl.errors import ConfigError, positive

if TYPE_CHECKING:  # annotations only: this leaf imports no torch
    from torch import Tensor

MAX_SAMPLES_PER_STEP = 2**20  # rl.prompts_per_step * rl.samples_per_prompt


@dataclass
class CorrectionConfig:
    """`rl.correction`: how the update corrects for the generator's logprobs differing from
    the train path's (docs/treatments.md). `cap`: the TIS truncation and the MIS upper bound;
    `low`..`high`: the band of icepop (token ratio) and geo_mis (geometric mean)."""

    mode: str = "none"  # a name of CORRECTIONS below
    cap: float = 2.0
    low: float = 0.5
    high: float = 5.0
    behavior: str = "raw"  # raw | sampled: the generator's logprob the ratio divides by


# Each correction turns the log ratios [T] (float64) of one response into its per-token weights
# [T]; rho = exp(log ratio). Written with tensor methods only, so this leaf holds the one table
# of names without importing torch (zkl/rl/correction.py applies it; formulas and sources:
# docs/treatments.md).
Weights = Callable[["Tensor", CorrectionConfig], "Tensor"]


def _token_tis(log_rho: Tensor, c: CorrectionConfig) -> Tensor:
    """min(rho_t, cap)."""
    return log_rho.exp().clamp(max=c.cap)


def _token_mis(log_rho: Tensor, c: CorrectionConfig) -> Tensor:
    """rho_t where rho_t <= cap, else 0."""
    rho = log_rho.exp()
    return rho.where(rho <= c.cap, 0.0)


def _seq_tis(log_rho: Tensor, c: CorrectionConfig) -> Tensor:
    """min(prod rho, cap) on every token."""
    return log_rho.sum().exp().expand_as(log_rho).clamp(max=c.cap)


def _seq_mis(log_rho: Tensor, c: CorrectionConfig) -> Tensor:
    """prod rho on every token where it is <= cap, else 0."""
    rho = log_rho.sum().exp().expand_as(log_rho)
    return rho.where(rho <= c.cap, 0.0)


def _geo_mis(log_rho: Tensor, c: CorrectionConfig) -> Tensor:
    """1 on every token where the geometric mean exp(mean log rho) is in [low, high], else 0
    (rejection only)."""
    geo = log_rho.mean().exp() if log_rho.numel() else log_rho.new_ones(())
    keep = bool(c.low <= geo <= c.high)
    return log_rho.new_full(log_rho.shape, 1.0 if keep else 0.0)


def _icepop(log_rho: Tensor, c: CorrectionConfig) -> Tensor:
    """rho_t where low <= rho_t <= high, else 0."""
    rho = log_rho.exp()
    return rho.where((rho >= c.low) & (rho <= c.high), 0.0)


# `rl.correction.mode` -> its weights; none leaves the loss as it is.
CORRECTIONS: dict[str, Weights | None] = {
    "none": None,
    "token_tis": _token_tis,
    "token_mis": _token_mis,
    "seq_tis": _seq_tis,
    "seq_mis": _seq_mis,
    "geo_mis": _geo_mis,
    "icepop": _icepop,
}


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
    # sequences a forward and backward of the update take at once; their gradients add up to
    # the minibatch's, still one optimizer step a minibatch (0: the whole minibatch at once)
    update_micro_batch: int = 0
    # Validation accuracy (greedy, through the generator) before every val_every-th step and
    # the last one; 0: off. val_prompts caps the validation problems (0: the whole split).
    val_every: int = 0
    val_prompts: int = 0
    correction: CorrectionConfig = field(default_factory=CorrectionConfig)
    # MoE: the trainer's forwards use the experts the generator chose (R3, docs/treatments.md)
    routing_replay: bool = False
    # MoE: record the generator's routes and log how many the trainer's router changes,
    # without replaying them (the baseline of routing_replay)
    record_routes: bool = False
    # warn (one stderr line) when this many steps in a row trained nothing: every advantage
    # zero, or no weight the generator gets changed (zkl/rl/trained.py); 0: never
    warn_untrained_after: int = 3

    @property
    def records_routes(self) -> bool:
        """Whether the generator records its routes: to replay them, or only to count them."""
        return self.routing_replay or self.record_routes


def check(rl: RLConfig) -> None:
    """One sentence naming the rl.* key that the loop or AdamW would fail on later."""
    for key in ("steps", "prompts_per_step", "samples_per_prompt", "lr", "num_minibatches"):
        positive(getattr(rl, key), f"rl.{key}")
    for key in ("score_micro_batch", "update_micro_batch"):
        if getattr(rl, key) < 0:
            raise ConfigError(f"rl.{key}={getattr(rl, key)} must be >= 0 (0: all at once).")
    if rl.clip_eps <= 0 or rl.grad_clip <= 0 or rl.kl_coef < 0:
        raise ConfigError("rl.clip_eps and rl.grad_clip must be positive and rl.kl_coef >= 0.")
    if rl.warn_untrained_after < 0:
        raise ConfigError(
            f"rl.warn_untrained_after={rl.warn_untrained_after} must be >= 0 (0: never warn)."
        )
    if rl.val_every < 0 or rl.val_prompts < 0:
        raise ConfigError("rl.val_every and rl.val_prompts must be >= 0 (0: off / all).")
    if rl.weight_decay < 0:
        raise ConfigError(f"rl.weight_decay={rl.weight_decay} must be >= 0.")
    if len(rl.betas) != 2 or not all(0 <= b < 1 for b in rl.betas):
        raise ConfigError(f"rl.betas={list(rl.betas)} must be two numbers in [0, 1).")
    check_correction(rl.correction)
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


def check_correction(c: CorrectionConfig) -> None:
    """One sentence naming the rl.correction.* key whose value no correction can use."""
    if c.mode not in CORRECTIONS:
        raise ConfigError(f"rl.correction.mode={c.mode!r} is not one of {', '.join(CORRECTIONS)}.")
    if c.behavior not in ("raw", "sampled"):
        raise ConfigError(f"rl.correction.behavior={c.behavior!r} must be raw or sampled.")
    if not c.cap > 0:
        raise ConfigError(f"rl.correction.cap={c.cap} must be > 0.")
    if not 0 <= c.low <= c.high:
        raise ConfigError(
            f"rl.correction.low={c.low} and rl.correction.high={c.high} must satisfy "
            "0 <= low <= high."
        )


def check_treatments(cfg: Any, replays: bool) -> None:
    """The treatments' checks that span parts (the whole config, duck-typed: a leaf): routing
    replay needs a family whose MoE layers replay routes (`replays`, the family registry's
    `route_replay` capability: Qwen3-MoE) on an engine whose MoE layers take the route tape
    (the engine registry's `route_replay`: native), as a dedicated or colocated generator
    records its routes only there."""
    if not cfg.rl.records_routes:
        return
    if not cfg.model.is_moe:
        raise ConfigError(
            f"rl.routing_replay=true (or rl.record_routes) needs a mixture-of-experts model, "
            f"but model.name={cfg.model.name!r} is dense; choose model=tiny_moe or set "
            "rl.routing_replay=false."
        )
    if not replays or not engine_named(cfg.engine.name).route_replay:
        raise ConfigError(
            "rl.routing_replay=true supports the native qwen3_moe family only (model.family="
            f"{cfg.model.family!r}, engine.name={cfg.engine.name!r}); set "
            "rl.routing_replay=false."
        )
    if cfg.trainer.world_size > 1:
        raise ConfigError(
            f"rl.routing_replay=true runs with one trainer rank, not trainer.world_size="
            f"{cfg.trainer.world_size}; set trainer.world_size=1 or rl.routing_replay=false."
        )
