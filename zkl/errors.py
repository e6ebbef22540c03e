"""The errors an entry point turns into one sentence and an exit code, never a traceback.

`ConfigError` (exit 2): the config cannot work; raised before any work. `RunFault` (exit 1):
the run started but the machine failed it (the generation process died, the run directory
stopped taking writes) or its numbers did (`NonFinite`: NaN or inf logprobs or update).
"""

from __future__ import annotations

from typing import Any


class ConfigError(ValueError):
    """A configuration that cannot work; the message names the key to change."""


class ForeignRunDir(ConfigError):
    """The run directory holds another run (a live one, or one whose metrics are there): the
    refusal writes nothing into it, not even its own error.txt."""


class RunFault(RuntimeError):
    """A fault of the machine or of a child process after work started; one sentence."""


class NonFinite(RunFault):
    """A step's logprobs or update were NaN or inf; the step is logged, no later one runs.

    NaN compares unequal to itself and max() over rows skips it, so a run that went on
    would report mismatch metrics that look clean and mean nothing.
    """


def positive(value: float, key: str) -> None:
    """Refuse `key=value` unless the value is above zero."""
    if value <= 0:
        raise ConfigError(f"{key}={value} must be positive.")


def from_checkpoint(model: Any) -> str:
    """What a refusal naming an architecture key (`model.hidden_size`, ...) adds when
    `model.checkpoint` is set: that is the key the user set, and its config.json fixes the
    architecture. `model` is a ModelConfig, of which only `checkpoint` is read: every part's
    check that names a model size (models, precision) words it alike from here."""
    return f" (from model.checkpoint={model.checkpoint}'s config.json)" if model.checkpoint else ""
