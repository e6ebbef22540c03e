"""zkl's fixes inside megatron-core, through its ModuleSpec: no fork, no monkey-patching.

Each zkl module here subclasses the megatron class the engine's own spec would use and
keeps its parameters and names; its forward asks the fix registry at call time: fix on ->
zkl's invariant kernel (`zkl.ops`), fix off -> megatron's own forward. So default mode is
megatron's code, zero mode is zkl's kernels, and `fixes.<name>=false` ablates one source.

Core attention is always zkl's slot (`zkl.megatron.attention`), because it is where zkl's KV
cache plugs in.

Imports megatron-core (Python >= 3.12); `zkl.engines.engine_problem` runs first.
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import torch
import torch.nn.functional as F
from megatron.core.fusions.fused_bias_dropout import get_bias_dropout_add
from megatron.core.models.backends import LocalSpecProvider
from megatron.core.models.gpt.gpt_layer_specs import get_mlp_module_spec_for_backend
from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from megatron.core.transformer.attention import SelfAttention, SelfAttentionSubmodules
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.identity_op import IdentityOp
from megatron.core.transformer.moe.moe_layer import MoELayer
from megatron.core.transformer.moe.moe_utils import router_gating_linear
from megatron.core.transformer.moe.router import TopKRouter
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_block import TransformerBlockSubmodules
from megatron.core.transformer.transformer_layer import TransformerLayer, TransformerLayerSubmodules

from zkl import ops
from zkl.engines import Engine, engine_named
from zkl.megatron.attention import Step, ZklCoreAttention, te_core_attention_class
from zkl.models.config import ModelConfig
from zkl.models.moe import fixed_order, fixed_route, run_experts

# -- norms ------------------------------------------------------------------------------


class ZklRMSNorm(torch.nn.Module):
    """RMSNorm slot (megatron's local spec: `torch.nn.RMSNorm` via WrappedTorchNorm).

    Fix on: `zkl.ops.rms_norm` (one program per row); off: torch's `F.rms_norm`, as
    megatron's local spec runs it.
    """

    def __init__(self, config, hidden_size: int, eps: float = 1e-5, **_):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden_size))
        self.eps = eps
        self.config = config

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if ops.runs_invariant("rms_norm"):
            return ops.rms_norm(x, self.weight, self.eps)
        return F.rms_norm(x, (x.shape[-1],), self.weight.to(x.dtype), self.eps)


# -- linear layers (TP = 1) ------------------------------------------------------------


def _zkl_linear(module, x: torch.Tensor, weight: torch.Tensor | None):
    """The (output, bias) pair megatron's parallel linears return, through `zkl.ops.linear`."""
    weight = module.weight if weight is None else weight
    bias = getattr(module, "bias", None)
    if bias is not None and bias.numel() == 0:  # Transformer Engine's "no bias"
        bias = None
    if getattr(module, "skip_bias_add", False):
        return ops.linear(x, weight, None), bias
    return ops.linear(x, weight, bias), None


class ZklColumnParallelLinear(ColumnParallelLinear):
    def forward(self, input_, weight=None, runtime_gather_output=None):
        if ops.runs_invariant("linear"):
            return _zkl_linear(self, input_, weight)
        return super().forward(input_, weight, runtime_gather_output)


class ZklRowParallelLinear(RowParallelLinear):
    def forward(self, input_):
        if ops.runs_invariant("linear"):
            return _zkl_linear(self, input_, None)
        return super().forward(input_)


def zkl_linear_class(base: type) -> type:
    """A subclass of any megatron/TE linear `base` whose forward takes zkl's GEMM when on.

    For the TE and inference specs. A `*LayerNormColumnParallelLinear` base carries the
    fused pre-norm (`layer_norm_weight`): zkl runs it as `zkl.ops.rms_norm`, then the GEMM.
    """
    fused_norm = "LayerNorm" in base.__name__

    def forward(self, input_, *args, **kwargs):
        if not ops.runs_invariant("linear"):
            return base.forward(self, input_, *args, **kwargs)
        if fused_norm:
            input_ = ops.rms_norm(input_, self.layer_norm_weight, self.config.layernorm_epsilon)
        return _zkl_linear(self, input_, None)

    return type(f"Zkl{base.__name__}", (base,), {"forward": forward, "__doc__": base.__doc__})


# -- the MLP's activation ----------------------------------------------------------------


class ZklSwiGLU(torch.nn.Module):
    """The MLP's activation slot (`MLPSubmodules.activation_func`, read with the config's
    `use_te_activation_func`), dense and expert MLPs alike: fc1's [gate; up] through
    `zkl.ops.silu_mul`, the one form native runs in every mode (no fix governs it). Megatron's
    own `F.silu(gate) * up` rounds otherwise (a fused Triton pass on CUDA here), and on the CPU
    by an element's place in its tensor."""

    def __init__(self, config=None):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = torch.chunk(x, 2, dim=-1)
        return ops.silu_mul(gate, up)


# -- MoE ---------------------------------------------------------------------------------


class ZklTopKRouter(TopKRouter):
    """Router slot, megatron's own routing. zkl's recipe keeps the router weight in fp32 where
    megatron's holds it in `params_dtype` (bf16 beside bf16 activations); megatron's gating GEMM
    (Transformer Engine's where installed) takes one dtype, so the logits are computed as in
    megatron's recipe: the weight in the activations' dtype, the output in `moe_router_dtype`
    when set."""

    def gating(self, input: torch.Tensor) -> torch.Tensor:
        out_dtype = {"fp32": torch.float32, "fp64": torch.float64}
        router_dtype = out_dtype.get(self.config.moe_router_dtype, input.dtype)
        bias = None if self.bias is None else self.bias.to(input.dtype)
        return router_gating_linear(input, self.weight.to(input.dtype), bias, router_dtype)


class ZklMoELayer(MoELayer):
    """MoE slot. Fix on: zkl's fp32 router (stable top-k) and fixed-order combine over the
    megatron experts' own modules; off: megatron's router, dispatcher and unpermute."""

    def forward(self, hidden_states, *args, **kwargs):
        if not fixed_order():
            return super().forward(hidden_states, *args, **kwargs)
        experts = getattr(self.experts, "local_experts", None)
        if experts is None:
            raise NotImplementedError(
                f"moe_combine_order needs per-expert modules (SequentialMLP); "
                f"{type(self.experts).__name__} has grouped weights."
            )
        shape = hidden_states.shape
        x = hidden_states.reshape(-1, shape[-1])  # [N, H]
        top_i, top_w = fixed_route(
            x,
            self.router.weight,
            self.config.moe_router_topk,
            not self.config.moe_router_pre_softmax,
        )

        def expert_fn(module):
            return lambda rows: module(rows)[0]

        out = run_experts(x, top_i, top_w, [expert_fn(e) for e in experts], fixed=True)
        return out.reshape(shape), None


# -- the spec ----------------------------------------------------------------------------


class Providers(NamedTuple):
    """The modules of one megatron-core spec, zkl's subclasses of its provider's."""

    provider: object  # megatron's spec provider
    column: type
    row: type
    fused: type | None  # norm + column linear in one module (TE), or None
    norm: type
    core_attention: type


def _local() -> Providers:
    return Providers(
        LocalSpecProvider(),
        ZklColumnParallelLinear,
        ZklRowParallelLinear,
        None,
        ZklRMSNorm,
        ZklCoreAttention,
    )


def _transformer_engine(inference: bool) -> Providers:
    # Transformer Engine is optional: imported only for the specs built on it
    from megatron.core.extensions.transformer_engine_spec_provider import TESpecProvider
    from megatron.core.models.backends import InferenceSpecProvider

    provider = InferenceSpecProvider() if inference else TESpecProvider()
    return Providers(
        provider,
        zkl_linear_class(provider.column_parallel_linear()),
        zkl_linear_class(provider.row_parallel_linear()),
        zkl_linear_class(provider.column_parallel_layer_norm_linear()),
        ZklRMSNorm,
        te_core_attention_class(provider.core_attention()),
    )


# An engine's `spec` (zkl.engines) -> the modules of megatron-core's spec of that name.
PROVIDERS = {
    "local": _local,
    "te": partial(_transformer_engine, inference=False),
    "te_inference": partial(_transformer_engine, inference=True),
}


def _mlp_spec(model: ModelConfig, spec_name: str, moe: bool):
    provider, column, row, fused, _, _ = PROVIDERS[spec_name]()
    if not moe:
        spec = get_mlp_module_spec_for_backend(backend=provider, num_experts=None)
        submodules = spec.keywords["submodules"]
        submodules.linear_fc1 = fused or column
        submodules.linear_fc2 = row
        submodules.activation_func = ZklSwiGLU
        return spec
    spec = get_mlp_module_spec_for_backend(
        backend=provider, num_experts=model.moe.num_experts, moe_grouped_gemm=False
    )
    spec.keywords["submodules"].router = ZklTopKRouter
    experts = spec.keywords["submodules"].experts
    expert_mlp = getattr(experts, "keywords", {}).get("submodules")
    if expert_mlp is None or not hasattr(expert_mlp, "linear_fc1"):
        raise NotImplementedError(f"zkl's MoE slot needs per-expert MLPs, not {experts}")
    expert_mlp.linear_fc1, expert_mlp.linear_fc2 = column, row
    expert_mlp.activation_func = ZklSwiGLU
    return partial(ZklMoELayer, *spec.args, **spec.keywords)


def layer_spec(model: ModelConfig, engine: Engine, step: Step, moe: bool) -> ModuleSpec:
    """One TransformerLayer spec with zkl's modules in every slot (docs/megatron.md's table):
    the engine's spec, and for an MoE layer's MLP its `moe_spec`."""
    _, column, row, fused, norm, core_attention = PROVIDERS[engine.spec]()
    qk_norm = norm if model.qk_norm else IdentityOp
    # MoE layers keep a separate pre-MLP norm (megatron's TE spec does the same).
    pre_mlp = norm if (fused is None or moe) else IdentityOp
    return ModuleSpec(
        module=TransformerLayer,
        submodules=TransformerLayerSubmodules(
            input_layernorm=norm if fused is None else IdentityOp,
            self_attention=ModuleSpec(
                module=SelfAttention,
                params={"attn_mask_type": AttnMaskType.causal},
                submodules=SelfAttentionSubmodules(
                    linear_qkv=fused or column,
                    core_attention=partial(core_attention, step=step),
                    linear_proj=row,
                    q_layernorm=qk_norm,
                    k_layernorm=qk_norm,
                ),
            ),
            self_attn_bda=get_bias_dropout_add,
            pre_mlp_layernorm=pre_mlp,
            mlp=_mlp_spec(model, engine.spec_for(moe), moe),
            mlp_bda=get_bias_dropout_add,
        ),
    )


def block_spec(model: ModelConfig, engine: str, step: Step) -> TransformerBlockSubmodules:
    """The decoder of `engine` (`engine.name`): one layer spec per layer (dense or MoE by
    zkl's rule), zkl's final norm."""
    entry = engine_named(engine)
    layers = [
        layer_spec(model, entry, step, model.layer_is_moe(i))
        for i in range(model.num_hidden_layers)
    ]
    return TransformerBlockSubmodules(layer_specs=layers, layer_norm=ZklRMSNorm)
