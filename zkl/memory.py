"""What a run will hold in memory, estimated from the config and checked against the machine.

Without this, a size knob in the millions ends in an allocator traceback minutes in, and a
30B model on a small machine swaps toward hundreds of GB with no output. The estimate is
the sum of the large buffers that live at once (`peak`): the lasting ones (weights, fp32
master, AdamW state and gradients, KV and prefix cache, rollout records) and the largest
phase's (generation activations, scoring logits, or update activations); it is compared with
what the machine (and, when the run uses a CUDA device, the device) has free.
"""

from __future__ import annotations

import math
import os
from dataclasses import replace
from typing import Any

import torch

from zkl.device import generator_device, on_cuda, resolve_device
from zkl.distributed.checks import sharded
from zkl.errors import ConfigError
from zkl.generation.prefix_cache import BLOCK
from zkl.invariance import FIXES, from_config
from zkl.models.config import ModelConfig
from zkl.models.mamba2 import scan_piece_chunks
from zkl.models.registry import largest_layer_params, param_count
from zkl.ops import TABLE
from zkl.placement import own_gpu
from zkl.precision.config import quantizes
from zkl.precision.recipes import DTYPES

LOGIT_TOKENS = 8192  # tokens whose logits exist at once on the train path (trainer/scoring)

GB = 1e9
PROCESS_BYTES = 0.6 * GB  # an idle Python process with torch imported
RECORD_BYTES_PER_TOKEN = 400  # a generated token's int and 0-d logprob tensor

# what to change when a part is the largest: the sentence names these keys
ADVICE = {
    "weights and optimizer state": "raise trainer.world_size to shard them over more ranks "
    "(GPUs), or use a smaller model (model=...); a bf16 parameter with its fp32 master, AdamW "
    "state and gradients takes 20 bytes, 16 of them divided by the world size",
    "generator weights": "every rank's generator holds the whole model: set "
    "trainer.offload=true to keep the trainer's shards in host memory, or use a smaller "
    "model (model=...)",
    "KV cache": "lower scheduler.max_batch_size or sampling.max_new_tokens",
    "prefix cache": "lower scheduler.prefix_cache_blocks",
    "rotary tables": "lower model.max_position_embeddings",
    "scoring logits": "set rl.score_micro_batch, or lower rl.prompts_per_step or model.vocab_size",
    "update activations": "set rl.update_micro_batch (sequences a backward takes at once; "
    "one optimizer step a minibatch still), raise rl.num_minibatches, or lower "
    "rl.prompts_per_step, sampling.max_new_tokens or model.vocab_size",
    "generation activations": "lower scheduler.max_batch_size",
    "Mamba chunk scan": "set rl.score_micro_batch and rl.update_micro_batch, or lower "
    "rl.prompts_per_step or rl.samples_per_prompt",
    "rollout records": "lower rl.prompts_per_step or rl.samples_per_prompt",
    "processes": "free memory on this machine",
    "offloaded shards": "set trainer.offload=false, or raise trainer.world_size over more "
    "nodes (hydra.launcher.nodes)",
    "generator weights and refit buffer": "use a smaller model (model=...) or a GPU with "
    "more free memory (layout.generator_device)",
}
HOST_ONLY = ("rollout records", "processes", "offloaded shards")
# A step generates, then scores, then updates; each phase's transient buffers are gone before
# the next one's exist, while the weights, the optimizer state, the caches and the records stay.
PHASES = (
    ("generation activations",),
    ("scoring logits", "Mamba chunk scan"),
    ("update activations", "Mamba chunk scan"),
)
TRANSIENT = frozenset(name for phase in PHASES for name in phase)


def _own_gpu(cfg: Any) -> bool:
    """The generator sits on a GPU of its own (`zkl.placement.own_gpu`)."""
    return own_gpu(cfg.layout.name, cfg.layout.transport)


