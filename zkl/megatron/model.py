"""A megatron-core GPTModel behind the interface of zkl's native Transformer.

`MegatronLM(tokens, positions, cache, slots, logit_index)` runs megatron's own forward
(embedding, TransformerBlock, final norm, output layer) with zkl's modules in the spec
(`zkl.megatron.spec`), so zkl's Scheduler (continuous batching, both KV modes, the
prefix cache, sampling), scoring, refit and certification drive it unchanged. Parameter
names are megatron's (under `gpt.`); weights come from zkl's seeded init or an HF checkpoint
(both through zkl's native state dict and `mapping.to_megatron`, so both engines start from
the same weights), or from a megatron distributed checkpoint (`model.checkpoint` holding
`metadata.json`).

Imports megatron-core (Python >= 3.12).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from megatron.core import parallel_state, tensor_parallel
from megatron.core.models.gpt import GPTModel
from megatron.core.transformer.transformer_config import TransformerConfig

from zkl import ops
from zkl.distributed import ranks
from zkl.megatron.attention import Step
from zkl.megatron.mapping import (
    from_megatron,
    gpt_model_kwargs,
    to_megatron,
    transformer_config_kwargs,
)
from zkl.megatron.spec import block_spec
from zkl.models.causal_lm import CausalLM
from zkl.models.config import ModelConfig
from zkl.models.hf_checkpoint import load_state_dict
from zkl.models.transformer import RotaryEmbedding, Transformer, init_weights
from zkl.precision.recipes import DTYPES, keeps_fp32

DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
_BUILT_OVER: list[Any] = []  # the default group megatron's parallel state was built over


def ensure_parallel_state(device: torch.device, seed: int) -> None:
    """Megatron's process groups for one process (TP = PP = EP = 1), over the default group.

    A process that already has a default group (a dedicated generator's refit group) keeps
    it; megatron's groups are then built over it with every size 1. Groups built over a
    default group that has since been left (a run's end) are built again.
    """
    if not dist.is_initialized():
        ranks.group_of_one()
    world = dist.distributed_c10d._get_default_group()
    if _BUILT_OVER and _BUILT_OVER[0] is not world:
        parallel_state.destroy_model_parallel()
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)
        _BUILT_OVER[:] = [world]
    if device.type == "cuda":
        tensor_parallel.model_parallel_cuda_manual_seed(seed)


def transformer_config(model: ModelConfig, compute_dtype: torch.dtype) -> TransformerConfig:
    kwargs = transformer_config_kwargs(model, DTYPE_NAMES[compute_dtype])
    kwargs["activation_func"] = {"silu": F.silu}[kwargs["activation_func"]]
    kwargs["params_dtype"] = DTYPES[kwargs["params_dtype"]]
    return TransformerConfig(**kwargs)


class MegatronLM(CausalLM):
    """zkl's model interface over a megatron-core GPTModel (see the module docstring)."""

    chunked_head = False  # GPTModel's forward makes the logits (`logits` below)

    def __init__(self, cfg: ModelConfig, engine: str, compute_dtype: torch.dtype):
        super().__init__()
        self.cfg = cfg
        self.engine = engine  # the `engine.name` whose megatron-core spec built it
        self.rope = RotaryEmbedding(cfg)
        self.step = Step(rope=self.rope)
        self.gpt = GPTModel(
            config=transformer_config(cfg, compute_dtype),
            transformer_layer_spec=block_spec(cfg, engine, self.step),
            **gpt_model_kwargs(cfg),
        )

    @property
    def embed_tokens(self) -> torch.nn.Module:
        """The embedding (the engine reads the model's device and dtype from its weight)."""
        return self.gpt.embedding.word_embeddings

    def _head(self, hidden_states, output_layer, output_weight, context, **_):
        """megatron's output processor: [T, B, H] final-normed states -> zkl's logits."""
        x = hidden_states.transpose(0, 1)  # [B, T, H]
        if context is not None:  # logit_index [B]
            x = x[torch.arange(x.shape[0], device=x.device), context]
        if ops.runs_invariant("linear"):
            weight = output_layer.weight if output_weight is None else output_weight
            return ops.linear(x, weight, None)
        logits, _ = output_layer(x, weight=output_weight, runtime_gather_output=True)
        return logits

    def native_state_dict(self) -> dict[str, torch.Tensor]:
        """GPTModel's weights under zkl's native names (`mapping.from_megatron`)."""
        state = {k: v for k, v in self.gpt.state_dict().items() if not k.endswith("_extra_state")}
        return from_megatron(state, self.cfg, self.engine)

    def logits(self, tokens, positions, cache, slots, logit_index, routes=None) -> torch.Tensor:
        """GPTModel's forward with the step's positions and cache set for its layers. Its MoE
        slots take no route tape (`rl.routing_replay` is refused with megatron engines)."""
        if routes is not None:
            raise ValueError("megatron's MoE slots neither record nor replay routes")
        self.step.positions, self.step.cache, self.step.slots = positions, cache, slots
        try:
            return self.gpt(
                input_ids=tokens,
                position_ids=positions,
                attention_mask=None,
                output_processor=self._head,
                output_processor_context=logit_index,
            )
        finally:
            self.step.positions = self.step.cache = self.step.slots = None


def _cast(model: MegatronLM, compute_dtype: torch.dtype) -> None:
    """zkl's recipe in megatron's names: norms and the MoE router stay fp32, the rest casts."""
    for name, module in model.named_modules():
        fp32 = keeps_fp32(name) or name.endswith("mlp.router")
        for p in module.parameters(recurse=False):
            p.data = p.data.to(torch.float32 if fp32 else compute_dtype)


def _load_dist_checkpoint(model: MegatronLM, path: str) -> None:
    from megatron.core import dist_checkpointing

    sharded = model.gpt.sharded_state_dict(prefix="")
    state = dist_checkpointing.load(sharded, path)
    model.gpt.load_state_dict(state, strict=False)


def build_megatron_model(
    cfg: ModelConfig,
    engine: str,
    compute_dtype: torch.dtype,
    seed: int = 0,
    device: torch.device | str = "cuda",
) -> MegatronLM:
    """The megatron model on `device` with zkl's weights (seeded, HF) or a dist checkpoint."""
    device = torch.device(device)
    ensure_parallel_state(device, seed)
    model = MegatronLM(cfg, engine, compute_dtype)
    is_dist = bool(cfg.checkpoint) and (Path(cfg.checkpoint) / "metadata.json").is_file()
    if is_dist:
        _load_dist_checkpoint(model, cfg.checkpoint)
    else:
        model.gpt.load_state_dict(_with_extra_state(model.gpt, native_state_for(cfg, engine, seed)))
    _cast(model, compute_dtype)
    return model.to(device)


def _with_extra_state(module: torch.nn.Module, weights: dict[str, torch.Tensor]) -> dict:
    """`weights` and the module's own `_extra_state` entries (Transformer Engine's FP8 metadata,
    which zkl's weights do not carry), so that a strict load still names any missing weight."""
    extra = {k: v for k, v in module.state_dict().items() if k.endswith("._extra_state")}
    return {**extra, **weights}


def native_state_for(cfg: ModelConfig, engine: str, seed: int) -> dict[str, torch.Tensor]:
    """zkl's native weights (seeded init or `cfg.checkpoint`) in megatron's names, fp32 CPU."""
    if cfg.checkpoint:
        state = load_state_dict(cfg.checkpoint, cfg, "cpu")
    else:
        native = Transformer(cfg)
        init_weights(native, seed)
        state = native.state_dict()
    return to_megatron(state, cfg, engine)
