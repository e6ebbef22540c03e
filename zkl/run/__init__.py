"""A run's whole config: the parts' dataclasses composed (schema), read from Hydra (compose),
and checked before any work (checks without torch, then validate), the checks that span parts
included.

Importing this package first loads every part's `config` leaf (`zkl/<part>/config.py`)
under its own name but without its package's `__init__`, which for models, precision,
layouts and distributed imports torch: the schema, the command-line checks and the config
checks then run in a fraction of a second, and a refused command line never waits for torch
(the architecture test keeps the leaves free of anything heavier than `zkl.errors`). A part
imported later reuses its leaf, so there is one `ModelConfig` class, not two.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path


def _load_config_leaves() -> None:
    for path in sorted(Path(__file__).resolve().parent.parent.glob("*/config.py")):
        package = f"zkl.{path.parent.name}"
        name = f"{package}.config"
        if name in sys.modules:
            continue
        if package in sys.modules:  # the part is loaded (or loading): import it the usual way
            importlib.import_module(name)
            continue
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise


_load_config_leaves()
