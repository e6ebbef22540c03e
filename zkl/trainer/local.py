"""The single-process policy: the whole model in this process, stepped in place or through
fp32 master weights (`precision.master_weights_fp32` with a bf16 model)."""

from __future__ import annotations

import torch

from zkl.distributed import ranks
from zkl.trainer.batch import UpdateBatch
from zkl.trainer.policy import Policy
from zkl.trainer.update import LossFn


class InPlace:
    """AdamW steps the model's own parameters (fp32 models, or masters turned off)."""

    def __init__(self, params: list[torch.nn.Parameter]) -> None:
        self.params = params
        self.tensors = params  # what the optimizer steps

    def take_grads(self) -> None:
        """The optimizer's tensors hold the gradients already."""

    def step(self, optimizer: torch.optim.Optimizer, update_sq: torch.Tensor) -> torch.Tensor:
        before = [p.detach().clone() for p in self.params]
        optimizer.step()
        for p, b in zip(self.params, before):
            update_sq += (p.float() - b.float()).square().sum(dtype=torch.float64)
        return update_sq

    def state(self) -> list[torch.Tensor] | None:
        return None


class FP32Masters(InPlace):
    """AdamW steps an fp32 copy of every parameter; the model's parameters are overwritten
    in place from it after each step (so a shared generator model sees them)."""

    def __init__(self, params: list[torch.nn.Parameter]) -> None:
        self.params = params
        self.tensors = [p.detach().float().clone().requires_grad_(True) for p in params]

    def take_grads(self) -> None:
        for m, p in zip(self.tensors, self.params):
            m.grad = None if p.grad is None else p.grad.float()
            p.grad = None  # one copy of the gradients at a time

    def step(self, optimizer: torch.optim.Optimizer, update_sq: torch.Tensor) -> torch.Tensor:
        optimizer.step()
        for m, p in zip(self.tensors, self.params):
            new = m.detach().to(p.dtype)
            update_sq += (new.float() - p.float()).square().sum(dtype=torch.float64)
            p.copy_(new)
        return update_sq

    def state(self) -> list[torch.Tensor] | None:
        return [m.detach() for m in self.tensors]


class LocalPolicy(Policy):
    """One process owns the whole model; `masters` says what AdamW steps."""

    def __init__(
        self, cfg, loss_fn: LossFn | None = None, world: ranks.World | None = None
    ) -> None:
        super().__init__(cfg, loss_fn, world)
        self.params = list(self.model.parameters())
        self.masters = (FP32Masters if self.use_master else InPlace)(self.params)
        self.optimizer = self._adamw(self.masters.tensors)

    def state_dict(self) -> dict:
        return {
            "model": self.model.state_dict(),
            "masters": self.masters.state(),
            "optimizer": self.optimizer.state_dict(),
            "version": self.version,
            "loss_scaler": None if self.scaler is None else self.scaler.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"], strict=True)
        if state["masters"] is not None:
            with torch.no_grad():
                for m, saved in zip(self.masters.tensors, state["masters"], strict=True):
                    m.copy_(saved)
        self.optimizer.load_state_dict(state["optimizer"])
        self.version = state["version"]
        if self.scaler is not None and state.get("loss_scaler"):
            self.scaler.load_state_dict(state["loss_scaler"])

    def refit_state(self) -> dict[str, torch.Tensor]:
        """The model's own tensors (shared storage, no copy)."""
        return self._forward_shards()

    def _forward_shards(self) -> dict[str, torch.Tensor]:
        return {name: p.detach() for name, p in self.model.named_parameters()}

    def _share(self, batch: UpdateBatch, lo: int, hi: int) -> tuple[int, int, None]:
        return lo, hi, None

    def _step(self, update_sq: torch.Tensor) -> tuple[float, torch.Tensor]:
        """Clip the gradient, step AdamW (on the fp32 masters, copied into the model)."""
        self.masters.take_grads()
        if self.scaler is not None:  # fp16: the gradients unscaled, or no step on an overflow
            finite = self.scaler.unscale(self.masters.tensors)
            self.scaler.update(finite)
            if not finite:  # a smaller scale next time
                return 0.0, update_sq
        grad_norm = torch.nn.utils.clip_grad_norm_(self.masters.tensors, self.cfg.rl.grad_clip)
        with torch.no_grad():
            update_sq = self.masters.step(self.optimizer, update_sq)
        return grad_norm.item(), update_sq
