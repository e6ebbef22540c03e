"""The sharded policy (`trainer.world_size` > 1 or `trainer.fsdp`, zkl/distributed/fsdp.py):
the model's parameters are FSDP2's fp32 shards themselves (the masters); each rank scores
and updates its share of every minibatch, and the refit weights are all-gathered."""

from __future__ import annotations

import torch
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from zkl.distributed import fsdp, ranks
from zkl.trainer.batch import UpdateBatch
from zkl.trainer.policy import Policy
from zkl.trainer.update import LossFn
from zkl.trainer.weights import GatheredWeights


class ShardedPolicy(Policy):
    def __init__(
        self, cfg, loss_fn: LossFn | None = None, world: ranks.World | None = None
    ) -> None:
        super().__init__(cfg, loss_fn, world)
        self.forward_dtypes = {n: p.dtype for n, p in self.model.named_parameters()}
        offload = cfg.trainer.offload
        self.replicated = fsdp.shard_model(self.model, self.use_master, self.device, offload)
        self.params = list(self.model.parameters())
        is_main = self.world.is_main
        self.owned_names = [n for n, p in self.model.named_parameters()  # each counted once
                            if p not in self.replicated or is_main]  # fmt: skip
        groups = [
            [p for p in self.params if p not in self.replicated],
            [p for p in self.params if p in self.replicated],
        ]  # two groups: AdamW's foreach path cannot mix DTensor shards with plain tensors
        self.optimizer = self._adamw([{"params": g} for g in groups if g])

    def state_dict(self) -> dict:
        """This rank's shards, as torch.distributed.checkpoint saves them, and the version."""
        model, optimizer = get_state_dict(self.model, self.optimizer)
        return {"model": model, "optimizer": optimizer, "version": self.version}

    def load_state_dict(self, state: dict) -> None:
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optimizer"])  # fmt: skip
        self.version = state["version"]

    def refit_state(self) -> GatheredWeights:
        """The whole tensors, each shard cast to the forward's dtype and all-gathered (the
        bits FSDP's own all-gather gives the forward); a collective of every rank."""
        named = dict(self.model.named_parameters())
        return GatheredWeights(named, self.forward_dtypes, self.device, fsdp.full)

    def _forward_shards(self) -> dict[str, torch.Tensor]:
        """Host-offloaded shards are copied over, beside the replicated ones."""
        named = self.model.named_parameters()
        return {n: fsdp.local(p.detach()).to(self.device, self.forward_dtypes[n]) for n, p in named}

    def _share(self, batch: UpdateBatch, lo: int, hi: int) -> tuple[int, int, int]:
        """A share's loss is its tokens' sum over the whole minibatch's token count, so the
        ranks' gradients, summed by FSDP's reduce-scatter, are the minibatch's gradient."""
        num_tokens = sum(len(r) for r in batch.responses[lo:hi])
        a, b = ranks.bounds(hi - lo, self.world.rank, self.world.size)
        return lo + a, lo + b, num_tokens

    def _step(self, update_sq: torch.Tensor) -> tuple[float, torch.Tensor]:
        """The step on FSDP2's fp32 shards: the replicated parameters' gradients summed over
        the ranks, the norm and the weight change summed over every rank's own part of the
        weights (this rank's; the ranks' sums are added by `update`)."""
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