def _token_bytes(cfg: Any, positions: int) -> tuple[int, int, int]:
    """(compute-dtype bytes, one token's KV bytes, one token's activation bytes per layer)."""
    m = cfg.model
    c = DTYPES[cfg.precision.compute_dtype].itemsize  # bytes of one compute-dtype value
    width = m.intermediate_size
    if m.is_moe:
        width = m.moe.num_experts_per_tok * (m.moe.intermediate_size + 2 * m.hidden_size)
    # On CUDA both modes' attention (zkl's kernel, or flash) saves no score rows: the
    # backward is flash and recomputes them.
    attention_row = 0 if on_cuda(cfg) else m.num_attention_heads * positions * 4
    kv_token = 2 * m.num_hidden_layers * m.num_key_value_heads * m.head_dim * c
    return c, kv_token, (10 * m.hidden_size + 3 * width) * c + attention_row


def _kept_per_token(cfg: Any, c: int, layer_token: int) -> int:
    """Bytes a token's update keeps for the backward (`c` bytes a compute-dtype value): every
    layer's activations, or with
    `trainer.activation_checkpointing` each layer's input pair (residual stream and the
    pending sub-layer output) plus the one layer being remade."""
    m = cfg.model
    if not cfg.trainer.activation_checkpointing:
        return m.num_hidden_layers * layer_token
    return m.num_hidden_layers * 2 * m.hidden_size * c + layer_token


def mamba_scan_bytes(m: ModelConfig, sequences: int, positions: int) -> float:
    """The chunk scan's largest transient: C[l].B[s] over every (l, s) pair of a chunk,
    [Q, Q, H, N] in fp32 (and the same with P), built `scan_piece_chunks` chunks at a time
    (zkl/models/mamba2.py) by one layer at a time; twice that for the backward's gradient."""
    if "M" not in m.hybrid_override_pattern:
        return 0.0
    q = m.mamba.chunk_size
    width = max(m.mamba.state_size, m.mamba.head_dim)
    chunks = min(
        sequences * math.ceil(positions / q), scan_piece_chunks(q, m.mamba.num_heads, width)
    )
    return 2.0 * chunks * q * q * m.mamba.num_heads * width * 4


def mamba_saved_bytes(cfg: Any, sequences: int, positions: int) -> float:
    """What the update's backward keeps of the chunk scan (zkl/models/mamba2.py `chunk_scan`),
    fp32, per position of each sequence padded to whole chunks: three [Q, H] rows of the
    diagonal block (the decay, the scores before and after it), x*dt twice, the commits'
    B-products, two states per chunk, and the per-head running sums; for every Mamba layer,
    or for the one layer remade with `trainer.activation_checkpointing`."""
    m = cfg.model
    layers = m.hybrid_override_pattern[: m.num_hidden_layers].count("M")
    if not layers:
        return 0.0
    q, h, p, n = m.mamba.chunk_size, m.mamba.num_heads, m.mamba.head_dim, m.mamba.state_size
    per_position = 3 * q * h + 2 * h * p + h * n + 2 * h * p * n / q + 2 * h
    padded = math.ceil(positions / q) * q
    kept_layers = 1 if cfg.trainer.activation_checkpointing else layers
    return 4.0 * per_position * sequences * padded * kept_layers


def sharded_weights(cfg: Any) -> dict[str, float]:
    """Per-rank bytes of a sharded trainer (zkl/distributed/fsdp.py) and its generator.

    Each rank holds 1/world_size of the fp32 masters, their fp32 gradients and AdamW's two
    moments; while a layer runs, its whole bf16 weights (this one and the next, prefetched)
    and their bf16 gradients; the embeddings (the root group) whole; and its generator's
    whole model (plus a dedicated generator's refit buffers).
    """
    m, t = cfg.model, cfg.trainer
    c = DTYPES[cfg.precision.compute_dtype].itemsize  # bytes of one compute-dtype value
    p = param_count(m)
    master = 4 if cfg.precision.master_weights_fp32 or c == 4 else c
    shards = 0.0 if t.offload else p * (master + 4 + 8) / t.world_size  # offload: on the host
    embeddings = m.vocab_size * m.hidden_size * (1 if m.tie_word_embeddings else 2)
    transient = (3 * largest_layer_params(m) + 2 * embeddings) * c
    generator = p * c * (3 if cfg.layout.name == "dedicated" else 1)
    if quantizes(cfg.precision):
        generator += p * c  # the scheduler's cached quantized weights
    if cfg.rl.kl_coef > 0:
        shards += p * c  # the frozen reference model, whole on every rank
    return {"weights and optimizer state": shards + transient, "generator weights": generator}


