"""Where a run's results land: metrics.jsonl (the source of truth), token records, W&B.

Every step is appended and flushed to disk before the next one starts, so a crash never
loses a logged step. W&B is offline by default; its group and tags come from the config
axes so runs of one sweep compare side by side.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

METRICS_FILE = "metrics.jsonl"
TOKENS_FILE = "tokens.jsonl"
CONFIG_FILE = "config.yaml"


def axes(cfg) -> dict[str, str]:
    """The sweep axes of a run: what a comparison groups by."""
    return {
        "model": cfg.model.name,
        "layout": cfg.layout.name,
        "engine": cfg.engine.name,
        "precision": cfg.precision.name,
        "kv": cfg.kv.mode,
        "mode": "zero" if cfg.zero_train_gen_mismatch else "default",
    }


class RunLog:
    def __init__(self, run_dir: str | Path, cfg, wandb_id: str | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        resolved = OmegaConf.to_container(OmegaConf.structured(cfg))
        (self.run_dir / CONFIG_FILE).write_text(OmegaConf.to_yaml(resolved))
        self._metrics = open(self.run_dir / METRICS_FILE, "a")  # noqa: SIM115 (held for the run)
        self._tokens = open(self.run_dir / TOKENS_FILE, "a")  # noqa: SIM115
        self._wandb = None
        self.wandb_id = wandb_id  # a resumed run continues its W&B run
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

            ax = axes(cfg)
            self._wandb = wandb.init(
                mode=wb.mode,
                project=wb.project,
                entity=wb.entity,
                group=wb.group or "-".join(ax.values()),
                tags=[f"{k}:{v}" for k, v in ax.items()] + list(wb.tags),
                config=resolved,
                dir=str(self.run_dir),
                id=wandb_id,
                resume="allow" if wandb_id else None,
            )
            self.wandb_id = self._wandb.id

    def log(self, step: int, row: dict[str, Any]) -> None:
        row = {"step": step, **row}
        self._metrics.write(json.dumps(row) + "\n")
        self._metrics.flush()
        os.fsync(self._metrics.fileno())
        self._to_wandb(row)

    def replay_to_wandb(self, rows: list[dict[str, Any]]) -> None:
        """A resumed run's earlier rows, which the W&B service may have died with unsent.

        W&B keeps a resumed run's steps increasing: rows it already holds are dropped.
        """
        for row in rows:
            self._to_wandb(row)

    def _to_wandb(self, row: dict[str, Any]) -> None:
        if self._wandb is None:
            return
        try:
            self._wandb.log(row, step=row["step"])
        except Exception as err:  # Slurm's SIGTERM reaches the W&B service process too
            self._wandb_lost(err)

    def _wandb_lost(self, err: Exception) -> None:
        print(f"zkl: W&B stopped ({type(err).__name__}); metrics.jsonl goes on", file=sys.stderr)
        self._wandb = None

    def log_tokens(self, records: list[dict[str, Any]]) -> None:
        for record in records:
            self._tokens.write(json.dumps(record) + "\n")
        self._tokens.flush()

    def close(self) -> None:
        self._metrics.close()
        self._tokens.close()
        if self._wandb is not None:
            try:
                self._wandb.finish()
            except Exception as err:
                self._wandb_lost(err)
            self._wandb = None


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    with open(Path(run_dir) / METRICS_FILE) as f:
        return [json.loads(line) for line in f if line.strip()]
