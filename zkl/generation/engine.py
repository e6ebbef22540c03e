"""The generation engine: prefill, decode with a KV cache, continuous batching.

A request joins as soon as a slot frees and leaves at EOS or its token limit, so the batch
composition changes from one step to the next. Decode state (next token, position, counts,
outputs, sampling parameters) lives on the model's device, one row per slot, and a decode
step runs without Python per row and without reading anything back: the host looks at which
rows finished only every `sync_every` steps (a finished row idles until then, recomputing
its last token, which changes no other row). The engine reports, for every sampled token,
the raw logprob of `logits / temperature` (the `logprob_path` fix) or, with that fix off,
what a fast engine reports: the logprob of the processed logits in the model dtype.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass

import torch

from zkl import ops
from zkl.generation.graphs import BucketedDecode, graphs_on
from zkl.generation.kv_cache import KVCache
from zkl.generation.mamba_cache import HybridCache
from zkl.generation.prefix_cache import BLOCK, PrefixCache
from zkl.generation.sampling import SamplingParams, gumbel_max, processed_logits
from zkl.invariance import FIXES, is_enabled
from zkl.precision import quantizes, weight_cache

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


@dataclass
class EngineStats:
    decode_steps: int = 0
    prefill_tokens: int = 0
    prefix_hit_tokens: int = 0
    generated_tokens: int = 0
    decode_s: float = 0.0  # wall time of decode steps, up to the host's look at finished rows
    # The schedule's shape, so a test can see the batches are not lockstep waves.
    ragged_prefills: int = 0  # prefill batches whose rows have different lengths
    joined_running: int = 0  # requests admitted while others were mid-decode


class SlotState:
    """Per-slot decode state on the device: row s belongs to whichever request holds slot s."""

    def __init__(self, num_slots: int, max_new: int, device: torch.device):
        def zeros(*shape, dtype=torch.int64):
            return torch.zeros(shape, dtype=dtype, device=device)

        self.token = zeros(num_slots)  # the next input token (the last sampled one)
        self.pos = zeros(num_slots)  # its position
        self.count = zeros(num_slots)  # tokens generated so far
        self.done = torch.ones(num_slots, dtype=torch.bool, device=device)
        self.seed = zeros(num_slots)
        self.max_new = zeros(num_slots)
        self.top_k = zeros(num_slots)
        self.temperature = zeros(num_slots, dtype=torch.float32)
        self.top_p = zeros(num_slots, dtype=torch.float32)
        self.out_tokens = zeros(num_slots, max_new)
        self.out_logprobs = zeros(num_slots, max_new, dtype=torch.float32)

    def admit(self, slots: torch.Tensor, requests: list[Request], last_pos: list[int]) -> None:
        """Reset the rows of `slots` for new requests whose last prompt token is at `last_pos`."""
        device = slots.device

        def put(field: torch.Tensor, values: list) -> None:
            field[slots] = torch.tensor(values, dtype=field.dtype).to(device, non_blocking=True)

        params = [r.params for r in requests]
        put(self.pos, last_pos)
        put(self.count, [0] * len(requests))
        put(self.done, [False] * len(requests))
        put(self.seed, [p.seed for p in params])
        put(self.max_new, [p.max_new_tokens for p in params])
        put(self.top_k, [p.top_k for p in params])
        put(self.temperature, [p.temperature for p in params])
        put(self.top_p, [p.top_p for p in params])


class GenerationEngine:
    def __init__(
        self,
        model: torch.nn.Module,
        *,
        max_batch_size: int,
        eos_id: int | None,
        kv_mode: str = "recompute",
        prefill_chunk: int = 0,
        prefix_cache_blocks: int = 4096,
        sync_every: int = 1,
        cuda_graphs: str = "off",
    ):
        self.model = model
        self.max_batch_size = max_batch_size
        self.eos_id = eos_id if eos_id is not None and eos_id >= 0 else None
        self.kv_mode = kv_mode
        self.prefill_chunk = prefill_chunk
        self.sync_every = sync_every
        self.prefix_cache = PrefixCache(prefix_cache_blocks) if kv_mode == "persist" else None
        self.weight_version = 0
        self.quant_cache: dict[int, torch.Tensor] = {}  # quantized weights, filled lazily
        self.stats = EngineStats()
        self.decoder = self._graph_decoder(cuda_graphs)
        self._static: tuple | None = None  # (cache, state) the graphs read, kept across calls

    def _graph_decoder(self, setting: str) -> BucketedDecode | None:
        """`engine.cuda_graphs`: auto = on where the model's decode can be captured."""
        if not graphs_on(setting, self.model.cfg, self.device, quantizes(self.model)):
            return None
        return BucketedDecode(self._decode_step, self.max_batch_size, capture=True)

    @property
    def hybrid(self) -> bool:
        """The model has Mamba layers, whose state lives beside the KV cache."""
        return getattr(self.model, "num_mamba_layers", 0) > 0

    @property
    def device(self) -> torch.device:
        return self.model.embed_tokens.weight.device

    # -- refit --------------------------------------------------------------------------
    def on_refit(self, version: int) -> None:
        """New weights are in place: drop what the kv mode and the fixes say is stale."""
        self.weight_version = version
        if self.kv_mode == "recompute" and self.prefix_cache is not None:
            self.prefix_cache.clear()
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
                self.decoder = BucketedDecode(
                    self._decode_step, max_batch_size, capture=self.decoder.capture
                )
        if prefill_chunk is not None:
            self.prefill_chunk = prefill_chunk

    @torch.no_grad()
    def generate(self, requests: list[Request]) -> list[Completion]:
        """Run every request to EOS or its limit; completions come back in request order."""
        self.stats = EngineStats()
        device = self.device
        max_new = max(r.params.max_new_tokens for r in requests)
        max_len = max(len(r.prompt) for r in requests) + max_new
        rope = getattr(self.model, "rope", None)  # the fused RoPE reads its tables unchecked
        if rope is not None and max_len > rope.cos.shape[0]:
            raise ValueError(
                f"a request needs {max_len} positions (prompt + max_new_tokens) but "
                f"model.max_position_embeddings={rope.cos.shape[0]}; raise it or shorten "
                "the prompts or sampling.max_new_tokens."
            )
        if self.decoder is None:
            cache, state = self._new_buffers(max_len, max_new)
        else:
            cache, state = self._static_buffers(max_len, max_new)
        self._filters = (
            any(r.params.top_k > 0 for r in requests),
            any(r.params.top_p < 1 for r in requests),
        )
        waiting = deque(requests)
        free = list(range(self.max_batch_size - 1, -1, -1))
        running: dict[int, Request] = {}
        done: dict[int, Completion] = {}
        with weight_cache(self.quant_cache):
            if self.decoder is not None:  # every slot is free here, as a capture needs
                self._cache, self._state = cache, state
                self.decoder.prepare(self._graph_key(), device)
            while waiting or running:
                admitted: list[tuple[int, Request]] = []
                while waiting and free:
                    admitted.append((free.pop(), waiting.popleft()))
                if admitted:
                    self.stats.joined_running += len(admitted) if running else 0
                    self._prefill(cache, state, admitted)
                    running.update(admitted)
                    self._retire(state, running, free, done)
                if running:
                    t0 = time.perf_counter()
                    if self.decoder is None:
                        rows = torch.tensor(list(running), device=device)
                        for _ in range(self.sync_every):
                            self._decode(cache, state, rows)
                    else:
                        size = self.decoder.load(list(running), free)
                        for _ in range(self.sync_every):
                            self.decoder.run(size)
                            self.stats.decode_steps += 1
                    self._retire(state, running, free, done)  # reads the device: a sync
                    self.stats.decode_s += time.perf_counter() - t0
        return [done[r.request_id] for r in requests]

    def _new_buffers(self, max_len: int, max_new: int) -> tuple[KVCache, SlotState]:
        """A KV cache (and Mamba state) and slot state sized for one generate call."""
        cfg, device = self.model.cfg, self.device
        dtype = self.model.embed_tokens.weight.dtype
        if self.hybrid:
            cache = HybridCache(self.model, self.max_batch_size, max_len, dtype, device)
        else:
            cache = KVCache(
                cfg.num_hidden_layers,
                self.max_batch_size,
                cfg.num_key_value_heads,
                max_len,
                cfg.head_dim,
                dtype,
                device,
            )
        return cache, SlotState(self.max_batch_size, max_new, device)

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
        self._static = self._new_buffers(-(-max_len // step) * step, -(-max_new // step) * step)
        return self._static

    def _graph_key(self) -> tuple:
        """What a captured graph bakes in besides the buffers: if it changed, recapture.

        A refit copies weights in place, so the parameter addresses stay; new buffers or
        quantized weights drop the graphs where they are replaced (`_static_buffers`,
        `on_refit`).
        """
        params = tuple(p.data_ptr() for p in self.model.parameters())
        fixes = tuple(name for name in FIXES if is_enabled(name))
        return (self.max_batch_size, self._filters, fixes, params)

    def _retire(self, state: SlotState, running: dict, free: list[int], done: dict) -> None:
        """The host's look at the device state: move finished requests out of their slots."""
        slots = list(running)
        finished = [s for s, d in zip(slots, state.done[slots].tolist()) if d]
        if not finished:
            return
        counts = state.count[finished].tolist()
        tokens = state.out_tokens[finished].tolist()
        logprobs = state.out_logprobs[finished].cpu()
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
            )
            self.stats.generated_tokens += counts[i]

    def _prefill(self, cache: KVCache, state: SlotState, admitted: list[tuple[int, Request]]):
        """Prompt KV of the admitted requests (prefix-cache hits copied in), first token each."""
        if self.hybrid:
            return self._prefill_hybrid(cache, state, admitted)
        device = self.device
        starts = []
        for slot, request in admitted:
            start = 0
            if self.prefix_cache is not None:
                blocks = self.prefix_cache.match(request.prompt, self.weight_version)
                if blocks:
                    k = torch.cat([b.k for b in blocks], dim=2)  # [L, Hkv, n, D]
                    v = torch.cat([b.v for b in blocks], dim=2)
                    for layer in range(k.shape[0]):
                        cache.write(layer, slot, k[layer], v[layer])
                    start = k.shape[2]
            starts.append(start)
            self.stats.prefix_hit_tokens += start
        lengths = [len(r.prompt) - s for (_, r), s in zip(admitted, starts)]
        width = max(lengths)
        chunk = self.prefill_chunk or width
        tokens = torch.zeros(len(admitted), width, dtype=torch.long)
        for i, ((_, r), s) in enumerate(zip(admitted, starts)):
            tokens[i, : lengths[i]] = torch.tensor(r.prompt[s:])
        tokens = tokens.to(device)
        slots = torch.tensor([slot for slot, _ in admitted], device=device)
        last = [n - 1 for n in lengths]  # index of each row's last prompt token
        final_logits = None
        for lo in range(0, width, chunk):
            hi = min(lo + chunk, width)
            positions = (torch.tensor(starts).unsqueeze(1) + torch.arange(lo, hi)).to(device)
            index = torch.tensor([min(max(n - lo, 0), hi - lo - 1) for n in last], device=device)
            logits = self.model(tokens[:, lo:hi], positions, cache, slots, logit_index=index)
            if final_logits is None:
                final_logits = torch.empty_like(logits)
            ending = [i for i, n in enumerate(last) if lo <= n < hi]
            if ending:
                ending_t = torch.tensor(ending, device=device)
                final_logits[ending_t] = logits[ending_t]
        self.stats.prefill_tokens += sum(lengths)
        self.stats.ragged_prefills += int(len(set(lengths)) > 1)
        requests = [r for _, r in admitted]
        state.admit(slots, requests, [len(r.prompt) - 1 for r in requests])
        self._sample(state, slots, final_logits)
        if self.prefix_cache is not None:
            for slot, request in admitted:
                n = len(request.prompt)
                self.prefix_cache.insert(
                    request.prompt,
                    self.weight_version,
                    cache.k[:, slot, :, :n],
                    cache.v[:, slot, :, :n],
                )

    def _prefill_hybrid(self, cache: HybridCache, state: SlotState, admitted):
        """Hybrid models prefill one request at a time: a Mamba state must never see padding.

        A prefix hit resumes only at an entry that carries the Mamba state, i.e. at a
        multiple of both the prefix block and the Mamba chunk, so the chunk scan resumes
        at a chunk boundary with an empty partial chunk. In persist mode the prefill stops
        at the last such multiple inside the prompt to keep the state there.
        """
        device = self.device
        span = math.lcm(BLOCK, self.model.cfg.chunk_size)
        final_logits = []
        for slot, request in admitted:
            prompt = request.prompt
            cache.clear_slot(slot)
            start, cut = 0, 0
            if self.prefix_cache is not None:
                blocks = self.prefix_cache.match(prompt, self.weight_version)
                while blocks and blocks[-1].mamba is None:
                    blocks.pop()
                if blocks:
                    k = torch.cat([b.k for b in blocks], dim=2)  # [L, Hkv, n, D]
                    v = torch.cat([b.v for b in blocks], dim=2)
                    for layer in range(k.shape[0]):
                        cache.write(layer, slot, k[layer], v[layer])
                    cache.restore(slot, blocks[-1].mamba)
                    start = len(blocks) * BLOCK
                cut = (len(prompt) - 1) // span * span
            self.stats.prefix_hit_tokens += start
            step = self.prefill_chunk or len(prompt)
            bounds = set(range(start, len(prompt), step)) | {len(prompt)}
            bounds = sorted(bounds | ({cut} if cut > start else set()))
            slots = torch.tensor([slot], device=device)
            snapshot = None
            for lo, hi in zip(bounds, bounds[1:]):
                tokens = torch.tensor([prompt[lo:hi]], device=device)
                positions = torch.arange(lo, hi, device=device).unsqueeze(0)
                index = torch.tensor([hi - lo - 1], device=device)
                logits = self.model(tokens, positions, cache, slots, logit_index=index)
                if hi == cut:
                    snapshot = cache.mamba_state(slot)
            final_logits.append(logits)
            self.stats.prefill_tokens += len(prompt) - start
            if self.prefix_cache is not None:
                n = len(prompt)
                version = self.weight_version
                self.prefix_cache.insert(
                    prompt, version, cache.k[:, slot, :, :n], cache.v[:, slot, :, :n]
                )
                if snapshot is not None:
                    self.prefix_cache.attach_state(prompt[:cut], version, snapshot)
        slots = torch.tensor([slot for slot, _ in admitted], device=device)
        requests = [r for _, r in admitted]
        state.admit(slots, requests, [len(r.prompt) - 1 for r in requests])
        self._sample(state, slots, torch.cat(final_logits))

    def _decode(self, cache: KVCache, state: SlotState, rows: torch.Tensor) -> None:
        """One token for every running slot `rows` [B], all in one batch, all on the device."""
        self._decode_rows(cache, state, rows)
        self.stats.decode_steps += 1

    def _decode_step(self, rows: torch.Tensor) -> None:
        """The captured step: one token for the slot rows [B] of the static cache and state."""
        self._decode_rows(self._cache, self._state, rows)

    def _decode_rows(self, cache: KVCache, state: SlotState, rows: torch.Tensor) -> None:
        tokens = state.token[rows].unsqueeze(1)
        positions = state.pos[rows].unsqueeze(1)
        logits = self.model(tokens, positions, cache, rows)[:, 0]
        self._sample(state, rows, logits)

    def _sample(self, state: SlotState, rows: torch.Tensor, logits: torch.Tensor) -> None:
        """logits [B, V] -> next token and its logprob for the slots `rows`; finished rows idle."""
        top_k_any, top_p_any = self._filters
        count = state.count[rows]
        temps = state.temperature[rows]
        raw_logprobs = is_enabled("logprob_path")
        if raw_logprobs and not (top_k_any or top_p_any):  # the sampler divides, in one pass
            next_tokens = gumbel_max(logits, state.seed[rows], count, temperature=temps)
        else:
            scores = processed_logits(
                logits,
                temps,
                state.top_k[rows] if top_k_any else None,
                state.top_p[rows] if top_p_any else None,
            )
            next_tokens = gumbel_max(scores, state.seed[rows], count)
        if raw_logprobs:
            logprobs = ops.token_logprobs(logits, next_tokens, temps.unsqueeze(-1))
        else:  # what a fast engine reports: processed logits, log-softmax in the model dtype
            logp = torch.log_softmax(scores.to(logits.dtype), dim=-1)
            logprobs = logp.gather(-1, next_tokens.unsqueeze(-1)).squeeze(-1).float()
        ops.commit_samples(state, rows, next_tokens, logprobs, self.eos_id)
