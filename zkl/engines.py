"""The engines zkl builds a model with, one entry each: the one place that says which is which.

An engine is the implementation of the model the trainer and the generator run
(`engine.name`, conf/engine): zkl's own model families (`native`), or a megatron-core
GPTModel built from one of megatron's layer specs with zkl's kernels in its slots
(docs/megatron.md). Every question of the form "which engine" (what it builds from, what it
needs installed, which layouts, precisions and features it supports) is asked of its entry
here; no other module compares an engine's name (tests/test_engines.py checks it). Adding an
engine: docs/engines.md. Pure data and `importlib.util`, so the config checks read it before
torch loads.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from zkl.errors import ConfigError

LAYOUTS = ("colocated", "dedicated")


@dataclass(frozen=True)
class Package:
    """A Python package an engine imports: its module, its name in a sentence, and the oldest
    Python it installs on."""

    module: str
    label: str
    python: tuple[int, int] = (3, 0)


MEGATRON_CORE = Package("megatron.core", "megatron-core", python=(3, 12))
TRANSFORMER_ENGINE = Package("transformer_engine", "Transformer Engine")


@dataclass(frozen=True)
class Engine:
    """What zkl knows of one engine (docs/engines.md lists what adding one takes).

    `spec`: the megatron-core layer spec it builds from (`zkl.megatron.spec.PROVIDERS`), None
    for zkl's own model families; `moe_spec` the spec its MoE layers take where that differs.
    `needs`: packages it imports. Supports: `layouts`, `cuda_only`, `every_family` (else the
    families whose registry entry says `megatron`), `quantized` (the MXFP8 / FP8 emulations,
    `precision.linear_quant`), `fp16`, `moe_graphs` (its MoE layers read nothing on the host,
    so an MoE decode step can be captured in CUDA graphs), `route_replay` (its MoE layers take
    the route tape, `rl.routing_replay`), `sharded` (FSDP2, `trainer.world_size > 1`),
    `activation_checkpointing`; `fused_norm`: its spec fuses the pre-attention and pre-MLP
    norms into the next linear, which moves their weights (`zkl.megatron.mapping`).
    """

    name: str
    spec: str | None = None
    moe_spec: str | None = None
    needs: tuple[Package, ...] = ()
    layouts: tuple[str, ...] = LAYOUTS
    cuda_only: bool = False
    every_family: bool = False
    quantized: bool = False
    fp16: bool = False
    moe_graphs: bool = False
    route_replay: bool = False
    sharded: bool = False
    activation_checkpointing: bool = False
    fused_norm: bool = False
    about: str = field(default="", compare=False)  # one line: its row in docs/engines.md

    def __post_init__(self) -> None:
        assert set(self.layouts) <= set(LAYOUTS) and self.layouts, self.layouts

    @property
    def builds_native(self) -> bool:
        """Whether it builds zkl's own model families (no megatron-core spec)."""
        return self.spec is None

    @property
    def dedicated_only(self) -> bool:
        """Whether it runs only as a dedicated generator's engine."""
        return self.layouts == ("dedicated",)

    def spec_for(self, moe: bool) -> str | None:
        """The megatron-core spec a dense (or, `moe`, an MoE) layer is built from."""
        return (self.moe_spec or self.spec) if moe else self.spec


