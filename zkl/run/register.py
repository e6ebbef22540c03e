"""The schema and the resolvers in Hydra, before it composes: nothing here runs at import.

Each entry point registers its own schema under one name (`ZklConfig` for `python -m zkl`,
the experiments' extensions for `zkl.cert` and `zkl.bench`); conf/config.yaml's first
default names it, so the same YAML serves all three.
"""

from __future__ import annotations

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from zkl.distributed.config import node_gpus, tasks_per_node
from zkl.layouts.config import layout_gpus
from zkl.run.schema import ZklConfig

SCHEMA_NAME = "zkl_schema"  # conf/config.yaml's first default


def register(schema: type = ZklConfig) -> None:
    """`schema` in Hydra's ConfigStore; the resolvers conf/hydra/launcher/slurm*.yaml use."""
    ConfigStore.instance().store(name=SCHEMA_NAME, node=schema)
    OmegaConf.register_new_resolver("zkl_gpus", layout_gpus, replace=True)
    OmegaConf.register_new_resolver("zkl_tasks_per_node", tasks_per_node, replace=True)
    OmegaConf.register_new_resolver("zkl_node_gpus", node_gpus, replace=True)
