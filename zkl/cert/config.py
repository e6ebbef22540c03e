"""`cert.*` (python -m zkl.cert) and the check of its own keys; a leaf that
`zkl.cert.schema` adds to the core's."""

from __future__ import annotations

from dataclasses import dataclass

from zkl.errors import ConfigError


@dataclass
class CertConfig:
    """The bed axes: null certifies the config's own group; a list, one bed per option."""

    steps: int = 0  # 0: step-0 certification; N (>= 2): N real GRPO steps per bed
    ablate: bool = False
    models: list[str] | None = None
    precisions: list[str] | None = None
    layouts: list[str] | None = None
    kv: list[str] | None = None


def check_cert(cert: CertConfig) -> None:
    """One sentence naming the cert.* key whose value cannot work (the bed axes' options are
    checked as the beds are planned, `zkl.cert.beds`)."""
    if cert.steps < 0:
        raise ConfigError(f"cert.steps={cert.steps} must be >= 0.")
    if cert.steps == 1:
        raise ConfigError(
            "cert.steps=1 certifies no refit (its one rollout sees the initial weights); "
            "use 0 for step-0 or at least 2."
        )
