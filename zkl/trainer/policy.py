"""The trainer's side: the policy model, its optimizer, and the update loop both modes share.

The update minimizes the loss the policy is given (`loss_fn`, zkl/rl/loss.py for GRPO's), as
torchtitan's trainer takes its TrainSpec's: the algorithm owns its math, the trainer the steps.
Two policies fill in what differs (zkl/trainer/build.py picks one): `LocalPolicy`
(zkl/trainer/local.py), one process that owns the whole model, and `ShardedPolicy`
(zkl/trainer/sharded.py), FSDP2's shards with the refit weights all-gathered.
"""

from __future__ import annotations

import abc
import copy
from collections.abc import Mapping

import torch
import torch.distributed as dist

from zkl.device import resolve_device
from zkl.distributed import ranks
from zkl.engine_model import build_engine_model
from zkl.models.hf_weights_check import warn_random_weights
from zkl.precision.fp16 import DynamicLossScaler
from zkl.precision.recipes import DTYPES
from zkl.routes import routing_metrics
from zkl.trainer.batch import UpdateBatch, micro_batch_edges, minibatch, minibatch_edges
from zkl.trainer.scoring import score, sequence_logprobs
from zkl.trainer.update import LossFn, update_stats
from zkl.trainer.weights import weight_digests


class Policy(abc.ABC):
    """The model the trainer's forward uses, and the optimizer that updates it.

    A subclass sets up `params` (what the backward fills) and `optimizer`, and says how a
    step, a minibatch share, the refit weights and the state dict look in its mode.
    `loss_fn`: what `update` minimizes; a policy that only scores needs none. `world`: this
    process's rank of the run (`zkl.distributed.ranks.init`'s), handed in; one process by default.
    """

    params: list[torch.nn.Parameter]
    optimizer: torch.optim.Optimizer

    def __init__(
        self, cfg, loss_fn: LossFn | None = None, world: ranks.World | None = None
    ) -> None:
        self.cfg = cfg
        self.loss_fn = loss_fn
        self.world = world if world is not None else ranks.World()
        self.compute_dtype = DTYPES[cfg.precision.compute_dtype]
        self.device = resolve_device(cfg.device)
        warn_random_weights(cfg.model)
        self.model = build_engine_model(
            cfg.model,
            self.compute_dtype,
            cfg.precision.linear_quant,
            cfg.seed,
            self.device,
            cfg.engine.name,
        )
        self.model.checkpoint_layers = cfg.trainer.activation_checkpointing
        fp16 = cfg.precision.compute_dtype == "float16"  # its update scales the loss
        self.scaler = DynamicLossScaler() if fp16 else None
        self.reference = copy.deepcopy(self.model).eval() if cfg.rl.kl_coef > 0 else None
        self.version = 0
        self.use_master = cfg.precision.master_weights_fp32 and any(
            p.dtype != torch.float32 for p in self.model.parameters()
        )

    def _adamw(self, groups: list[dict]) -> torch.optim.AdamW:
        rl = self.cfg.rl
        return torch.optim.AdamW(
            groups, lr=rl.lr, betas=tuple(rl.betas), weight_decay=rl.weight_decay
        )

    # -- what each mode says ------------------------------------------------------------
    @abc.abstractmethod
    def state_dict(self) -> dict:
        """What a bitwise resume needs: weights, fp32 masters, AdamW state, weight version."""

    @abc.abstractmethod
    def load_state_dict(self, state: dict) -> None:
        """Restore `state_dict()` in place (the generator's shared model sees the weights)."""

    @abc.abstractmethod
    def refit_state(self) -> Mapping[str, torch.Tensor]:
        """Exactly the tensors the trainer's forward uses, whole, as a refit sends them."""

    @abc.abstractmethod
    def _forward_shards(self) -> dict[str, torch.Tensor]:
        """This rank's part of the forward's weights, on the compute device."""

    @abc.abstractmethod
    def _share(self, batch: UpdateBatch, lo: int, hi: int) -> tuple[int, int, int | None]:
        """The rows of minibatch lo..hi this rank learns from, and the token count its loss
        is divided by (None: its own)."""

    @abc.abstractmethod
    def _step(self, update_sq: torch.Tensor) -> tuple[float, torch.Tensor]:
        """Clip the gradient and step the optimizer; the gradient norm and `update_sq` plus
        this step's squared change of the forward's weights."""

    # -- shared ---------------------------------------------------------------------------
    def _changed_tensors(self, before: torch.Tensor) -> int:
        """How many of the refit's tensors changed since `before`, their `weight_digests`."""
        changed = (weight_digests(self._forward_shards()) != before).any(-1).double()
        if self.world.size > 1:  # a tensor changed when any rank's shard did
            changed = changed.to(self.world.device)
            dist.all_reduce(changed, op=dist.ReduceOp.MAX)
        return int(changed.sum())

    def score(
        self,
        prompts: list[list[int]],
        responses: list[list[int]],
        temperatures: list[float],
        routes: list[torch.Tensor] | None = None,
        replay: bool = False,
    ) -> tuple[list[torch.Tensor], dict[str, float]]:
        """Train-path logprobs of every response (zkl/trainer/scoring.py), each rank scoring
        its share; every rank gets them all, in order. With the generator's `routes`, the
        forward replays them (`replay`) or only compares its own with them, and the second
        value holds the `routing/*` shares of the trainer's choices that differ from them."""
        world, size = self.world, self.cfg.rl.score_micro_batch
        shares = (world.share(prompts), world.share(responses), world.share(temperatures))
        counts = torch.zeros(4, dtype=torch.float64)
        mine = score(
            self.model,
            *shares,
            size,
            device=self.device,
            routes=None if routes is None else world.share(routes),
            replay=replay,
            route_counts=counts,
        )
        routing = {} if routes is None else routing_metrics(world.sum(counts.tolist()))
        return world.gather(mine), routing

    def update(self, batch: UpdateBatch) -> dict[str, float]:
        """One optimizer step per minibatch on the policy's `loss_fn`.

        Returns the statistics (`update_stats`), the new `weights/version` and
        `weights/changed_tensors`: how many of the tensors a refit sends changed bits.
        """
        before = weight_digests(self._forward_shards())
        update_sq = torch.zeros((), dtype=torch.float64, device=self.device)  # on the device
        losses: list[list[float]] = []
        grad_norms: list[float] = []
        for lo, hi in minibatch_edges(len(batch.prompts), self.cfg.rl.num_minibatches):
            self.optimizer.zero_grad(set_to_none=True)
            for p in self.params:
                p.grad = None
            lo, hi, num_tokens = self._share(batch, lo, hi)
            pieces = micro_batch_edges(lo, hi, self.cfg.rl.update_micro_batch)
            if len(pieces) > 1 and num_tokens is None:  # every piece's mean over them all
                num_tokens = sum(len(r) for r in batch.responses[lo:hi])
            row: list[float] = []
            for a, b in pieces:  # the pieces' gradients add up in the parameters' .grad
                loss, loss_stats = self._loss(batch, a, b, num_tokens)
                (loss if self.scaler is None else self.scaler.scale_loss(loss)).backward()
                values = [loss.item(), *loss_stats.values()]
                row = [x + y for x, y in zip(row, values, strict=True)] if row else values
            grad_norm, update_sq = self._step(update_sq)
            losses.append(row)
            grad_norms.append(grad_norm)
        self.version += 1
        names, width = list(loss_stats), 1 + len(loss_stats)
        totals = self.world.sum([x for row in losses for x in row] + [float(update_sq)])
        per = [totals[width * i : width * (i + 1)] for i in range(len(losses))]
        stats = update_stats(names, per, grad_norms, totals[-1])
        stats["weights/version"] = self.version
        if self.scaler is not None:
            stats["optim/loss_scale"] = self.scaler.scale
            stats["optim/skipped_steps"] = self.scaler.skipped
        stats["weights/changed_tensors"] = self._changed_tensors(before)
        return stats

    def _loss(self, batch: UpdateBatch, lo: int, hi: int, num_tokens: int | None):
        """The loss of sequences lo..hi (this rank's, or a piece of them) and its stats, its
        mean over `num_tokens` response tokens (None: the rows' own)."""
        assert self.loss_fn is not None, "a policy built without a loss_fn only scores"
        mb = minibatch(batch, lo, hi, self.device)
        logprobs = sequence_logprobs(self.model, mb.tokens, mb.temperatures, mb.routes)
        ref = None
        if self.reference is not None:
            with torch.no_grad():
                ref = sequence_logprobs(self.reference, mb.tokens, mb.temperatures)
        return self.loss_fn(
            logprobs,
            mb.old_logprobs,
            mb.advantages,
            mb.mask,
            ref_logprobs=ref,
            num_tokens=num_tokens,
            weights=mb.weights,
        )
