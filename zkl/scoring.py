"""The train path: score many (prompt, response) sequences in one padded forward pass."""

from __future__ import annotations

import torch

from zkl import ops


def pad_sequences(
    prompts: list[list[int]], responses: list[list[int]], pad_id: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded tokens [B, T] of prompt+response and a mask [B, T] of response targets.

    mask[b, t] marks that position t predicts a response token (target tokens[b, t + 1]).
    """
    lengths = [len(p) + len(r) for p, r in zip(prompts, responses)]
    tokens = torch.full((len(prompts), max(lengths)), pad_id, dtype=torch.long)
    mask = torch.zeros(len(prompts), max(lengths), dtype=torch.bool)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        tokens[i, : lengths[i]] = torch.tensor(p + r)
        mask[i, len(p) - 1 : lengths[i] - 1] = True
    return tokens, mask


def sequence_logprobs(
    model: torch.nn.Module, tokens: torch.Tensor, temperature: float | torch.Tensor = 1.0
) -> torch.Tensor:
    """fp32 logprob [B, T-1] of tokens[:, 1:] under the model (differentiable)."""
    positions = torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens)
    logits = model(tokens, positions)  # [B, T, V]
    if isinstance(temperature, torch.Tensor):
        temperature = temperature.reshape(-1, 1, 1)
    return ops.token_logprobs(logits[:, :-1], tokens[:, 1:], temperature)


@torch.no_grad()
def score(
    model: torch.nn.Module,
    prompts: list[list[int]],
    responses: list[list[int]],
    temperatures: list[float] | None = None,
    micro_batch_size: int = 0,
) -> list[torch.Tensor]:
    """Train-path logprobs of each response's tokens, fp32 on the CPU, one tensor per sequence.

    `micro_batch_size` > 0 splits the forward into groups of that many sequences.
    """
    size = micro_batch_size or len(prompts)
    device = next(model.parameters()).device
    out: list[torch.Tensor] = []
    for lo in range(0, len(prompts), size):
        p, r = prompts[lo : lo + size], responses[lo : lo + size]
        tokens, mask = pad_sequences(p, r)
        temps = torch.tensor(temperatures[lo : lo + size], device=device) if temperatures else 1.0
        logp = sequence_logprobs(model, tokens.to(device), temps).cpu()
        for i in range(len(p)):
            out.append(logp[i][mask[i, :-1]])
    return out
