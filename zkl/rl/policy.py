"""The trainer's side: the policy model, fp32 master weights, AdamW, and refit weights."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from zkl.checkpoint_check import warn_random_weights
from zkl.device import resolve_device
from zkl.models import build_model
from zkl.precision import DTYPES
from zkl.rl.grpo import clipped_pg_loss
from zkl.scoring import pad_sequences, sequence_logprobs


@dataclass
class UpdateBatch:
    prompts: list[list[int]]
    responses: list[list[int]]
    old_logprobs: list[torch.Tensor]  # train-path logprobs of each response
    advantages: torch.Tensor  # [N]
    temperatures: list[float]


class Policy:
    """The model the trainer's forward uses, and the optimizer that updates it.

    With `master_weights_fp32` and a bf16 model, AdamW steps an fp32 copy of every
    parameter and the model's bf16 parameters are overwritten in place from it.
    """

    def __init__(self, cfg) -> None:
        self.cfg = cfg
        self.compute_dtype = DTYPES[cfg.precision.compute_dtype]
        self.device = resolve_device(cfg.device)
        warn_random_weights(cfg.model)
        self.model = build_model(
            cfg.model,
            self.compute_dtype,
            cfg.precision.linear_quant,
            cfg.seed,
            self.device,
            cfg.engine.name,
        )
        self.params = [p for p in self.model.parameters()]
        use_master = cfg.precision.master_weights_fp32 and any(
            p.dtype != torch.float32 for p in self.params
        )
        self.masters = (
            [p.detach().float().clone().requires_grad_(True) for p in self.params]
            if use_master
            else self.params
        )
        self.optimizer = torch.optim.AdamW(
            self.masters,
            lr=cfg.rl.lr,
            betas=tuple(cfg.rl.betas),
            weight_decay=cfg.rl.weight_decay,
        )
        self.reference = copy.deepcopy(self.model).eval() if cfg.rl.kl_coef > 0 else None
        self.version = 0

    def state_dict(self) -> dict:
        """What a bitwise resume needs: weights, fp32 masters, AdamW state and weight version."""
        separate = self.masters is not self.params
        return {
            "model": self.model.state_dict(),
            "masters": [m.detach() for m in self.masters] if separate else None,
            "optimizer": self.optimizer.state_dict(),
            "version": self.version,
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore `state_dict()` in place (the generator's shared model sees the weights)."""
        self.model.load_state_dict(state["model"], strict=True)
        if state["masters"] is not None:
            with torch.no_grad():
                for m, saved in zip(self.masters, state["masters"], strict=True):
                    m.copy_(saved)
        self.optimizer.load_state_dict(state["optimizer"])
        self.version = state["version"]

    def refit_state(self) -> dict[str, torch.Tensor]:
        """Exactly the tensors the trainer's forward uses (shared storage, no copy)."""
        return {name: p.detach() for name, p in self.model.named_parameters()}

    def update(self, batch: UpdateBatch) -> dict[str, float]:
        """One optimizer step per minibatch on the clipped PG loss; returns its statistics.

        `optim/update_norm` is the L2 norm of the change of the model's weights, the ones the
        forward uses and the generator receives (bf16 ones under a bf16 recipe): zero when an
        update moved the fp32 masters by less than the weights' precision.
        """
        rl = self.cfg.rl
        device = self.device
        update_sq = torch.zeros((), dtype=torch.float64, device=device)
        count = len(batch.prompts)
        bounds = torch.linspace(0, count, rl.num_minibatches + 1).long().tolist()
        stats: dict[str, float] = {}
        losses, grad_norms = [], []
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            tokens, mask = pad_sequences(batch.prompts[lo:hi], batch.responses[lo:hi])
            mask = mask[:, :-1]
            old = torch.zeros(mask.shape)
            for i, lp in enumerate(batch.old_logprobs[lo:hi]):
                old[i][mask[i]] = lp.cpu()
            tokens, mask, old = tokens.to(device), mask.to(device), old.to(device)
            temps = torch.tensor(batch.temperatures[lo:hi], device=device)
            logprobs = sequence_logprobs(self.model, tokens, temps)
            ref = None
            if self.reference is not None:
                with torch.no_grad():
                    ref = sequence_logprobs(self.reference, tokens, temps)
            advantages = batch.advantages[lo:hi].to(device)
            loss, loss_stats = clipped_pg_loss(
                logprobs, old, advantages, mask, rl.clip_eps, ref, rl.kl_coef
            )
            self.optimizer.zero_grad(set_to_none=True)
            for p in self.params:
                p.grad = None
            loss.backward()
            if self.masters is not self.params:
                for m, p in zip(self.masters, self.params):
                    m.grad = None if p.grad is None else p.grad.float()
                    p.grad = None  # one copy of the gradients at a time
            grad_norm = torch.nn.utils.clip_grad_norm_(self.masters, rl.grad_clip)
            with torch.no_grad():
                if self.masters is self.params:
                    before = [p.detach().clone() for p in self.params]
                    self.optimizer.step()
                    for p, b in zip(self.params, before):
                        update_sq += (p.float() - b.float()).square().sum(dtype=torch.float64)
                else:
                    self.optimizer.step()
                    for m, p in zip(self.masters, self.params):
                        new = m.detach().to(p.dtype)
                        update_sq += (new.float() - p.float()).square().sum(dtype=torch.float64)
                        p.copy_(new)
            losses.append(loss.item())
            grad_norms.append(grad_norm.item())
            stats.update(loss_stats)
        self.version += 1
        stats.update(
            {
                "loss/pg_loss": sum(losses) / len(losses),
                "optim/grad_norm": sum(grad_norms) / len(grad_norms),
                "optim/update_norm": float(update_sq) ** 0.5,
            }
        )
        return stats
