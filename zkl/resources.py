"""Where the YAML zkl ships lives: `conf/` (the config groups) and `sweeps/`, found in one place.

In a checkout (run from it, or installed editable) they are the repository's top-level
folders beside `zkl/`. Nothing outside a package's folder reaches site-packages, so a wheel
carries them inside the package as `zkl/_conf` and `zkl/_sweeps` (setup.py maps them there).
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

PACKAGED = {"conf": "_conf", "sweeps": "_sweeps"}  # top-level folder -> its name in the wheel


def _folder(name: str) -> Path:
    package = Path(str(files("zkl")))
    inside = package / PACKAGED[name]
    return inside if inside.is_dir() else package.parent / name


def conf_dir() -> Path:
    """The config groups Hydra composes (`config.yaml`, `model/`, `precision/`, ...)."""
    return _folder("conf")


def sweeps_dir() -> Path:
    """The sweeps a user runs or copies: `--config-dir` of `python -m zkl -m`."""
    return _folder("sweeps")
