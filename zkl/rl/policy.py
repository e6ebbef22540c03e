"""The trainer's side: the policy model, fp32 master weights, AdamW, and refit weights."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from zkl import distributed
from zkl.checkpoint_check import warn_random_weights
from zkl.device import resolve_device
from zkl.models import build_model
from zkl.precision import DTYPES
from zkl.rl.grpo import clipped_pg_loss
from zkl.scoring import pad_sequences, sequence_logprobs

_INT_OF_SIZE = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def weight_digests(state: dict[str, torch.Tensor]) -> torch.Tensor:
    """[num_tensors, 2] int64 fingerprints of each tensor's bits: their sum and sum of squares.

    Equal bits give equal rows, so an update that leaves the weights a refit sends unchanged
    (all advantages zero, a learning rate below bf16's resolution) shows as no changed row;
    the certificate fails such a step. Cheaper than keeping a copy of the weights.
    """
    rows = []
    for t in state.values():
        bits = t.detach().reshape(-1).view(_INT_OF_SIZE[t.element_size()]).long()
        rows.append(torch.stack([bits.sum(), (bits * bits).sum()]))
    return torch.stack(rows)


class GatheredWeights(Mapping):
    """A sharded model's whole weights, each tensor all-gathered when it is read: a refit
    copying them in one at a time holds one whole tensor beside the shards, not the model.

    Every rank must read the same names in the same order (each read is a collective).
    """

    def __init__(self, params, dtypes, device, gather) -> None:
        self.params, self.dtypes, self.device, self.gather = params, dtypes, device, gather

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.gather(self.params[name], self.dtypes[name], self.device)

    def __iter__(self):
        return iter(self.params)

    def __len__(self) -> int:
        return len(self.params)

    def shape(self, name: str) -> torch.Size:
        return self.params[name].shape


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

    Sharded (`trainer.world_size` > 1 or `trainer.fsdp`, zkl/distributed/fsdp.py), the
    model's parameters are FSDP2's fp32 shards themselves (the masters); each rank scores
    and updates its share of every minibatch, and the refit weights are all-gathered.
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
            cfg.engine.backend,
        )
        self.world = distributed.current()
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
        from zkl.distributed.fsdp import shard_model

        rl = self.cfg.rl
        self.forward_dtypes = {n: p.dtype for n, p in self.model.named_parameters()}
        offload = self.cfg.trainer.offload
        self.replicated = shard_model(self.model, use_master, self.device, offload)
        self.params = self.masters = list(self.model.parameters())
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
            from torch.distributed.checkpoint.state_dict import get_state_dict

            model, optimizer = get_state_dict(self.model, self.optimizer)
            return {"model": model, "optimizer": optimizer}
        separate = self.masters is not self.params
        return {
            "model": self.model.state_dict(),
            "masters": [m.detach() for m in self.masters] if separate else None,
            "optimizer": self.optimizer.state_dict(),
            "version": self.version,
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore `state_dict()` in place (the generator's shared model sees the weights)."""
        if self.world.sharded:
            from torch.distributed.checkpoint.state_dict import set_state_dict

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

    def refit_state(self) -> dict[str, torch.Tensor]:
        """Exactly the tensors the trainer's forward uses (shared storage, no copy).

        Sharded: the whole tensors, each shard cast to the forward's dtype and all-gathered
        (the bits FSDP's own all-gather gives the forward); a collective of every rank.
        """
        if self.world.sharded:
            from zkl.distributed.fsdp import full

            named = self.model.named_parameters()
            return GatheredWeights(dict(named), self.forward_dtypes, self.device, full)
        return {name: p.detach() for name, p in self.model.named_parameters()}

    def _forward_shards(self) -> dict[str, torch.Tensor]:
        """This rank's part of the forward's weights (all of them when not sharded), on the
        compute device (host-offloaded shards are copied over, beside the replicated ones)."""
        if not self.world.sharded:
            return self.refit_state()
        from zkl.distributed.fsdp import local

        named = self.model.named_parameters()
        return {n: local(p.detach()).to(self.device, self.forward_dtypes[n]) for n, p in named}

    def weight_digests(self) -> torch.Tensor:
        """`weight_digests` of the weights the forward uses, of this rank's shards."""
        return weight_digests(self._forward_shards())

    def changed_tensors(self, before: torch.Tensor) -> int:
        """How many of the refit's tensors changed since `before = weight_digests()`."""
        changed = (self.weight_digests() != before).any(-1).double()
        if self.world.size > 1:  # a tensor changed when any rank's shard did
            import torch.distributed as dist

            changed = changed.to(self.world.device)
            dist.all_reduce(changed, op=dist.ReduceOp.MAX)
        return int(changed.sum())

    def update(self, batch: UpdateBatch) -> dict[str, float]:
        """One optimizer step per minibatch on the clipped PG loss; returns its statistics.

        `optim/update_norm` is the L2 norm of the change of the model's weights, the ones the
        forward uses and the generator receives (bf16 ones under a bf16 recipe): zero when an
        update moved the fp32 masters by less than the weights' precision.
        """
        if self.world.sharded:
            return self._update_sharded(batch)
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

    def _minibatch(self, batch: UpdateBatch, lo: int, hi: int):
        """(tokens, mask, old logprobs, temperatures) [B, T] of sequences lo..hi, on device."""
        tokens, mask = pad_sequences(batch.prompts[lo:hi], batch.responses[lo:hi])
        mask = mask[:, :-1]
        old = torch.zeros(mask.shape)
        for i, lp in enumerate(batch.old_logprobs[lo:hi]):
            old[i][mask[i]] = lp.cpu()
        device = self.device
        temps = torch.tensor(batch.temperatures[lo:hi], device=device)
        return tokens.to(device), mask.to(device), old.to(device), temps

    def _update_sharded(self, batch: UpdateBatch) -> dict[str, float]:
        """`update` with this rank's share of every minibatch; the same statistics.

        The loss of a share is its tokens' sum over the whole minibatch's token count, so the
        ranks' gradients, summed by FSDP's reduce-scatter, are the minibatch's gradient; the
        statistics are sums over the ranks. The fp32 shards are the masters AdamW steps.
        """
        from zkl.distributed import bounds
        from zkl.distributed.fsdp import local, sum_replicated_grads

        rl, world = self.cfg.rl, self.world
        count = len(batch.prompts)
        edges = torch.linspace(0, count, rl.num_minibatches + 1).long().tolist()
        update_sq = 0.0
        sums: list[list[float]] = []
        replicated = [p for p in self.params if p in self.replicated]
        names = [n for n, p in self.model.named_parameters()  # each weight counted once
                 if p not in self.replicated or world.is_main]  # fmt: skip
        for lo, hi in zip(edges[:-1], edges[1:]):
            num_tokens = sum(len(r) for r in batch.responses[lo:hi])
            a, b = bounds(hi - lo, world.rank, world.size)
            tokens, mask, old, temps = self._minibatch(batch, lo + a, lo + b)
            logprobs = sequence_logprobs(self.model, tokens, temps)
            ref = None
            if self.reference is not None:
                with torch.no_grad():
                    ref = sequence_logprobs(self.reference, tokens, temps)
            advantages = batch.advantages[lo + a : lo + b].to(self.device)
            loss, loss_stats = clipped_pg_loss(
                logprobs, old, advantages, mask, rl.clip_eps, ref, rl.kl_coef, num_tokens
            )
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            sum_replicated_grads(replicated)
            grads = [p.grad for p in self.params if p.grad is not None]
            owned = (p for p in self.params if p not in self.replicated or world.is_main)
            own = [local(p.grad).float().square().sum(dtype=torch.float64)
                   for p in owned if p.grad is not None]  # fmt: skip
            (grad_sq,) = world.sum([float(torch.stack(own).sum()) if own else 0.0])  # one read
            grad_norm = grad_sq**0.5
            coef = min(rl.grad_clip / (grad_norm + 1e-6), 1.0)
            with torch.no_grad():
                if coef < 1.0:
                    for g in grads:
                        local(g).mul_(coef)
                before = self._forward_shards()
                self.optimizer.step()
                after = self._forward_shards()
                moved = [(after[n].double() - before[n].double()).square().sum() for n in names]
                update_sq += float(torch.stack(moved).sum()) if moved else 0.0
            sums.append([loss.item(), loss_stats["loss/clip_frac"], loss_stats["loss/ratio_mean"],
                         grad_norm])  # fmt: skip
        self.version += 1
        totals = world.sum([x for row in sums for x in row[:3]] + [update_sq])
        per = [totals[3 * i : 3 * i + 3] for i in range(len(sums))]
        return {
            "loss/clip_frac": per[-1][1],
            "loss/ratio_mean": per[-1][2],
            "loss/pg_loss": sum(r[0] for r in per) / len(per),
            "optim/grad_norm": sum(r[3] for r in sums) / len(sums),
            "optim/update_norm": totals[-1] ** 0.5,
        }
