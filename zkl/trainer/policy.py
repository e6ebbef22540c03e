"""The trainer's side: the policy model, fp32 master weights, AdamW, and refit weights."""

from __future__ import annotations

import copy
from collections.abc import Mapping

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from zkl import distributed
from zkl.backends import build_backend_model
from zkl.checkpoint_check import warn_random_weights
from zkl.device import resolve_device
from zkl.distributed import fsdp
from zkl.generation.routes import taping
from zkl.precision import DTYPES
from zkl.precision.fp16 import DynamicLossScaler
from zkl.trainer.loss import clipped_pg_loss
from zkl.trainer.scoring import replay_tape, score, sequence_logprobs
from zkl.trainer.update import (
    UpdateBatch,
    minibatch,
    minibatch_edges,
    minibatch_weights,
    update_stats,
)
from zkl.trainer.weights import GatheredWeights, weight_digests


class Policy:
    """The model the trainer's forward uses, and the optimizer that updates it.

    With `master_weights_fp32` and a bf16 model, AdamW steps an fp32 copy of every
    parameter and the model's bf16 parameters are overwritten in place from it.

    Sharded (`trainer.world_size` > 1 or `trainer.fsdp`, zkl/distributed/fsdp.py), the
    model's parameters are FSDP2's fp32 shards themselves (the masters); each rank scores
    and updates its share of every minibatch, and the refit weights are all-gathered.
    """

    def __init__(self, cfg) -> None:
        self.cfg = cfg
        self.compute_dtype = DTYPES[cfg.precision.compute_dtype]
        self.device = resolve_device(cfg.device)
        warn_random_weights(cfg.model)
        self.model = build_backend_model(
            cfg.model,
            self.compute_dtype,
            cfg.precision.linear_quant,
            cfg.seed,
            self.device,
            cfg.engine.backend,
        )
        self.world = distributed.current()
        fp16 = cfg.precision.compute_dtype == "float16"  # its update scales the loss
        self.scaler = DynamicLossScaler() if fp16 else None
        self.reference = copy.deepcopy(self.model).eval() if cfg.rl.kl_coef > 0 else None
        self.version = 0
        self.params = [p for p in self.model.parameters()]
        use_master = cfg.precision.master_weights_fp32 and any(
            p.dtype != torch.float32 for p in self.params
        )
        if self.world.sharded:
            self._init_sharded(use_master)
            return
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

    def _init_sharded(self, use_master: bool) -> None:
        rl = self.cfg.rl
        self.forward_dtypes = {n: p.dtype for n, p in self.model.named_parameters()}
        offload = self.cfg.trainer.offload
        self.replicated = fsdp.shard_model(self.model, use_master, self.device, offload)
        self.params = self.masters = list(self.model.parameters())
        is_main = self.world.is_main
        self.owned_names = [n for n, p in self.model.named_parameters()  # each counted once
                            if p not in self.replicated or is_main]  # fmt: skip
        groups = [
            [p for p in self.params if p not in self.replicated],
            [p for p in self.params if p in self.replicated],
        ]  # two groups: AdamW's foreach path cannot mix DTensor shards with plain tensors
        self.optimizer = torch.optim.AdamW(
            [{"params": g} for g in groups if g],
            lr=rl.lr,
            betas=tuple(rl.betas),
            weight_decay=rl.weight_decay,
        )

    def state_dict(self) -> dict:
        """What a bitwise resume needs: weights, fp32 masters, AdamW state and weight version.

        Sharded: this rank's shards, as torch.distributed.checkpoint saves them.
        """
        if self.world.sharded:
            model, optimizer = get_state_dict(self.model, self.optimizer)
            return {"model": model, "optimizer": optimizer}
        separate = self.masters is not self.params
        return {
            "model": self.model.state_dict(),
            "masters": [m.detach() for m in self.masters] if separate else None,
            "optimizer": self.optimizer.state_dict(),
            "version": self.version,
            "loss_scaler": None if self.scaler is None else self.scaler.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore `state_dict()` in place (the generator's shared model sees the weights)."""
        if self.world.sharded:
            set_state_dict(self.model, self.optimizer, model_state_dict=state["model"],
                           optim_state_dict=state["optimizer"])  # fmt: skip
            self.version = state["version"]
            return
        self.model.load_state_dict(state["model"], strict=True)
        if state["masters"] is not None:
            with torch.no_grad():
                for m, saved in zip(self.masters, state["masters"], strict=True):
                    m.copy_(saved)
        self.optimizer.load_state_dict(state["optimizer"])
        self.version = state["version"]
        if self.scaler is not None and state.get("loss_scaler"):
            self.scaler.load_state_dict(state["loss_scaler"])

    # -- the weights ----------------------------------------------------------------------
    def refit_state(self) -> Mapping[str, torch.Tensor]:
        """Exactly the tensors the trainer's forward uses (shared storage, no copy).

        Sharded: the whole tensors, each shard cast to the forward's dtype and all-gathered
        (the bits FSDP's own all-gather gives the forward); a collective of every rank.
        """
        if self.world.sharded:
            named = dict(self.model.named_parameters())
            return GatheredWeights(named, self.forward_dtypes, self.device, fsdp.full)
        return self._forward_shards()

    def _forward_shards(self) -> dict[str, torch.Tensor]:
        """This rank's part of the forward's weights (all of them when not sharded), on the
        compute device (host-offloaded shards are copied over, beside the replicated ones)."""
        named = self.model.named_parameters()
        if not self.world.sharded:
            return {name: p.detach() for name, p in named}
        return {n: fsdp.local(p.detach()).to(self.device, self.forward_dtypes[n]) for n, p in named}

    def _changed_tensors(self, before: torch.Tensor) -> int:
        """How many of the refit's tensors changed since `before`, their `weight_digests`."""
        changed = (weight_digests(self._forward_shards()) != before).any(-1).double()
        if self.world.size > 1:  # a tensor changed when any rank's shard did
            changed = changed.to(self.world.device)
            dist.all_reduce(changed, op=dist.ReduceOp.MAX)
        return int(changed.sum())

    # -- the train path -------------------------------------------------------------------
    def score(
        self,
        prompts: list[list[int]],
        responses: list[list[int]],
        temperatures: list[float],
        routes: list[torch.Tensor] | None = None,
    ) -> list[torch.Tensor]:
        """Train-path logprobs of every response (zkl/trainer/scoring.py), each rank scoring
        its share; every rank gets them all, in order. `routes`: the generator's, replayed."""
        world, size = self.world, self.cfg.rl.score_micro_batch
        shares = (world.share(prompts), world.share(responses), world.share(temperatures))
        mine = score(self.model, *shares, size, device=self.device, routes=routes)
        return world.gather(mine)

    def update(self, batch: UpdateBatch) -> dict[str, float]:
        """One optimizer step per minibatch on the clipped PG loss.

        Returns the statistics (`update_stats`), the new `weights/version` and
        `weights/changed_tensors`: how many of the tensors a refit sends changed bits.
        Sharded, each rank steps on its share of every minibatch (`_step_sharded`).
        """
        step = self._step_sharded if self.world.sharded else self._step
        before = weight_digests(self._forward_shards())
        zero = torch.zeros((), dtype=torch.float64, device=self.device)  # accumulated on device
        update_sq: torch.Tensor | float = 0.0 if self.world.sharded else zero
        losses: list[list[float]] = []
        grad_norms: list[float] = []
        for lo, hi in minibatch_edges(len(batch.prompts), self.cfg.rl.num_minibatches):
            loss, loss_stats = self._loss(batch, lo, hi)
            self.optimizer.zero_grad(set_to_none=True)
            for p in self.params:
                p.grad = None
            (loss if self.scaler is None else self.scaler.scale_loss(loss)).backward()
            grad_norm, update_sq = step(update_sq)
            losses.append([loss.item(), loss_stats["loss/clip_frac"],
                           loss_stats["loss/ratio_mean"]])  # fmt: skip
            grad_norms.append(grad_norm)
        self.version += 1
        totals = self.world.sum([x for row in losses for x in row] + [float(update_sq)])
        per = [totals[3 * i : 3 * i + 3] for i in range(len(losses))]
        stats = update_stats(per, grad_norms, totals[-1])
        stats["weights/version"] = self.version
        if self.scaler is not None:
            stats["optim/loss_scale"] = self.scaler.scale
            stats["optim/skipped_steps"] = self.scaler.skipped
        stats["weights/changed_tensors"] = self._changed_tensors(before)
        return stats

    def _loss(self, batch: UpdateBatch, lo: int, hi: int):
        """The clipped PG loss of minibatch lo..hi (this rank's share of it) and its stats.

        Sharded, a share's loss is its tokens' sum over the whole minibatch's token count, so
        the ranks' gradients, summed by FSDP's reduce-scatter, are the minibatch's gradient.
        """
        world, rl = self.world, self.cfg.rl
        num_tokens = None
        if world.sharded:
            num_tokens = sum(len(r) for r in batch.responses[lo:hi])
            a, b = distributed.bounds(hi - lo, world.rank, world.size)
            lo, hi = lo + a, lo + b
        tokens, mask, old, temps, advantages = minibatch(batch, lo, hi, self.device)
        with taping(replay_tape(batch.routes, lo, hi, tokens.shape[1])):
            logprobs = sequence_logprobs(self.model, tokens, temps)
        ref = None
        if self.reference is not None:
            with torch.no_grad():
                ref = sequence_logprobs(self.reference, tokens, temps)
        weights = minibatch_weights(batch, lo, hi, mask)
        return clipped_pg_loss(
            logprobs, old, advantages, mask, rl.clip_eps, ref, rl.kl_coef, num_tokens, weights
        )

    def _step(self, update_sq: torch.Tensor) -> tuple[float, torch.Tensor]:
        """Clip the gradient, step AdamW (on the fp32 masters, copied into the model); the
        gradient norm and `update_sq` plus this step's squared change of the model's weights."""
        if self.masters is not self.params:
            for m, p in zip(self.masters, self.params):
                m.grad = None if p.grad is None else p.grad.float()
                p.grad = None  # one copy of the gradients at a time
        if self.scaler is not None:
            finite = self.scaler.unscale(self.masters)
            self.scaler.update(finite)
            if not finite:  # an overflow: no step, a smaller scale next time
                return 0.0, update_sq
        grad_norm = torch.nn.utils.clip_grad_norm_(self.masters, self.cfg.rl.grad_clip)
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
        return grad_norm.item(), update_sq

    def _step_sharded(self, update_sq: float) -> tuple[float, float]:
        """`_step` on FSDP2's fp32 shards (the masters): the replicated parameters' gradients
        summed over the ranks, the norm and the weight change summed over every rank's own
        part of the weights (this rank's; the ranks' sums are added by `update`)."""
        world = self.world
        replicated = [p for p in self.params if p in self.replicated]
        fsdp.sum_replicated_grads(replicated)
        grads = [p.grad for p in self.params if p.grad is not None]
        owned = (p for p in self.params if p not in self.replicated or world.is_main)
        own = [fsdp.local(p.grad).float().square().sum(dtype=torch.float64)
               for p in owned if p.grad is not None]  # fmt: skip
        (grad_sq,) = world.sum([host_sum(own)])
        grad_norm = grad_sq**0.5
        coef = min(self.cfg.rl.grad_clip / (grad_norm + 1e-6), 1.0)
        with torch.no_grad():
            if coef < 1.0:
                for g in grads:
                    fsdp.local(g).mul_(coef)
            before = self._forward_shards()
            self.optimizer.step()
            after = self._forward_shards()
            moved = [(after[n].double() - before[n].double()).square().sum()
                     for n in self.owned_names]  # fmt: skip
            update_sq += host_sum(moved)
        return grad_norm, update_sq


def host_sum(parts: list[torch.Tensor]) -> float:
    """The sum of fp64 scalars as one Python float, one read per device: with host offload
    the sharded parts live on the CPU and the replicated ones on the GPU."""
    by_device: dict[torch.device, list[torch.Tensor]] = {}
    for part in parts:
        by_device.setdefault(part.device, []).append(part)
    return sum((float(torch.stack(group).sum()) for group in by_device.values()), 0.0)
