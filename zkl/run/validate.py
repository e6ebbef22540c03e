"""Stop a config that cannot work before any work starts, in one sentence naming the key.

Each part checks its own keys (its `check` beside its config dataclass); `zkl.run.checks`
runs them in turn (without torch, so an entry point runs them first), then this module runs
the checks that span parts: the device with the layout, the engine with the machine,
CUDA graphs with the model, vocabulary and positions with the task, the weights with
`model.checkpoint`, and the memory the whole run needs. An entry point calls `check_run`
(or `validate_run` for a task it built) before it starts the loop (zkl/rl/loop.py), which
checks nothing itself.
"""

from __future__ import annotations

from typing import Any

from zkl import environment
from zkl.data.tasks import build_task
from zkl.device import check_device, generator_device, on_cuda, resolve_device
from zkl.distributed.checks import check_trainer
from zkl.engines import engine_problem
from zkl.errors import ConfigError, from_checkpoint
from zkl.generation import config as generation_config
from zkl.generation.graphs import graph_unsupported_reason
from zkl.memory import check_memory
from zkl.models.config import check_positions, model_named
from zkl.models.hf_weights_check import check_hf_weights
from zkl.models.registry import family, validate_model
from zkl.precision.config import quantizes
from zkl.precision.fp16 import check_fp16
from zkl.rl.config import check_treatments
from zkl.run.checks import check_parts
from zkl.run.schema import ZklConfig
from zkl.tracking.wandb_run import online_problem


def validate(
    cfg: ZklConfig, vocab_needed: int | None = None, positions_needed: int | None = None
) -> None:
    """Raise ConfigError, one sentence naming the key to change, for a config that cannot work."""
    check_parts(cfg)  # each part's own keys (zkl.run.checks), also run before torch loads
    try:
        validate_model(cfg.model)  # the family's own rules (the registry imports the models)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    _check_device(cfg)
    _check_engine(cfg)
    _check_graphs(cfg)
    check_treatments(cfg, replays="route_replay" in family(cfg.model).capabilities)
    check_fp16(cfg)  # the fp16 recipe with the rest of the config
    problem = online_problem(cfg.tracking.wandb)
    if problem:
        raise ConfigError(problem)
    check_trainer(cfg)
    positions_needed = positions_needed or default_positions(cfg)
    _check_vocab_positions(cfg, vocab_needed, positions_needed)
    if cfg.model.checkpoint:
        check_hf_weights(cfg.model)
    check_memory(cfg, positions_needed)


def validate_run(cfg: ZklConfig, task: Any) -> None:
    """The config check for a run of `task`: its tokenizer and prompt length included."""
    validate(
        cfg,
        vocab_needed=len(task.tokenizer),
        positions_needed=task.max_prompt_len + cfg.sampling.max_new_tokens,
    )


def check_run(cfg: ZklConfig) -> Any:
    """Every refusal a training run of `cfg` meets before any work: the config with its task
    (`validate_run`), then the environment variables the run reads (zkl/environment.py).
    Returns the task it built, for the loop (`zkl.rl.loop.run(..., task=)`) to reuse."""
    task = build_task(cfg)
    validate_run(cfg, task)
    environment.check(wandb_on=cfg.tracking.wandb.mode != "disabled")
    return task


def default_positions(cfg: Any) -> int:
    """Positions a run of the configured task needs: its longest prompt plus the response."""
    return build_task(cfg).max_prompt_len + cfg.sampling.max_new_tokens


def _check_device(cfg: ZklConfig) -> None:
    """`device` can run here and the layout can place its generator."""
    problem = check_device(cfg.device)
    if problem:
        raise ConfigError(problem)
    generator_device(cfg)  # raises the sentence for a transport / GPU pair that cannot run
    if cfg.layout.transport == "cuda_ipc" and not on_cuda(cfg):
        raise ConfigError("layout.transport=cuda_ipc needs device=cuda; use gloo on the CPU.")
    if cfg.layout.transport == "gloo" and on_cuda(cfg) and cfg.layout.name == "dedicated":
        raise ConfigError(
            "layout.transport=gloo would copy CUDA weights through the host; use "
            "layout.transport=cuda_ipc (or auto) with device=cuda."
        )


def _check_engine(cfg: ZklConfig) -> None:
    """`engine.name` names an engine this machine, layout, model and precision can run."""
    problem = engine_problem(
        cfg.engine.name,
        cfg.layout.name,
        on_cuda(cfg),
        family(cfg.model),
        cfg.precision.linear_quant,
    )
    if problem:
        raise ConfigError(problem)


def _check_graphs(cfg: ZklConfig) -> None:
    """`scheduler.cuda_graphs=on` where the model's decode cannot be captured: refused now, by
    the rule the scheduler decides with (zkl.generation.graphs), not by its constructor later."""
    if generation_config.graph_setting(cfg.scheduler.cuda_graphs) != "on":
        return
    if not on_cuda(cfg):
        raise ConfigError("scheduler.cuda_graphs=on needs device=cuda; use auto or off on the CPU.")
    reason = graph_unsupported_reason(
        cfg.model, resolve_device(cfg.device), quantizes(cfg.precision), cfg.engine.name
    )
    if reason:
        raise ConfigError(
            f"scheduler.cuda_graphs=on cannot work with {model_named(cfg.model)}: {reason}; use "
            "scheduler.cuda_graphs=auto or off."
        )


def _check_vocab_positions(cfg: ZklConfig, vocab_needed: int | None, positions: int) -> None:
    if vocab_needed is not None and cfg.model.vocab_size < vocab_needed:
        fix = (
            "use a task whose tokenizer fits the checkpoint's vocabulary"
            if cfg.model.checkpoint  # its config.json fixes the vocabulary
            else "raise model.vocab_size"
        )
        raise ConfigError(
            f"model.vocab_size={cfg.model.vocab_size}{from_checkpoint(cfg.model)} is smaller "
            f"than the task tokenizer's {vocab_needed} tokens; {fix}."
        )
    check_positions(cfg.model, positions, "a prompt plus sampling.max_new_tokens needs")
