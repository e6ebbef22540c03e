"""The schema and the resolvers in Hydra, before it composes (nothing here runs at import),
and Hydra's composition of a list of overrides outside `@hydra.main`; no torch.

Each entry point registers its own schema under one name (`ZklConfig` for `python -m zkl`,
its extensions in `zkl.cert.schema` and `zkl.lab.schema` for `zkl.cert` and `zkl.bench`);
conf/config.yaml's first default names it, so the same YAML serves all three.
"""

from __future__ import annotations

from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.plugins import Plugins
from omegaconf import DictConfig, OmegaConf

from hydra_plugins import zkl_launchers
from zkl.distributed.config import tasks_per_node
from zkl.placement import layout_gpus, node_gpus
from zkl.run.schema import CONF_DIR, ZklConfig

SCHEMA_NAME = "zkl_schema"  # conf/config.yaml's first default


def register(schema: type = ZklConfig) -> None:
    """`schema` in Hydra's ConfigStore; the resolvers conf/hydra/launcher/slurm*.yaml use;
    zkl's launchers (conf/hydra/launcher), which Hydra's own scan of `hydra_plugins` misses in
    an editable install (setuptools' import hook lists no modules to it)."""
    ConfigStore.instance().store(name=SCHEMA_NAME, node=schema)
    for launcher in (zkl_launchers.LocalLauncher, zkl_launchers.SlurmLauncher):
        Plugins.instance().register(launcher)
    OmegaConf.register_new_resolver("zkl_gpus", layout_gpus, replace=True)
    OmegaConf.register_new_resolver("zkl_tasks_per_node", tasks_per_node, replace=True)
    OmegaConf.register_new_resolver("zkl_node_gpus", node_gpus, replace=True)


def compose_dict(overrides: list[str], schema: type = ZklConfig) -> DictConfig:
    """The config Hydra composes from conf/ and `overrides` (normalized: `zkl.run.overrides`),
    `schema` registered: what `@hydra.main` hands an entry point's job."""
    register(schema)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return compose("config", overrides=overrides)
