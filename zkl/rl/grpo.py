"""GRPO advantages: each sample's reward against its group's (the loss: zkl/rl/loss.py)."""

from __future__ import annotations

import torch


def group_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-6) -> torch.Tensor:
    """rewards [N] in consecutive groups of `group_size` -> (r - group mean) / (group std + eps)."""
    grouped = rewards.view(-1, group_size)
    mean = grouped.mean(-1, keepdim=True)
    std = grouped.std(-1, keepdim=True) if group_size > 1 else torch.zeros_like(mean)
    return ((grouped - mean) / (std + eps)).view(-1)
