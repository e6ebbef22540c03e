"""The decode step: one token for every running row, as one function of device tensors.

`decode_one_token` is the whole step (forward one token per row -> sample -> logprob ->
commit); the scheduler calls it eagerly or captures it in a CUDA graph (zkl/generation/graphs.py),
so it reads only the model, the cache, the slot state and the rows it is given. The scheduler
reports, for every sampled token, its raw logprob, of softmax(logits / temperature) before
any top-k / top-p filter, as the trainer scores it: through the trainer's own fp32 path
(the `logprob_path` fix) or, with that fix off, as a fast generator (vLLM's kind) reports it,
in the model dtype.
Beside it goes `lp_sampled`, the logprob under the filtered distribution the token was drawn
from (`rl.correction.behavior=sampled`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch

from zkl import ops
from zkl.generation import route_cache
from zkl.generation.kv_cache import KVCache
from zkl.generation.sampling import filtered, gumbel_max, scaled_logits
from zkl.generation.slots import SlotState
from zkl.invariance import is_enabled
from zkl.routes import RouteTape


class GenerationModel(Protocol):
    """What the scheduler needs of a model (native, hybrid or megatron alike): the decode cache
    of its own layers, and a forward that writes K/V (and any recurrent state) of its tokens
    to that cache's rows `slots` before attending over them."""

    embed_tokens: torch.nn.Embedding  # its weight gives the model's device and dtype
    cfg: Any  # its ModelConfig: the CUDA-graph rule reads it
    engine: str  # the `engine.name` that built it

    def check_positions(self, positions: int, needed_by: str) -> None: ...

    def make_cache(self, num_slots: int, max_len: int) -> KVCache: ...

    def __call__(
        self,
        tokens: torch.Tensor,  # [B, T]
        positions: torch.Tensor,  # [B, T] absolute
        cache: KVCache | None = None,
        slots: torch.Tensor | None = None,  # [B]
        logit_index: torch.Tensor | None = None,  # [B]: logits of that position only
        routes: RouteTape | None = None,  # records each MoE layer's experts
    ) -> torch.Tensor: ...


@dataclass(frozen=True)
class Sampler:
    """How one generate call samples. Whether any row filters by top-k / top-p is known from
    the requests, so sampling reads no device value to find out."""

    top_k: bool
    top_p: bool
    eos_id: int | None

    @property
    def filters(self) -> bool:
        """Whether some row samples from a top-k / top-p filtered distribution."""
        return self.top_k or self.top_p

    def sample(
        self, state: SlotState, rows: torch.Tensor, logits: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(next token [B], its raw logprob [B], its logprob under the filtered, renormalised
        distribution it was drawn from [B]); without a filter the last two are the same tensor.

        The raw logprob is of softmax(logits / T), never of the filtered distribution, in
        both modes: what the trainer scores and every mismatch metric compares.
        """
        count, temps = state.count[rows], state.temperature[rows]
        shared_path = is_enabled("logprob_path")
        if shared_path and not self.filters:  # the sampler divides, in one pass
            next_tokens = gumbel_max(logits, state.seed[rows], count, temperature=temps)
        else:
            scaled = scaled_logits(logits, temps)  # [B, V] fp32
            scores = filtered(
                scaled,
                state.top_k[rows] if self.top_k else None,
                state.top_p[rows] if self.top_p else None,
            )
            next_tokens = gumbel_max(scores, state.seed[rows], count)
        if shared_path:
            logprobs = ops.token_logprobs(logits, next_tokens, temps.unsqueeze(-1))
        else:
            logprobs = default_mode_logprobs(scaled, logits.dtype, next_tokens)
        if not self.filters:
            return next_tokens, logprobs, logprobs
        return next_tokens, logprobs, logprobs - kept_log_mass(scaled, scores)

    def take(self, state: SlotState, rows: torch.Tensor, logits: torch.Tensor) -> None:
        """Sample the rows' next tokens from logits [B, V] and commit them to the state
        (output, count, next input, done at EOS or the limit); finished rows idle."""
        next_tokens, logprobs, lp_sampled = self.sample(state, rows, logits)
        if self.filters:  # unfiltered, lp_sampled is the logprob (scheduler._retire)
            state.record(rows, state.out_lp_sampled, lp_sampled)
        ops.commit_samples(state, rows, next_tokens, logprobs, self.eos_id)


def default_mode_logprobs(
    scaled: torch.Tensor, dtype: torch.dtype, tokens: torch.Tensor
) -> torch.Tensor:
    """What a fast generator reports (`logprob_path` off): the log-softmax of the unfiltered
    logits / T [B, V] rounded to the model dtype, computed in it, at tokens [B]; fp32 [B]."""
    logp = torch.log_softmax(scaled.to(dtype), dim=-1)
    return logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1).float()


def kept_log_mass(scaled: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """log of the probability mass [B] the top-k / top-p filter keeps of softmax(scaled)
    (`scores`: scaled [B, V] with the cut at -inf), clamped to <= 0: subtracting it from a raw
    logprob gives the filtered, renormalised one, never below the raw one, and exactly the
    raw one where the filter keeps everything."""
    return (torch.logsumexp(scores, dim=-1) - torch.logsumexp(scaled, dim=-1)).clamp(max=0.0)


def decode_one_token(
    model: GenerationModel,
    cache: KVCache,
    state: SlotState,
    rows: torch.Tensor,
    sampler: Sampler,
) -> None:
    """One token for every slot row [B], all in one batch, all on the device."""
    tokens = state.token[rows].unsqueeze(1)  # [B, 1]
    positions = state.pos[rows].unsqueeze(1)  # [B, 1]
    tape = route_cache.recording(cache.routes)  # routing replay records each route
    logits = model(tokens, positions, cache, rows, routes=tape)[:, 0]  # [B, V]
    if tape is not None:
        route_cache.store(cache.routes, tape, rows, positions, ~state.done[rows])
    sampler.take(state, rows, logits)