ENGINES: dict[str, Engine] = {
    e.name: e
    for e in (
        Engine(
            "native",
            every_family=True,
            quantized=True,
            fp16=True,
            moe_graphs=True,
            route_replay=True,
            sharded=True,
            activation_checkpointing=True,
            about="zkl's own model families (CPU and CUDA)",
        ),
        Engine(
            "megatron_local",
            spec="local",
            needs=(MEGATRON_CORE,),
            cuda_only=True,
            about="megatron-core GPTModel, local spec (megatron-core modules only)",
        ),
        Engine(
            "transformer_engine",
            spec="te",
            needs=(MEGATRON_CORE, TRANSFORMER_ENGINE),
            cuda_only=True,
            fused_norm=True,
            about="megatron-core GPTModel, Transformer Engine spec (norms fused into linears)",
        ),
        Engine(
            "inference_optimized",
            spec="te_inference",
            # megatron-core's inference MoE (InferenceGroupedMLP) maps squared ReLU only: the
            # gated-SiLU experts of zkl's MoE families take Transformer Engine's SequentialMLP.
            moe_spec="te",
            needs=(MEGATRON_CORE, TRANSFORMER_ENGINE),
            layouts=("dedicated",),
            cuda_only=True,
            fused_norm=True,
            about="megatron-core's inference-optimized spec, a dedicated generator only",
        ),
    )
}
NATIVE = ENGINES["native"]


def supported() -> list[str]:
    return list(ENGINES)


def engine_named(name: str) -> Engine:
    """The entry of `engine.name`, or ConfigError naming the engines there are."""
    entry = ENGINES.get(name)
    if entry is None:
        raise ConfigError(f"engine.name={name!r} is not an engine; use one of {supported()}.")
    return entry


def megatron_engines() -> list[Engine]:
    """The engines built from a megatron-core spec."""
    return [e for e in ENGINES.values() if not e.builds_native]


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _instead(engine: Engine, works: Callable[[Engine], bool]) -> str:
    """The engine a refusal suggests: the first other megatron-core one that `works`, else
    native."""
    others = (e for e in megatron_engines() if e is not engine and works(e))
    return next((e.name for e in others), NATIVE.name)


def engine_problem(
    name: str,
    layout: str,
    on_cuda: bool,
    family: Any,
    linear_quant: str,
    python: tuple[int, int] | None = None,
    installed: Callable[[str], bool] = _installed,
) -> str | None:
    """Why engine `name` cannot run here (one sentence naming the key to change), or None.

    `family`: the model family's registry entry (its `name`, and `megatron`: whether
    zkl.megatron maps it). `python` and `installed` default to this interpreter and its
    packages (tests pass others).
    """
    engine = engine_named(name)
    python = python or sys.version_info[:2]
    for package in engine.needs:
        if python < package.python:
            version = ".".join(map(str, package.python))
            return (
                f"engine={name} needs {package.label}, which needs Python >= {version} (this "
                f"is {python[0]}.{python[1]}); use engine={NATIVE.name}."
            )
        if not installed(package.module):
            instead = _instead(engine, lambda e, p=package: p not in e.needs)
            fix = f"install {package.label} or use" if instead == NATIVE.name else "use"
            return (
                f"engine={name} needs {package.label}, which is not installed; {fix} "
                f"engine={instead}."
            )
    if layout not in engine.layouts:
        instead = _instead(engine, lambda e: layout in e.layouts)
        return (
            f"engine={name} is for a {' or '.join(engine.layouts)} generator only; use "
            f"+layout={engine.layouts[0]} or engine={instead}."
        )
    if engine.cuda_only and not on_cuda:
        return f"engine={name} runs on CUDA only; set device=cuda or use engine={NATIVE.name}."
    if not engine.every_family and not family.megatron:
        return f"engine={name} has no {family.name} mapping yet; use engine={NATIVE.name}."
    if linear_quant != "none" and not engine.quantized:
        te_recipe = (
            " (Transformer Engine's MXFP8 recipe needs compute capability 10.0 and is not wired in)"
            if TRANSFORMER_ENGINE in engine.needs
            else ""
        )
        return (
            f"engine={name} runs the bf16/fp32 recipes only{te_recipe}; set +precision=bf16 "
            f"or use engine={NATIVE.name} for precision.linear_quant={linear_quant}."
        )
    return None


@dataclass
class EngineConfig:
    """`engine`: which engine builds the model (conf/engine: native or a megatron-core one)."""

    name: str = NATIVE.name


def check(engine: EngineConfig) -> None:
    """One sentence for an `engine.name` no entry has."""
    engine_named(engine.name)
