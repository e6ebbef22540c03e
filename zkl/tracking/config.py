"""The tracking part's config (logs, progress, W&B) and the check of its own keys, a leaf."""

from __future__ import annotations

from dataclasses import dataclass, field

from zkl.errors import ConfigError

MAX_COUNT = 2**31 - 1


@dataclass
class WandbConfig:
    mode: str = "offline"  # offline | online | disabled
    project: str = "zkl"
    entity: str | None = None
    group: str | None = None  # null: derived from the config axes
    tags: list[str] = field(default_factory=list)  # added to the derived axis tags
    fallback: str = "none"  # none | offline: log offline when online cannot start


@dataclass
class TrackingConfig:
    dump_tokens: str = "4"  # per-token records of the first N samples per step, or "all"
    progress: bool = True
    wandb: WandbConfig = field(default_factory=WandbConfig)


def check(tracking: TrackingConfig) -> None:
    """One sentence naming the tracking.* key whose value cannot work."""
    if tracking.wandb.mode not in ("offline", "online", "disabled"):
        raise ConfigError(
            f"tracking.wandb.mode={tracking.wandb.mode!r} must be offline, online or disabled."
        )
    dump = tracking.dump_tokens
    if dump != "all" and not (
        dump.isascii() and dump.isdigit() and len(dump) <= 10 and int(dump) <= MAX_COUNT
    ):
        raise ConfigError(
            f"tracking.dump_tokens={dump!r} must be a count (0 to {MAX_COUNT}) or 'all'."
        )
