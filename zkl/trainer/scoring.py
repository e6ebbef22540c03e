"""The train path: score many (prompt, response) sequences in one padded forward pass."""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

from zkl import ops
from zkl.memory import LOGIT_TOKENS
from zkl.models.causal_lm import CausalLM
from zkl.routes import RouteTape
from zkl.trainer.batch import pad_sequences, replay_tape


def _chunk_logprobs(lm_head, hidden, targets, temperature) -> torch.Tensor:
    return ops.token_logprobs(lm_head(hidden), targets, temperature)


def sequence_logprobs(
    model: CausalLM,
    tokens: torch.Tensor,
    temperature: float | torch.Tensor = 1.0,
    routes: RouteTape | None = None,
) -> torch.Tensor:
    """fp32 logprob [B, T-1] of tokens[:, 1:] under the model (differentiable); `routes`
    the tape its MoE layers replay the generator's routes from (`replay_tape`).

    The logits are made about LOGIT_TOKENS tokens at a time and, with gradients, remade in
    the backward (activation checkpointing), so a long micro-batch never holds [B, T, V]:
    at a 151,936-token vocabulary that is 2.4 GB of bf16 logits per 8k tokens. A token's
    logprob is the same either way in zero mode (the lm_head GEMM and the log-softmax are
    invariant in the row count).
    """
    positions = torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens)
    if isinstance(temperature, torch.Tensor):
        temperature = temperature.reshape(-1, 1, 1)
    targets = tokens[:, 1:]
    if not model.chunked_head:  # megatron's GPTModel: its own logits
        logits = model(tokens, positions, routes=routes)[:, :-1]
        return ops.token_logprobs(logits, targets, temperature)
    hidden = model.hidden_states(tokens, positions, routes=routes)[:, :-1]  # [B, T-1, hidden]
    width = max(1, LOGIT_TOKENS // tokens.shape[0])
    grad = torch.is_grad_enabled() and hidden.requires_grad
    parts = []
    for lo in range(0, hidden.shape[1], width):
        args = (model.lm_head, hidden[:, lo : lo + width], targets[:, lo : lo + width])
        if grad:
            parts.append(checkpoint(_chunk_logprobs, *args, temperature, use_reentrant=False))
        else:
            parts.append(_chunk_logprobs(*args, temperature))
    return torch.cat(parts, dim=1)


@torch.no_grad()
def score(
    model: CausalLM,
    prompts: list[list[int]],
    responses: list[list[int]],
    temperatures: list[float] | None = None,
    micro_batch_size: int = 0,
    device: torch.device | None = None,
    routes: list[torch.Tensor] | None = None,
    replay: bool = True,
    route_counts: torch.Tensor | None = None,
) -> list[torch.Tensor]:
    """Train-path logprobs of each response's tokens, fp32 on the CPU, one tensor per sequence.

    `micro_batch_size` > 0 splits the forward into groups of that many sequences. `device`
    is where the forward computes (default: the parameters'; FSDP's host offload keeps the
    parameters on the CPU and computes on the GPU). `routes`: each sequence's generator
    routes [len, L, k] (`zkl.routes`), which the MoE layers replay, or with
    `replay=False` only compare their own choices with; `route_counts` (float64 [4]) adds
    up how many differed (`RouteTape.counts`), so no forward of its own is needed for that.
    """
    size = micro_batch_size or len(prompts)
    device = device or next(model.parameters()).device
    out: list[torch.Tensor] = []
    for lo in range(0, len(prompts), size):
        p, r = prompts[lo : lo + size], responses[lo : lo + size]
        tokens, mask = pad_sequences(p, r)
        temps = torch.tensor(temperatures[lo : lo + size], device=device) if temperatures else 1.0
        tape = replay_tape(routes, lo, lo + size, tokens.shape[1], use=replay)
        logp = sequence_logprobs(model, tokens.to(device), temps, tape).cpu()
        if tape is not None and route_counts is not None:
            route_counts += tape.counts()
        for i in range(len(p)):
            out.append(logp[i][mask[i, :-1]])
    return out
