"""Prefix cache: KV of full 16-token blocks of earlier prompts, keyed by the token prefix.

The usual hit is a shared system prompt. Every entry records the weight version that
computed it; with `kv_invalidate_on_refit` on, a lookup only hits the current version.
For a hybrid (Mamba) model an entry may also carry the Mamba state after its last token;
the scheduler only resumes from such entries, whose end is a Mamba chunk boundary.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

from zkl.invariance import is_enabled

BLOCK = 16


@dataclass
class Entry:
    version: int
    k: torch.Tensor  # [L, Hkv, BLOCK, D]
    v: torch.Tensor
    mamba: tuple[torch.Tensor, ...] | None = None  # (conv history, SSM state) at the block end


class PrefixCache:
    def __init__(self, capacity_blocks: int):
        self.capacity_blocks = capacity_blocks
        self.entries: OrderedDict[tuple[int, ...], Entry] = OrderedDict()
        self.hits = 0  # blocks served from the cache
        self.lookups = 0

    def clear(self) -> None:
        self.entries.clear()

    def _valid(self, entry: Entry | None, version: int) -> bool:
        if entry is None:
            return False
        return entry.version == version or not is_enabled("kv_invalidate_on_refit")

    def match(self, prompt: list[int], version: int) -> list[Entry]:
        """The cached blocks of the longest prefix, leaving at least one token to prefill."""
        found: list[Entry] = []
        max_blocks = (len(prompt) - 1) // BLOCK
        for i in range(max_blocks):
            self.lookups += 1
            entry = self.entries.get(tuple(prompt[: BLOCK * (i + 1)]))
            if not self._valid(entry, version):
                break
            self.entries.move_to_end(tuple(prompt[: BLOCK * (i + 1)]))
            found.append(entry)
        self.hits += len(found)
        return found

    def insert(self, prompt: list[int], version: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store the full blocks of `prompt` from its KV k, v [L, Hkv, >=len, D]."""
        for i in range(len(prompt) // BLOCK):
            key = tuple(prompt[: BLOCK * (i + 1)])
            if self._valid(self.entries.get(key), version):
                continue
            lo = BLOCK * i
            self.entries[key] = Entry(
                version, k[:, :, lo : lo + BLOCK].clone(), v[:, :, lo : lo + BLOCK].clone()
            )
            self.entries.move_to_end(key)
        while len(self.entries) > self.capacity_blocks:
            self.entries.popitem(last=False)

    def attach_state(self, prefix: list[int], version: int, state: tuple[torch.Tensor, ...]):
        """Record the Mamba state after `prefix` (a whole number of blocks) on its entry."""
        entry = self.entries.get(tuple(prefix))
        if entry is not None and entry.version == version and entry.mamba is None:
            entry.mamba = state