def estimate(cfg: Any, positions: int) -> dict[str, float]:
    """Bytes of each large part of a run whose sequences are `positions` tokens long, on the
    trainer's device (with `layout.transport=nccl` the generator's GPU is `generator_estimate`);
    for a sharded trainer, one rank's (its share of the step's sequences)."""
    if sharded(cfg):
        return _sharded_estimate(cfg, positions)
    m, rl = cfg.model, cfg.rl
    c, kv_token, layer_token = _token_bytes(cfg, positions)
    p = param_count(m)
    fixes = from_config(cfg)
    dedicated = cfg.layout.name == "dedicated"
    per_param = 2 * c + 8  # weights, gradients, AdamW exp_avg and exp_avg_sq (fp32)
    if cfg.precision.master_weights_fp32 and c != 4:
        per_param += 8  # fp32 master and its gradient
    if rl.kl_coef > 0:
        per_param += c  # the frozen reference model
    if _own_gpu(cfg):
        per_param += c  # the trainer's side of the refit buffer
    elif dedicated:
        per_param += 3 * c  # the generator's model and the refit buffer on both sides
    elif any(f.off_copies_weights for name, f in FIXES.items() if name not in fixes):
        per_param += c  # the colocated generator's own copy
    if quantizes(cfg.precision):
        per_param += c  # cached quantized weights
    samples = rl.prompts_per_step * rl.samples_per_prompt
    scored = rl.score_micro_batch or samples
    minibatch = math.ceil(samples / rl.num_minibatches)
    # the sequences one forward and backward of the update hold at once
    piece = min(minibatch, rl.update_micro_batch) if rl.update_micro_batch else minibatch
    # CUDA's fused logprob kernel keeps no fp32 copy of the logits.
    fused = on_cuda(cfg) and TABLE["token_logprobs"].fix in fixes
    score_bytes, update_bytes = (c, 2 * c) if fused else (c + 8, c + 12)
    return {
        "weights and optimizer state": float(p * per_param),
        **({} if _own_gpu(cfg) else _scheduler_parts(cfg, positions)),
        "rotary tables": float(m.max_position_embeddings * m.head_dim * 24 * (1 + dedicated)),
        # the train path makes the logits LOGIT_TOKENS at a time (trainer/scoring)
        "scoring logits": float(min(scored * positions, LOGIT_TOKENS) * m.vocab_size * score_bytes),
        "update activations": float(
            piece * positions * _kept_per_token(cfg, c, layer_token)
            + mamba_saved_bytes(cfg, piece, positions)
            + min(piece * positions, LOGIT_TOKENS) * m.vocab_size * update_bytes
        ),
        # the trainer's forwards; the scheduler prefills a hybrid one request at a time
        "Mamba chunk scan": mamba_scan_bytes(m, max(scored, piece), positions),
        "rollout records": float(samples * positions * RECORD_BYTES_PER_TOKEN),
        "processes": PROCESS_BYTES * (1 + dedicated),
    }


def _sharded_estimate(cfg: Any, positions: int) -> dict[str, float]:
    """`estimate` of one rank: the unsharded run's activations for its share of sequences."""
    ws = cfg.trainer.world_size
    rl = cfg.rl
    share = replace(
        cfg,
        rl=replace(rl, prompts_per_step=max(1, math.ceil(rl.prompts_per_step / ws))),
        trainer=replace(cfg.trainer, world_size=1, fsdp=False),
        layout=replace(cfg.layout, name="colocated"),
    )
    parts = estimate(share, positions)
    parts.update(sharded_weights(cfg))
    parts["processes"] = PROCESS_BYTES * (1 + (cfg.layout.name == "dedicated"))
    if cfg.trainer.offload:
        m = cfg.precision.master_weights_fp32 or cfg.precision.compute_dtype == "float32"
        per = (4 if m else 2) + 4 + 8
        parts["offloaded shards"] = param_count(cfg.model) * per / cfg.trainer.world_size
    return parts


