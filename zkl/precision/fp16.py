"""The fp16 recipe's update half: dynamic loss scaling over the fp32 master weights.

fp16 has bf16's 16 bits but 5 exponent bits instead of 8: its gradients underflow below
6e-8 and overflow above 65504. The loss is multiplied by a scale before the backward; the
fp32 master gradients are divided by it before AdamW. A step whose gradients hold an inf or
a NaN is skipped and the scale halves; after `growth_interval` clean steps in a row it
doubles (the rule of NVIDIA Apex's and `torch.amp.GradScaler`'s dynamic scaling; zkl keeps
its own, as the masters here are plain fp32 tensors of its own, not an autocast graph).
The forward of both paths runs in fp16 with the same kernels as bf16, so zero mode stays
exactly zero: the scale touches the gradients only.
"""

from __future__ import annotations

import torch

from zkl.engines import NATIVE, engine_named
from zkl.errors import ConfigError
from zkl.precision.config import quantizes

INIT_SCALE = 2.0**16
GROWTH_FACTOR = 2.0
BACKOFF_FACTOR = 0.5
GROWTH_INTERVAL = 200
MIN_SCALE = 1.0


class DynamicLossScaler:
    """Scale the loss, unscale and check the gradients, back off on overflow, grow after
    `growth_interval` clean steps."""

    def __init__(
        self,
        scale: float = INIT_SCALE,
        growth_interval: int = GROWTH_INTERVAL,
        growth_factor: float = GROWTH_FACTOR,
        backoff_factor: float = BACKOFF_FACTOR,
    ) -> None:
        self.scale = scale
        self.growth_interval = growth_interval
        self.growth_factor = growth_factor
        self.backoff_factor = backoff_factor
        self.clean_steps = 0
        self.skipped = 0

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.scale

    def unscale(self, params: list[torch.Tensor]) -> bool:
        """Divide every gradient by the scale in place; whether all of them are finite."""
        finite = torch.ones((), dtype=torch.bool)
        for p in params:
            if p.grad is not None:
                p.grad.div_(self.scale)
                finite = finite & torch.isfinite(p.grad).all().cpu()
        return bool(finite)

    def update(self, finite: bool) -> None:
        """Back off (and count a skipped step) after an overflow; grow after a clean run."""
        if not finite:
            self.scale = max(self.scale * self.backoff_factor, MIN_SCALE)
            self.clean_steps = 0
            self.skipped += 1
            return
        self.clean_steps += 1
        if self.clean_steps >= self.growth_interval:
            self.scale *= self.growth_factor
            self.clean_steps = 0

    def state_dict(self) -> dict:
        return {"scale": self.scale, "clean_steps": self.clean_steps, "skipped": self.skipped}

    def load_state_dict(self, state: dict) -> None:
        self.scale, self.clean_steps = state["scale"], state["clean_steps"]
        self.skipped = state["skipped"]


def check_fp16(cfg) -> None:
    """ConfigError, one sentence, when `cfg` asks for fp16 with what cannot run it."""
    problem = fp16_problem(cfg)
    if problem:
        raise ConfigError(problem)


def fp16_problem(cfg) -> str | None:
    """The one sentence saying why `cfg` cannot run the fp16 recipe, or None."""
    if cfg.precision.compute_dtype != "float16":
        return None
    if quantizes(cfg.precision):
        return (
            f"precision.compute_dtype=float16 cannot run precision.linear_quant="
            f"{cfg.precision.linear_quant} (the MXFP8 and FP8 emulations take bf16 or fp32 "
            "input); use +precision=fp16 alone."
        )
    if not engine_named(cfg.engine.name).fp16:
        return (
            f"precision.compute_dtype=float16 cannot run on engine.name={cfg.engine.name} (its "
            f"megatron mapping knows bf16 and fp32); use engine={NATIVE.name}."
        )
    if cfg.trainer.world_size > 1 or cfg.trainer.fsdp:
        return (
            "precision.compute_dtype=float16 needs one unsharded trainer (its loss scaler steps "
            "plain fp32 masters); set trainer.world_size=1 and trainer.fsdp=false."
        )
    if not cfg.precision.master_weights_fp32:
        return (
            "precision.compute_dtype=float16 needs precision.master_weights_fp32=true "
            "(AdamW on fp16 weights loses small updates)."
        )
    return None
