"""Shared test helpers: configs composed exactly as `python -m zkl <overrides>` composes them."""

from __future__ import annotations

import os

import pytest
import torch

from zkl.config import ZklConfig, compose

os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("WANDB_DISABLE_GIT", "true")
os.environ.setdefault("WANDB_DISABLE_CODE", "true")
os.environ.setdefault("WANDB_CONSOLE", "off")
if not torch.cuda.is_available():  # the Triton kernels' logic runs on the CPU interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

QUIET = ["tracking.wandb.mode=disabled", "tracking.progress=false"]
SMALL = ["rl.prompts_per_step=4", "rl.samples_per_prompt=4"]


def make_cfg(*overrides: str, quiet: bool = True) -> ZklConfig:
    return compose([*(QUIET if quiet else []), *overrides])


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