def _scheduler_parts(cfg: Any, positions: int) -> dict[str, float]:
    """The scheduler's KV cache, prefix cache and activations."""
    _, kv_token, layer_token = _token_bytes(cfg, positions)
    m, batch = cfg.model, cfg.scheduler.max_batch_size
    blocks = cfg.scheduler.prefix_cache_blocks if cfg.kv.mode == "persist" else 0
    # a prefill forward: each admitted row's prompt, `scheduler.prefill_chunk` tokens at a time
    prompt = max(1, positions - cfg.sampling.max_new_tokens)
    prefill = min(prompt, cfg.scheduler.prefill_chunk or prompt)
    return {
        "KV cache": float(batch * positions * kv_token),
        "prefix cache": float(blocks * BLOCK * kv_token),
        "generation activations": float(batch * prefill * layer_token + batch * m.vocab_size * 12),
    }


def generator_estimate(cfg: Any, positions: int) -> dict[str, float]:
    """Bytes on the generator's own GPU (`layout.transport=nccl`): its weights and refit
    buffer, the scheduler's caches and activations; empty for the other layouts."""
    if not _own_gpu(cfg):
        return {}
    c, _, _ = _token_bytes(cfg, positions)
    weights = 2 * c * param_count(cfg.model)
    return {
        "generator weights and refit buffer": float(weights),
        **_scheduler_parts(cfg, positions),
    }


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def available_bytes() -> int:
    """Memory this process may still take: MemAvailable, capped by a cgroup (Slurm) limit."""
    available = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
    except OSError:
        pass
    if available is None:
        available = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    for limit_file, usage_file in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        (
            "/sys/fs/cgroup/memory/memory.limit_in_bytes",
            "/sys/fs/cgroup/memory/memory.usage_in_bytes",
        ),
    ):
        limit, usage = _read_int(limit_file), _read_int(usage_file)
        if limit is not None and usage is not None and limit < available + usage:
            available = min(available, limit - usage)
    return available


def peak(parts: dict[str, float]) -> float:
    """Bytes held at once: every lasting part of `estimate`, and the largest phase's."""
    lasting = sum(v for k, v in parts.items() if k not in TRANSIENT)
    return lasting + max(sum(parts.get(k, 0.0) for k in phase) for phase in PHASES)


def advice(name: str, cfg: Any) -> str:
    """What to change for the largest part, leaving out a key that is already set that way."""
    if name == "update activations" and not cfg.trainer.activation_checkpointing:
        return f"set trainer.activation_checkpointing=true, {ADVICE[name]}"
    return ADVICE[name]


def _refuse(parts: dict[str, float], free: float, where: str, cfg: Any) -> None:
    total = peak(parts)
    if total <= free:
        return
    name = max(parts, key=parts.get)
    raise ConfigError(
        f"the run needs about {total / GB:.1f} GB of memory but {where} has "
        f"{max(free, 0) / GB:.1f} GB free; the largest part is the {name} "
        f"({parts[name] / GB:.1f} GB): {advice(name, cfg)}."
    )


def check_memory(cfg: Any, positions: int) -> None:
    """Refuse a run whose estimate exceeds the free memory, with the estimate in GB."""
    parts = estimate(cfg, positions)
    if on_cuda(cfg) and torch.cuda.is_available():
        free, _ = torch.cuda.mem_get_info(resolve_device(str(cfg.device)))
        _refuse({k: v for k, v in parts.items() if k not in HOST_ONLY}, free, "the GPU", cfg)
        parts = {k: v for k, v in parts.items() if k in HOST_ONLY}
        generator = generator_estimate(cfg, positions)
        if generator:
            device = generator_device(cfg)
            free, _ = torch.cuda.mem_get_info(device)
            _refuse(generator, free, f"the generator's GPU ({device})", cfg)
    if sharded(cfg):  # the ranks on this machine share its memory
        local = int(os.environ.get("LOCAL_WORLD_SIZE") or cfg.trainer.world_size)
        parts = {k: v * local for k, v in parts.items()}
    _refuse(parts, available_bytes(), "this machine", cfg)
