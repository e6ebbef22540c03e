"""FSDP2 sharding of the trainer's model, so that its forward does one process's arithmetic.

The model's bf16 parameters become fp32 shards (exactly their upcast: these are the fp32
masters AdamW steps), cast back to bf16 shard by shard before each all-gather: the
unsharded weights the forward sees are the bits one process's bf16 model holds. Gradients
are reduce-scattered in fp32 as a plain sum (no division by the world size: the loss is
already normalised by the step's whole token count). Parameters a recipe keeps in fp32
beside bf16 ones (norms, the MoE router) are not sharded: FSDP2 needs one dtype per group,
the modules using them are called through methods its hooks do not see
(`RMSNorm.add_forward`, the router's weight read by its parent), and they are small; they
stay replicated and their gradients are summed over the ranks by `sum_replicated_grads`.

One difference from one process: an expert that no token of a minibatch chose gets a zero
gradient (not none), so AdamW still decays its moments and moves it by them.
"""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    FSDPModule,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
    register_fsdp_forward_method,
)
from torch.distributed.tensor import DTensor

from zkl.errors import ConfigError


def shard_model(
    model: nn.Module, upcast: bool, device: torch.device, offload: bool = False
) -> set[nn.Parameter]:
    """Shard `model` in place over the default group; return its replicated parameters.

    `upcast`: keep the sharded parameters in fp32 (the masters) and all-gather them cast to
    their own dtype, which must then be one dtype for every sharded parameter. `offload`:
    the shards and their gradients live in host memory (FSDP2's CPUOffloadPolicy), copied to
    the GPU for each all-gather; the values, and so the forward's bits, are the same.
    """
    # FSDP2 warns of every block that returns a view (an in-place op on it would skip its
    # pre-backward hook); the models never change a block's output in place.
    warnings.filterwarnings("ignore", message=".*returned a view tensor.*", category=UserWarning)
    params = list(model.parameters())
    low = {p.dtype for p in params if p.dtype != torch.float32}
    assert len(low) <= 1, f"one compute dtype expected, got {low}"
    replicated = {p for p in params if p.dtype == torch.float32} if low else set()
    compute = next(iter(low)) if low else torch.float32
    if upcast and low:
        for p in params:
            if p not in replicated:
                p.data = p.data.float()
    policy = MixedPrecisionPolicy(
        param_dtype=compute if upcast and low else None,
        reduce_dtype=torch.float32,
        cast_forward_inputs=False,  # the rotary tables and fp32 inputs keep their dtype
    )
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    where = CPUOffloadPolicy(pin_memory=True) if offload else OffloadPolicy()
    kw = {"mesh": mesh, "mp_policy": policy, "offload_policy": where, "ignored_params": replicated}
    for block in getattr(model, "layers", []):
        fully_shard(block, **kw)
    fully_shard(model, **kw)
    if hasattr(model, "hidden_states"):  # the train path's entry point (trainer/scoring.py)
        register_fsdp_forward_method(model, "hidden_states")
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)
    # An expert no token of this rank chose has no gradient here but may on another rank:
    # every rank reduce-scatters every parameter (a zero gradient for an unused one), or
    # the ranks' reduce-scatters would differ in size.
    if hasattr(model, "set_reduce_scatter_unused_params"):
        model.set_reduce_scatter_unused_params(True)
    elif dist.get_world_size() > 1 and any("experts" in n for n, _ in model.named_parameters()):
        raise ConfigError(
            f"an MoE model sharded over {dist.get_world_size()} ranks needs FSDP2's "
            f"set_reduce_scatter_unused_params, which torch {torch.__version__} lacks; "
            "upgrade torch, or set trainer.world_size=1."
        )
    return replicated


def sum_replicated_grads(params: list[nn.Parameter]) -> None:
    """All-reduce (sum) the gradients of the replicated parameters, as one flat buffer."""
    if dist.get_world_size() == 1:
        return
    for p in params:  # every rank sends the same sizes, used here or not
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    grads = [p.grad for p in params]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor; a plain (replicated) tensor as it is."""
    return t.to_local() if isinstance(t, DTensor) else t


def full(t: torch.Tensor, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The whole tensor in `dtype` on `device`, on every rank: each shard cast (and, when
    offloaded to the host, copied to `device`), then all-gathered."""
    if not isinstance(t, DTensor):
        return t.detach().to(device, dtype)
    shard = t.to_local().detach().to(device, dtype)
    spec = {"shape": t.shape, "stride": t.stride()}
    return DTensor.from_local(shard, t.device_mesh, t.placements, **spec).full_tensor()
