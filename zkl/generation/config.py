"""The generation part's config: the scheduler's knobs (`scheduler.*`), the KV mode
(conf/kv), sampling.

A leaf: the schema composes it and `check` refuses its own keys' bad values, before any
model is built, without importing the scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass

from zkl.errors import ConfigError, positive

GRAPH_SETTINGS = ("auto", "on", "off")  # scheduler.cuda_graphs
MIN_TEMPERATURE, MAX_TEMPERATURE = 1e-4, 1e4


@dataclass
class SchedulerConfig:
    """`scheduler`: continuous batching over whichever engine built the model."""

    max_batch_size: int = 8  # continuous-batching slots
    prefill_chunk: int = 0  # 0: whole prompt in one forward
    prefix_cache_blocks: int = 4096
    sync_every: int = 0  # decode steps between host looks at finished rows; 0: 1 CPU, 8 CUDA
    # Decode in CUDA graphs: auto (on where the model's decode can be captured, on CUDA) |
    # on (refuse where it cannot) | off (eager).
    cuda_graphs: str = "auto"


@dataclass
class KVConfig:
    mode: str = "recompute"  # recompute | persist


@dataclass
class SamplingConfig:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 6
    ignore_eos: bool = False  # true: every response is exactly max_new_tokens (benchmarks)


def graph_setting(value: object) -> str:
    """`scheduler.cuda_graphs` in canonical form: an override's true/false reads as on/off."""
    text = str(value).lower()
    return {"true": "on", "false": "off"}.get(text, text)


def check(scheduler: SchedulerConfig, kv: KVConfig, sampling: SamplingConfig) -> None:
    """One sentence naming the scheduler.*, kv.* or sampling.* key whose value cannot work."""
    if kv.mode not in ("recompute", "persist"):
        raise ConfigError(f"kv.mode={kv.mode!r} must be recompute or persist.")
    positive(scheduler.max_batch_size, "scheduler.max_batch_size")
    if scheduler.sync_every < 0:
        raise ConfigError(f"scheduler.sync_every={scheduler.sync_every} must be >= 0 (0: auto).")
    if graph_setting(scheduler.cuda_graphs) not in GRAPH_SETTINGS:
        raise ConfigError(
            f"scheduler.cuda_graphs={scheduler.cuda_graphs!r} must be auto, on or off."
        )
    if scheduler.prefill_chunk < 0:
        raise ConfigError(f"scheduler.prefill_chunk={scheduler.prefill_chunk} must be >= 0.")
    positive(scheduler.prefix_cache_blocks, "scheduler.prefix_cache_blocks")
    positive(sampling.temperature, "sampling.temperature")
    if not 0 < sampling.top_p <= 1:
        raise ConfigError(f"sampling.top_p={sampling.top_p} must be in (0, 1].")
    if sampling.top_k < 0:
        raise ConfigError(f"sampling.top_k={sampling.top_k} must be >= 0 (0 is off).")
    positive(sampling.max_new_tokens, "sampling.max_new_tokens")
    if not MIN_TEMPERATURE <= sampling.temperature <= MAX_TEMPERATURE:
        raise ConfigError(
            f"sampling.temperature={sampling.temperature} must be between {MIN_TEMPERATURE:g} "
            f"and {MAX_TEMPERATURE:g} (below, logits / temperature overflows; above, sampling "
            "is uniform)."
        )
