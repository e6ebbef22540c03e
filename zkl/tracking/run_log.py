"""Where a run's results land: metrics.jsonl (the source of truth), token records, W&B.

Every step is appended and flushed to disk before the next one starts, so a crash never
loses a logged step. W&B is offline by default; its group and tags come from the config
axes so runs of one sweep compare side by side.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from zkl import invariance

METRICS_FILE = "metrics.jsonl"
TOKENS_FILE = "tokens.jsonl"
CONFIG_FILE = "config.yaml"


def axes(cfg) -> dict[str, str]:
    """The sweep axes of a run: what a comparison groups by.

    `fixes` appears when `fixes.<name>` overrides leave another set on than the mode's own,
    e.g. `minus_kv_invalidate_on_refit`, so the runs of an ablation land in distinct groups.
    """
    ax = {
        "model": cfg.model.name,
        "layout": cfg.layout.name,
        "engine": cfg.engine.name,
        "precision": cfg.precision.name,
        "kv": cfg.kv.mode,
        "mode": "zero" if cfg.zero_train_gen_mismatch else "default",
    }
    on = invariance.from_config(cfg)
    if on != invariance.resolve(cfg.zero_train_gen_mismatch, {}):
        ax["fixes"] = invariance.label(on)
    return ax


def tags(cfg) -> list[str]:
    """`axis:value` for every axis, `fix_off:<name>` for every fix off, then the user's tags."""
    on = invariance.from_config(cfg)
    off = [f"fix_off:{name}" for name in invariance.FIXES if name not in on]
    return [f"{k}:{v}" for k, v in axes(cfg).items()] + off + list(cfg.tracking.wandb.tags)


class RunLog:
    def __init__(self, run_dir: str | Path, cfg) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        resolved = OmegaConf.to_container(OmegaConf.structured(cfg))
        (self.run_dir / CONFIG_FILE).write_text(OmegaConf.to_yaml(resolved))
        self._metrics = open(self.run_dir / METRICS_FILE, "a")  # noqa: SIM115 (held for the run)
        self._tokens = open(self.run_dir / TOKENS_FILE, "a")  # noqa: SIM115
        self._wandb = None
        wb = cfg.tracking.wandb
        if wb.mode != "disabled":
            for key, value in (
                ("WANDB_SILENT", "true"),
                ("WANDB_DISABLE_GIT", "true"),
                ("WANDB_DISABLE_CODE", "true"),
                ("WANDB_CONSOLE", "off"),
            ):
                os.environ.setdefault(key, value)
            import wandb

            self._wandb = wandb.init(
                mode=wb.mode,
                project=wb.project,
                entity=wb.entity,
                group=wb.group or "-".join(axes(cfg).values()),
                tags=tags(cfg),
                config=resolved,
                dir=str(self.run_dir),
            )

    def log(self, step: int, row: dict[str, Any]) -> None:
        row = {"step": step, **row}
        self._metrics.write(json.dumps(row) + "\n")
        self._metrics.flush()
        os.fsync(self._metrics.fileno())
        if self._wandb is not None:
            self._wandb.log(row, step=step)

    def log_tokens(self, records: list[dict[str, Any]]) -> None:
        for record in records:
            self._tokens.write(json.dumps(record) + "\n")
        self._tokens.flush()

    def close(self) -> None:
        self._metrics.close()
        self._tokens.close()
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    with open(Path(run_dir) / METRICS_FILE) as f:
        return [json.loads(line) for line in f if line.strip()]
