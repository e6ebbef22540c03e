"""The generation engine: prefill, decode with a KV cache, continuous batching.

A request joins as soon as a slot frees and leaves at EOS or its token limit, so the batch
composition changes from one step to the next. The engine reports, for every sampled token,
the raw logprob of `logits / temperature` (the `logprob_path` fix) or, with that fix off,
what a fast engine reports: the logprob of the processed logits in the model dtype.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import torch

from zkl import ops
from zkl.generation.kv_cache import KVCache
from zkl.generation.prefix_cache import PrefixCache
from zkl.generation.sampling import SamplingParams, processed_logits, sample
from zkl.invariance import is_enabled
from zkl.precision import weight_cache


@dataclass
class Request:
    request_id: int
    prompt: list[int]
    params: SamplingParams


@dataclass
class Completion:
    request_id: int
    prompt: list[int]
    tokens: list[int]
    logprobs: torch.Tensor  # fp32 [len(tokens)]
    finish_reason: str  # "eos" | "length"
    weight_version: int


@dataclass
class _Running:
    request: Request
    generator: torch.Generator
    tokens: list[int] = field(default_factory=list)
    logprobs: list[torch.Tensor] = field(default_factory=list)
    finish_reason: str | None = None


@dataclass
class EngineStats:
    decode_steps: int = 0
    prefill_tokens: int = 0
    prefix_hit_tokens: int = 0
    generated_tokens: int = 0
    # The schedule's shape, so a test can see the batches are not lockstep waves.
    ragged_prefills: int = 0  # prefill batches whose rows have different lengths
    joined_running: int = 0  # requests admitted while others were mid-decode


class GenerationEngine:
    def __init__(
        self,
        model: torch.nn.Module,
        *,
        max_batch_size: int,
        eos_id: int,
        kv_mode: str = "recompute",
        prefill_chunk: int = 0,
        prefix_cache_blocks: int = 4096,
    ):
        self.model = model
        self.max_batch_size = max_batch_size
        self.eos_id = eos_id
        self.kv_mode = kv_mode
        self.prefill_chunk = prefill_chunk
        self.prefix_cache = PrefixCache(prefix_cache_blocks) if kv_mode == "persist" else None
        self.weight_version = 0
        self.quant_cache: dict[int, torch.Tensor] = {}  # quantized weights, filled lazily
        self.stats = EngineStats()

    # -- refit --------------------------------------------------------------------------
    def on_refit(self, version: int) -> None:
        """New weights are in place: drop what the kv mode and the fixes say is stale."""
        self.weight_version = version
        if self.kv_mode == "recompute" and self.prefix_cache is not None:
            self.prefix_cache.clear()
        if is_enabled("quantized_weight_refresh"):
            self.quant_cache.clear()

    # -- the loop ---------------------------------------------------------------------
    def configure(self, max_batch_size: int | None = None, prefill_chunk: int | None = None):
        """Change the scheduling knobs (certification varies them; results must not change)."""
        if max_batch_size is not None:
            self.max_batch_size = max_batch_size
        if prefill_chunk is not None:
            self.prefill_chunk = prefill_chunk

    @torch.no_grad()
    def generate(self, requests: list[Request]) -> list[Completion]:
        """Run every request to EOS or its limit; completions come back in request order."""
        self.stats = EngineStats()
        cfg = self.model.cfg
        max_len = max(len(r.prompt) + r.params.max_new_tokens for r in requests)
        dtype = self.model.embed_tokens.weight.dtype
        cache = KVCache(
            cfg.num_hidden_layers,
            self.max_batch_size,
            cfg.num_key_value_heads,
            max_len,
            cfg.head_dim,
            dtype,
        )
        waiting = deque(requests)
        free = list(range(self.max_batch_size - 1, -1, -1))
        running: dict[int, _Running] = {}
        done: dict[int, Completion] = {}
        with weight_cache(self.quant_cache):
            while waiting or running:
                admitted: list[tuple[int, _Running]] = []
                while waiting and free:
                    request = waiting.popleft()
                    gen = torch.Generator().manual_seed(request.params.seed)
                    admitted.append((free.pop(), _Running(request, gen)))
                if admitted:
                    self.stats.joined_running += len(admitted) if running else 0
                    self._prefill(cache, admitted)
                    running.update(admitted)
                    self._retire(running, free, done)
                if running:
                    self._decode(cache, running)
                    self._retire(running, free, done)
        return [done[r.request_id] for r in requests]

    def _retire(self, running: dict[int, _Running], free: list[int], done: dict) -> None:
        for slot in [s for s, r in running.items() if r.finish_reason]:
            r = running.pop(slot)
            free.append(slot)
            done[r.request.request_id] = Completion(
                r.request.request_id,
                r.request.prompt,
                r.tokens,
                torch.stack(r.logprobs),
                r.finish_reason,
                self.weight_version,
            )

    def _prefill(self, cache: KVCache, admitted: list[tuple[int, _Running]]) -> None:
        """Prompt KV of the admitted requests (prefix-cache hits copied in), first token each."""
        starts = []
        for slot, r in admitted:
            start = 0
            if self.prefix_cache is not None:
                blocks = self.prefix_cache.match(r.request.prompt, self.weight_version)
                if blocks:
                    k = torch.cat([b.k for b in blocks], dim=2)  # [L, Hkv, n, D]
                    v = torch.cat([b.v for b in blocks], dim=2)
                    for layer in range(k.shape[0]):
                        cache.write(layer, slot, k[layer], v[layer])
                    start = k.shape[2]
            starts.append(start)
            self.stats.prefix_hit_tokens += start
        lengths = [len(r.request.prompt) - s for (_, r), s in zip(admitted, starts)]
        width = max(lengths)
        chunk = self.prefill_chunk or width
        tokens = torch.zeros(len(admitted), width, dtype=torch.long)
        for i, ((_, r), s) in enumerate(zip(admitted, starts)):
            tokens[i, : lengths[i]] = torch.tensor(r.request.prompt[s:])
        slots = torch.tensor([slot for slot, _ in admitted])
        last = torch.tensor(lengths) - 1  # index of each row's last prompt token
        final_logits = [None] * len(admitted)
        for lo in range(0, width, chunk):
            hi = min(lo + chunk, width)
            positions = torch.tensor(starts).unsqueeze(1) + torch.arange(lo, hi)
            logits = self.model(
                tokens[:, lo:hi],
                positions,
                cache,
                slots,
                logit_index=(last - lo).clamp(0, hi - lo - 1),
            )
            for i in range(len(admitted)):
                if lo <= last[i] < hi:
                    final_logits[i] = logits[i]
        self.stats.prefill_tokens += sum(lengths)
        self.stats.ragged_prefills += int(len(set(lengths)) > 1)
        self._sample([r for _, r in admitted], torch.stack(final_logits))
        if self.prefix_cache is not None:
            for slot, r in admitted:
                n = len(r.request.prompt)
                self.prefix_cache.insert(
                    r.request.prompt,
                    self.weight_version,
                    cache.k[:, slot, :, :n],
                    cache.v[:, slot, :, :n],
                )

    def _decode(self, cache: KVCache, running: dict[int, _Running]) -> None:
        """One token for every running request, all in one batch."""
        slots = list(running)
        rows = [running[s] for s in slots]
        tokens = torch.tensor([[r.tokens[-1]] for r in rows])
        positions = torch.tensor([[len(r.request.prompt) + len(r.tokens) - 1] for r in rows])
        logits = self.model(tokens, positions, cache, torch.tensor(slots))[:, 0]
        self.stats.decode_steps += 1
        self._sample(rows, logits)

    def _sample(self, rows: list[_Running], logits: torch.Tensor) -> None:
        """logits [B, V] -> next token and its logprob for every row."""
        next_tokens = [sample(lg, r.request.params, r.generator) for r, lg in zip(rows, logits)]
        token_ids = torch.tensor(next_tokens)
        if is_enabled("logprob_path"):
            temps = torch.tensor([[r.request.params.temperature] for r in rows])
            logprobs = ops.token_logprobs(logits, token_ids, temps)
        else:  # what a fast engine reports: processed logits, log-softmax in the model dtype
            processed = torch.stack(
                [processed_logits(lg, r.request.params) for r, lg in zip(rows, logits)]
            )
            logp = torch.log_softmax(processed.to(logits.dtype), dim=-1)
            logprobs = logp.gather(-1, token_ids.unsqueeze(-1)).squeeze(-1).float()
        self.stats.generated_tokens += len(rows)
        for r, token, lp in zip(rows, next_tokens, logprobs):
            r.tokens.append(token)
            r.logprobs.append(lp)
            if token == self.eos_id:
                r.finish_reason = "eos"
            elif len(r.tokens) >= r.request.params.max_new_tokens:
                r.finish_reason = "length"
