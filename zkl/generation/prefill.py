"""Prefill: the prompt's K/V (and Mamba state) of newly admitted requests, then each one's
first token. A prefix-cache hit is copied into the row's cache and only the rest of the
prompt runs through the model.

A cache whose rows may be padded (`KVCache.pads_rows`) prefills every admitted request in
one right-padded batch; a cache with per-row recurrent state (Mamba) one request at a time,
because such a state must never see padding. There a prefix hit resumes only at an entry
that carries the state, and in persist mode the prefill stops at `state_boundary` to keep
the state there for the prefix cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from zkl.generation import route_cache
from zkl.generation.decode import GenerationModel, Sampler
from zkl.generation.kv_cache import KVCache
from zkl.generation.prefix_cache import PrefixCache
from zkl.generation.sampling import SamplingParams
from zkl.generation.slots import SlotState


@dataclass
class Admitted:
    """A request entering its slot."""

    slot: int
    prompt: list[int]
    params: SamplingParams


@dataclass
class PrefillCounts:
    tokens: int = 0  # prompt tokens run through the model
    prefix_hit_tokens: int = 0  # prompt tokens copied from the prefix cache
    ragged: int = 0  # batches whose rows have different lengths


def prefill(
    model: GenerationModel,
    cache: KVCache,
    state: SlotState,
    admitted: list[Admitted],
    sampler: Sampler,
    prefix: PrefixCache | None,
    version: int,
    chunk: int,
) -> PrefillCounts:
    """Fill the cache rows of `admitted` and sample each one's first token into `state`.

    `prefix`: the prefix cache (persist mode), read and filled at weight `version`;
    `chunk` > 0: the model sees at most that many tokens of a row at a time.
    """
    counts = PrefillCounts()
    groups = [admitted] if cache.pads_rows else [[a] for a in admitted]
    logits = [_prefill_group(model, cache, g, prefix, version, chunk, counts) for g in groups]
    slots = torch.tensor([a.slot for a in admitted], device=cache.k.device)
    state.admit(slots, [a.params for a in admitted], [len(a.prompt) - 1 for a in admitted])
    sampler.take(state, slots, logits[0] if len(logits) == 1 else torch.cat(logits))
    return counts


def _prefill_group(
    model: GenerationModel,
    cache: KVCache,
    group: list[Admitted],
    prefix: PrefixCache | None,
    version: int,
    chunk: int,
    counts: PrefillCounts,
) -> torch.Tensor:
    """Prefill one batch of rows; the logits [B, V] at each row's last prompt token."""
    device = cache.k.device
    starts, cuts = [], []
    for a in group:
        cache.clear_slot(a.slot)
        start, cut = 0, 0
        if prefix is not None:
            blocks = cache.resumable(prefix.match(a.prompt, version))
            start = cache.load_prefix(a.slot, blocks) if blocks else 0
            cut = cache.state_boundary(len(a.prompt))
        starts.append(start)
        cuts.append(cut - start if cut > start else 0)  # where to snapshot, row-relative
        counts.prefix_hit_tokens += start
    lengths = [len(a.prompt) - s for a, s in zip(group, starts)]
    width = max(lengths)
    tokens = torch.zeros(len(group), width, dtype=torch.long)  # [B, width], right-padded
    for i, (a, s) in enumerate(zip(group, starts)):
        tokens[i, : lengths[i]] = torch.tensor(a.prompt[s:])
    tokens = tokens.to(device)
    slots = torch.tensor([a.slot for a in group], device=device)
    last = [n - 1 for n in lengths]  # index of each row's last prompt token
    edges = sorted(set(range(0, width, chunk or width)) | {width} | set(cuts) - {0})
    # A row that resumed from the prefix cache is padded up to the longest remainder, which
    # can run past the cache's end; its pads stay at its last slot. No query reads a pad's
    # key: a position's key is written before any query at that position runs.
    end = cache.max_len - 1
    final_logits, snapshots = None, {}
    for lo, hi in zip(edges, edges[1:]):
        positions = (torch.tensor(starts).unsqueeze(1) + torch.arange(lo, hi)).clamp(max=end)
        positions = positions.to(device)
        index = torch.tensor([min(max(n - lo, 0), hi - lo - 1) for n in last], device=device)
        tape = route_cache.recording(cache.routes)
        logits = model(tokens[:, lo:hi], positions, cache, slots, index, tape)  # [B, V]
        route_cache.store(cache.routes, tape, slots, positions)
        if final_logits is None:
            final_logits = torch.empty_like(logits)
        ending = [i for i, n in enumerate(last) if lo <= n < hi]
        if ending:
            ending_t = torch.tensor(ending, device=device)
            final_logits[ending_t] = logits[ending_t]
        for i, a in enumerate(group):
            if cuts[i] == hi:
                snapshots[i] = cache.row_state(a.slot)
    counts.tokens += sum(lengths)
    counts.ragged += int(len(set(lengths)) > 1)
    if prefix is not None:
        for i, a in enumerate(group):
            n = len(a.prompt)
            prefix.insert(a.prompt, version, cache.k[:, a.slot, :, :n], cache.v[:, a.slot, :, :n])
            if i in snapshots:
                prefix.attach_state(a.prompt[: starts[i] + cuts[i]], version, snapshots[i])
    return final_logits
