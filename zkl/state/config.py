"""The `checkpoint` part's config (a run's saved state, zkl/state/checkpoint.py) and its check."""

from __future__ import annotations

from dataclasses import dataclass

from zkl.errors import ConfigError

# In the run directory: where the run stands (zkl/state/checkpoint_file.py writes it). Named
# here, in the part's torch-free leaf, for the readers that run before torch loads.
CHECKPOINT_FILE = "checkpoint.pt"


@dataclass
class CheckpointConfig:
    every: int = 10  # save every N steps (0: only after the last step and on a stop signal)
    save: bool = True  # false: never write checkpoint.pt (cert beds, benchmarks); no resume


def check(checkpoint: CheckpointConfig, resume: bool) -> None:
    """One sentence naming the checkpoint.* key (or `resume`) that cannot work."""
    if checkpoint.every < 0:
        raise ConfigError(
            f"checkpoint.every={checkpoint.every} must be >= 0 (0: only at "
            "the end and on a stop signal)."
        )
    if resume and not checkpoint.save:
        raise ConfigError(
            "resume=true needs a checkpoint, but checkpoint.save=false writes none; "
            "set checkpoint.save=true (or drop resume=true for a fresh run)."
        )
