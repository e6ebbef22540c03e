"""Each part's checks of its own keys, and the files the config names, run before torch
loads: a refusal is immediate.

`check_composed` is the first thing an entry point's Hydra job does with the composed
config (`check_overrides` for one that composes without `@hydra.main`): the keys, then
`model.checkpoint`'s files (`zkl.models.hf_weight_files`) and a dataset task's files, tokenizer
and reward (`zkl.data.dataset.check_inputs`). `zkl.run.validate.validate` runs the keys'
checks first, then the ones that need the machine, the model or the task (device, memory,
the checkpoint against the model, the task's rows).
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from zkl.console import say
from zkl.data.config import check as check_task
from zkl.data.dataset import check_inputs as check_dataset_inputs
from zkl.engines import check as check_engine
from zkl.errors import ConfigError
from zkl.generation.config import check as check_generation
from zkl.layouts.config import check as check_layout
from zkl.models.config import validate_shapes
from zkl.models.hf_weight_files import check_weight_files
from zkl.precision.config import check as check_precision
from zkl.rl.config import check as check_rl
from zkl.run.keys import reject_unknown_keys
from zkl.run.overrides import normalize, preflight, renames
from zkl.run.register import compose_dict
from zkl.run.schema import ZklConfig
from zkl.run.values import check_values
from zkl.state.config import check as check_checkpoint
from zkl.tracking.config import check as check_tracking

MAX_THREADS = 1024


def check_parts(cfg: Any, model: bool = True) -> None:
    """Raise ConfigError, one sentence naming the key, for a part's key that cannot work.

    `model=False` leaves the model's own checks to `validate`: the architecture of a run
    with `model.checkpoint` and no model group comes from the checkpoint's config.json.
    """
    check_values(cfg)  # first: a NaN or a huge integer passes every comparison below
    if model:
        try:
            validate_shapes(cfg.model)  # the family's own rules need torch: in validate
        except ValueError as err:
            raise ConfigError(str(err)) from None
        check_precision(cfg.precision, cfg.model)
    check_layout(cfg.layout)
    check_engine(cfg.engine)
    check_generation(cfg.scheduler, cfg.kv, cfg.sampling)
    check_rl(cfg.rl)
    check_task(cfg.task)
    if cfg.rl.val_every and cfg.task.name == "dataset" and not cfg.task.val_path:
        raise ConfigError(
            f"rl.val_every={cfg.rl.val_every} needs a validation split: set "
            "task.val_path=FILE, or rl.val_every=0."
        )
    check_tracking(cfg.tracking)
    check_checkpoint(cfg.checkpoint, cfg.resume)
    if cfg.num_threads < 0:
        raise ConfigError(f"num_threads={cfg.num_threads} must be >= 0 (0: zkl's choice).")
    if cfg.num_threads > MAX_THREADS:
        raise ConfigError(f"num_threads={cfg.num_threads} must be at most {MAX_THREADS}.")


def check_inputs(cfg: Any) -> None:
    """The files the config names, checked without torch: `model.checkpoint`'s directory,
    JSON files and safetensors headers; a dataset task's splits, tokenizer and reward."""
    if cfg.model.checkpoint:
        check_weight_files(cfg.model.checkpoint)
    if cfg.task.name == "dataset" and not cfg.task._target_:
        check_dataset_inputs(cfg.task, cfg.model.checkpoint)


def check_composed(dcfg: DictConfig) -> Any:
    """The typed config of a Hydra job, its keys, each part's values and the files it names
    checked (no torch).

    The model is checked here unless `model.checkpoint` replaces it (then in `validate`).
    """
    reject_unknown_keys(dcfg)
    cfg = OmegaConf.to_object(dcfg)
    check_parts(cfg, model=not cfg.model.checkpoint)
    check_inputs(cfg)
    return cfg


def check_overrides(overrides: list[str], schema: type = ZklConfig) -> DictConfig:
    """`check_composed` for an entry point that composes without `@hydra.main` (the warm
    start): the overrides checked (`zkl.run.overrides.preflight`), composed and checked; the
    composed config, for the run. An old key runs as its new one, with a line saying so."""
    normalized = normalize(overrides)
    preflight(normalized, schema=schema)
    for sentence in renames(overrides):
        say(f"zkl: {sentence}")
    dcfg = compose_dict(normalized, schema)
    check_composed(dcfg)
    return dcfg
