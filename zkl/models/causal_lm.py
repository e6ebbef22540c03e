"""The calls the trainer and the scheduler make on every model, written once for all of them."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from zkl.engines import NATIVE
from zkl.generation.kv_cache import KVCache
from zkl.models.config import check_positions
from zkl.routes import RouteTape


class CausalLM(nn.Module):
    """A model of `cfg` with `embed_tokens`: forward to logits and the gen path's cache.

    A model gives `hidden_states` and `lm_head`, or overrides `logits` (and sets
    `chunked_head = False`) when its framework computes the head itself;
    `make_cache` is overridden by models with more than K/V.
    """

    engine = NATIVE.name  # the `engine.name` that built it (the scheduler's graph rule reads it)
    # The train path runs `hidden_states` once and `lm_head` a chunk of tokens at a time
    # (zkl/trainer/scoring.py); a model whose framework computes its own head says False.
    chunked_head = True
    # The train path keeps each layer's inputs only and remakes the rest of its activations
    # in the backward (`trainer.activation_checkpointing`): one layer's activations at a time,
    # which is what lets a 16k-token sequence train on one GPU.
    checkpoint_layers = False

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        cache=None,
        slots: torch.Tensor | None = None,
        logit_index: torch.Tensor | None = None,
        routes: RouteTape | None = None,
    ) -> torch.Tensor:
        """tokens, positions [B, T] -> logits [B, T, V] (or [B, V] at `logit_index` [B]).

        With `cache` (gen path), K/V of these tokens go to the cache rows `slots` [B] and
        attention reads every cached key of the row; without it (train path), the row's
        own tokens are its keys and positions must be 0..T-1. `routes`: this forward's route
        tape, which its MoE layers record into or replay from (`zkl.routes`).
        """
        return self.logits(tokens, positions, cache, slots, logit_index, routes)

    def native_state_dict(self) -> dict[str, torch.Tensor]:
        """The weights under zkl's native names, which checkpoint export reads; a model whose
        framework names its parameters otherwise maps them back."""
        return self.state_dict()

    def check_positions(self, positions: int, needed_by: str) -> None:
        """ConfigError when `positions` pass the model's position limit: the scheduler asks
        the model, so the rule stays with the model's config and generation imports no model
        code."""
        check_positions(self.cfg, positions, needed_by)

    def logits(self, tokens, positions, cache, slots, logit_index, routes) -> torch.Tensor:
        hidden = self.hidden_states(tokens, positions, cache, slots, logit_index, routes)
        return self.lm_head(hidden)

    def run_layer(self, layer: nn.Module, *args):
        """`layer(*args)`, its activations remade in the backward where `checkpoint_layers`
        is set and a gradient is being built. The remade forward runs the same kernels on the
        same shapes, so the gradient is bitwise the one without it."""
        if self.checkpoint_layers and torch.is_grad_enabled():
            return checkpoint(layer, *args, use_reentrant=False)
        return layer(*args)

    def make_cache(self, num_slots: int, max_len: int) -> KVCache:
        """The gen path's cache of `num_slots` rows of `max_len` positions: K/V of every
        layer, in the model's dtype, on its device."""
        cfg, weight = self.cfg, self.embed_tokens.weight
        return KVCache(
            cfg.num_hidden_layers,
            num_slots,
            cfg.num_key_value_heads,
            max_len,
            cfg.head_dim,
            weight.dtype,
            weight.device,
        )
