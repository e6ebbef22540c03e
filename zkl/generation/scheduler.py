"""The generation scheduler: continuous batching over prefill and a decode step.

A request joins as soon as a slot frees and leaves at EOS or its token limit, so the batch
composition changes from one step to the next. The math lives elsewhere: `prefill.prefill`
fills the new rows' cache and samples their first token, `decode.decode_one_token` is one
token for every running row. This module decides which request holds which slot,
the buffers, and the host's look at finished rows, which happens only every `sync_every`
decode steps (a finished row idles until then, recomputing its last token, which changes no
other row). Any model implementing `decode.GenerationModel` (native, hybrid, megatron) runs.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from functools import partial

import torch

from zkl.generation.config import KVConfig, SchedulerConfig
from zkl.generation.decode import GenerationModel, Sampler, decode_one_token
from zkl.generation.graphs import BucketedDecode, graphs_on
from zkl.generation.kv_cache import KVCache
from zkl.generation.prefill import Admitted, prefill
from zkl.generation.prefix_cache import PrefixCache
from zkl.generation.sampling import SamplingParams
from zkl.generation.slots import SlotState
from zkl.invariance import active, is_enabled
from zkl.precision.recipes import quantizes, weight_cache
from zkl.routes import route_dtype

CAPACITY_STEP = 256  # graphs keep their cache: lengths round up to this, so few recaptures


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
    logprobs: torch.Tensor  # fp32 [len(tokens)], on the CPU
    finish_reason: str  # "eos" | "length"
    weight_version: int
    # fp32 [len(tokens)]: the logprob under the filtered (top-k / top-p) distribution sampled
    # from; bitwise `logprobs` when no filter is on (the behaviour policy of the corrections)
    lp_sampled: torch.Tensor | None = None
    # [len(prompt) + len(tokens), MoE layers, k] int8/int16 expert ids the gen path chose at
    # each position, -1 where none was computed (`rl.record_routes`, routing replay)
    routes: torch.Tensor | None = None


@dataclass
class SchedulerStats:
    decode_steps: int = 0
    prefill_tokens: int = 0
    prefix_hit_tokens: int = 0
    generated_tokens: int = 0
    decode_s: float = 0.0  # wall time of decode steps, up to the host's look at finished rows
    # The schedule's shape, so a test can see the batches are not lockstep waves.
    ragged_prefills: int = 0  # prefill batches whose rows have different lengths
    joined_running: int = 0  # requests admitted while others were mid-decode


class Scheduler:
    """Continuous batching of `max_batch_size` slots over one model.

    Kept across calls: the weight version, the prefix cache (persist mode), quantized weight
    copies, and with CUDA graphs the static buffers the graphs read. `stats` are the last
    `generate` call's counters.
    """

    def __init__(
        self,
        model: GenerationModel,
        *,
        max_batch_size: int,
        eos_id: int | None,
        kv_mode: str = KVConfig.mode,
        prefill_chunk: int = SchedulerConfig.prefill_chunk,
        prefix_cache_blocks: int = SchedulerConfig.prefix_cache_blocks,
        sync_every: int = SchedulerConfig.sync_every,
        cuda_graphs: str = SchedulerConfig.cuda_graphs,
        record_routes: bool = False,
    ):
        """The knobs are `scheduler.*` and `kv.mode`, with the config's defaults (one answer)."""
        self.model = model
        self.max_batch_size = max_batch_size
        self.eos_id = eos_id if eos_id is not None and eos_id >= 0 else None
        self.prefill_chunk = prefill_chunk
        self.sync_every = sync_every or (8 if self.device.type == "cuda" else 1)  # 0: auto
        self.record_routes = record_routes  # each position's experts (MoE, routing replay)
        self.prefix_cache = PrefixCache(prefix_cache_blocks) if kv_mode == "persist" else None
        self.weight_version = 0
        self.quant_cache: dict[int, torch.Tensor] = {}  # quantized weights, filled lazily
        self.stats = SchedulerStats()
        self.decoder = self._graph_decoder(cuda_graphs)
        self._static: tuple[KVCache, SlotState] | None = None  # what the graphs read

    def _graph_decoder(self, setting: str) -> BucketedDecode | None:
        """`scheduler.cuda_graphs`: auto = on where the model's decode can be captured."""
        model = self.model
        if not graphs_on(setting, model.cfg, self.device, quantizes(model), model.engine):
            return None
        return BucketedDecode(self.max_batch_size, capture=True)

    @property
    def device(self) -> torch.device:
        return self.model.embed_tokens.weight.device

    # -- refit --------------------------------------------------------------------------
    def on_refit(self, version: int) -> None:
        """New weights are in place: the prefix cache's entries are tagged with `version`
        (`kv_invalidate_on_refit` skips older ones), and `quantized_weight_refresh` drops the
        quantized copies of the old weights."""
        self.weight_version = version
        if is_enabled("quantized_weight_refresh"):
            if self.quant_cache and self.decoder is not None:
                self.decoder.drop()  # the graphs read the quantized copies about to go
            self.quant_cache.clear()

    # -- the loop ---------------------------------------------------------------------
    def configure(self, max_batch_size: int | None = None, prefill_chunk: int | None = None):
        """Change the scheduling knobs (certification varies them; results must not change)."""
        if max_batch_size is not None and max_batch_size != self.max_batch_size:
            self.max_batch_size = max_batch_size
            self._static = None
            if self.decoder is not None:
                self.decoder = BucketedDecode(max_batch_size, capture=self.decoder.capture)
        if prefill_chunk is not None:
            self.prefill_chunk = prefill_chunk

    @torch.no_grad()
    def generate(self, requests: list[Request]) -> list[Completion]:
        """Run every request to EOS or its limit; completions come back in request order."""
        stats = self.stats = SchedulerStats()
        max_new = max(r.params.max_new_tokens for r in requests)
        max_len = max(len(r.prompt) for r in requests) + max_new
        self.model.check_positions(max_len, "a prompt plus sampling.max_new_tokens needs")
        sampler = Sampler(
            top_k=any(r.params.top_k > 0 for r in requests),
            top_p=any(r.params.top_p < 1 for r in requests),
            eos_id=self.eos_id,
        )
        if self.decoder is None:
            cache, state = self.new_buffers(max_len, max_new)
        else:
            cache, state = self._static_buffers(max_len, max_new)
        waiting = deque(requests)
        free = list(range(self.max_batch_size - 1, -1, -1))
        running: dict[int, Request] = {}
        done: dict[int, Completion] = {}
        with weight_cache(self.quant_cache):
            if self.decoder is not None:  # every slot is free here, as a capture needs
                step = partial(decode_one_token, self.model, cache, state, sampler=sampler)
                self.decoder.prepare(step, self._graph_key(sampler), self.device)
            while waiting or running:
                admitted: list[tuple[int, Request]] = []
                while waiting and free:
                    admitted.append((free.pop(), waiting.popleft()))
                if admitted:
                    stats.joined_running += len(admitted) if running else 0
                    self._prefill(cache, state, admitted, sampler, stats)
                    running.update(admitted)
                    self._retire(cache, state, sampler, running, free, done, stats)
                if running:
                    t0 = time.perf_counter()
                    self._decode(cache, state, running, free, sampler, stats)
                    # reads the device: a sync
                    self._retire(cache, state, sampler, running, free, done, stats)
                    stats.decode_s += time.perf_counter() - t0
        return [done[r.request_id] for r in requests]

    def _prefill(self, cache, state, admitted, sampler: Sampler, stats: SchedulerStats) -> None:
        rows = [Admitted(slot, r.prompt, r.params) for slot, r in admitted]
        counts = prefill(
            self.model,
            cache,
            state,
            rows,
            sampler,
            self.prefix_cache,
            self.weight_version,
            self.prefill_chunk,
        )
        stats.prefill_tokens += counts.tokens
        stats.prefix_hit_tokens += counts.prefix_hit_tokens
        stats.ragged_prefills += counts.ragged

    def _decode(self, cache, state, running: dict, free: list[int], sampler, stats) -> None:
        """`sync_every` decode steps of the running slots, eager or replayed from a graph."""
        if self.decoder is None:
            rows = torch.tensor(list(running), device=self.device)
            for _ in range(self.sync_every):
                decode_one_token(self.model, cache, state, rows, sampler)
                stats.decode_steps += 1
        else:
            size = self.decoder.load(list(running), free)
            for _ in range(self.sync_every):
                self.decoder.run(size)
                stats.decode_steps += 1

    def new_buffers(self, max_len: int, max_new: int) -> tuple[KVCache, SlotState]:
        """The model's decode cache and the slot state, sized for one generate call."""
        cache = self.model.make_cache(self.max_batch_size, max_len)
        if self.record_routes:  # [slots, positions, MoE layers, k]
            cfg = self.model.cfg
            layers = sum(cfg.layer_is_moe(i) for i in range(cfg.num_hidden_layers))
            shape = (self.max_batch_size, max_len, layers, cfg.moe.num_experts_per_tok)
            dtype = route_dtype(cfg.moe.num_experts)
            cache.routes = torch.full(shape, -1, dtype=dtype, device=self.device)
        return cache, SlotState(self.max_batch_size, max_new, self.device)

    def _static_buffers(self, max_len: int, max_new: int) -> tuple[KVCache, SlotState]:
        """The buffers the graphs read: kept while they are big enough, else grown (recapture).

        Every slot is marked done (free) for the new call; the rest is rewritten on admission.
        """
        if self._static is not None:
            cache, state = self._static
            if cache.max_len >= max_len and state.out_tokens.shape[1] >= max_new:
                state.done.fill_(True)
                return cache, state
        self._static = None  # free the old buffers before allocating bigger ones
        self.decoder.drop()  # its graphs read the old buffers
        step = CAPACITY_STEP
        self._static = self.new_buffers(-(-max_len // step) * step, -(-max_new // step) * step)
        return self._static

    def _graph_key(self, sampler: Sampler) -> tuple:
        """What a captured graph bakes in besides the buffers: if it changed, recapture.

        A refit copies weights in place, so the parameter addresses stay; new buffers or
        quantized weights drop the graphs where they are replaced (`_static_buffers`,
        `on_refit`).
        """
        params = tuple(p.data_ptr() for p in self.model.parameters())
        return (self.max_batch_size, sampler, active(), params)

    def _retire(
        self,
        cache: KVCache,
        state: SlotState,
        sampler: Sampler,
        running: dict,
        free: list[int],
        done: dict,
        stats,
    ):
        """The host's look at the device state: move finished requests out of their slots."""
        slots = list(running)
        finished = [s for s, d in zip(slots, state.done[slots].tolist()) if d]
        if not finished:
            return
        counts = state.count[finished].tolist()
        tokens = state.out_tokens[finished].tolist()
        logprobs = state.out_logprobs[finished].cpu()
        lp_sampled = state.out_lp_sampled[finished].cpu() if sampler.filters else logprobs
        taken = None if cache.routes is None else cache.routes[finished].cpu()
        for i, slot in enumerate(finished):
            request = running.pop(slot)
            free.append(slot)
            out = tokens[i][: counts[i]]
            reason = "eos" if self.eos_id is not None and out[-1] == self.eos_id else "length"
            done[request.request_id] = Completion(
                request.request_id,
                request.prompt,
                out,
                logprobs[i, : counts[i]].clone(),
                reason,
                self.weight_version,
                lp_sampled[i, : counts[i]].clone(),
                None if taken is None else _routes_of(taken[i], len(request.prompt), counts[i]),
            )
            stats.generated_tokens += counts[i]


def _routes_of(taken: torch.Tensor, prompt_len: int, count: int) -> torch.Tensor:
    """A slot's routes [positions, L, k] for its prompt and response: the last token was never
    an input, so it has none (-1)."""
    out = taken[: prompt_len + count].clone()
    out[-1] = -1
    return out
