"""Can this machine run the configured megatron engine? One sentence when it cannot.

Pure (no megatron import): it looks for the packages with `importlib.util.find_spec`, so
`zkl.run.validate` calls it before any work, on every machine.
"""

from __future__ import annotations

import importlib.util
import sys

from zkl.megatron.mapping import ENGINES
from zkl.models.registry import FAMILIES

MIN_PYTHON = (3, 12)
TE_ENGINES = ("transformer_engine", "inference_optimized")
DEDICATED_ONLY_ENGINES = ("inference_optimized",)  # a dedicated generator's engine


def _installed(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        return False


def engine_problem(
    engine: str,
    layout: str,
    on_cuda: bool,
    model_family: str,
    linear_quant: str,
    python: tuple[int, int] | None = None,
    installed=_installed,
) -> str | None:
    """Why `engine` cannot run here (one sentence naming the key to change), or None.

    `python` and `installed` default to this interpreter and its packages (tests pass others).
    """
    if engine not in ENGINES:
        return None
    python = python or sys.version_info[:2]
    if python < MIN_PYTHON:
        return (
            f"engine={engine} needs megatron-core, which needs Python >= 3.12 (this is "
            f"{python[0]}.{python[1]}); use engine=native."
        )
    if not installed("megatron.core"):
        return (
            f"engine={engine} needs megatron-core, which is not installed; install "
            "megatron-core or use engine=native."
        )
    if engine in TE_ENGINES and not installed("transformer_engine"):
        return (
            f"engine={engine} needs Transformer Engine, which is not installed; use "
            "engine=megatron_local (megatron-core modules only)."
        )
    if engine in DEDICATED_ONLY_ENGINES and layout != "dedicated":
        return (
            f"engine={engine} is for a dedicated generator only; use "
            "+layout=dedicated or engine=megatron_local."
        )
    if not on_cuda:
        return f"engine={engine} runs on CUDA only; set device=cuda or use engine=native."
    entry = FAMILIES.get(model_family)
    if entry is not None and not entry.megatron:
        return f"engine={engine} has no {model_family} mapping yet; use engine=native."
    if linear_quant != "none":
        te_recipe = (
            " (Transformer Engine's MXFP8 recipe needs compute capability 10.0 and is not wired in)"
            if engine in TE_ENGINES
            else ""
        )
        return (
            f"engine={engine} runs the bf16/fp32 recipes only{te_recipe}; set +precision=bf16 "
            f"or use engine=native for precision.linear_quant={linear_quant}."
        )
    return None
