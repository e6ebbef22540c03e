"""The certificate's schema: the core `ZklConfig` extended with `cert.*`.

`python -m zkl.cert` puts `CertRunConfig` in Hydra's ConfigStore (`zkl.run.register`), so
`python -m zkl cert.steps=2` is an unknown key and every training run's config holds only
what a training run reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from zkl.cert.config import CertConfig
from zkl.run.schema import ZklConfig


@dataclass
class CertRunConfig(ZklConfig):
    """What `python -m zkl.cert` certifies: a run's config and the bed axes."""

    cert: CertConfig = field(default_factory=CertConfig)
