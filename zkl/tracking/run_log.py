"""Where a run's results land: metrics.jsonl (the source of truth), token records, W&B.

Every step is appended and flushed to disk before the next one starts, so a crash never
loses a logged step. A line goes out in one write and is cut back if the write fails or is
interrupted, so the files hold only complete lines (a SIGKILL mid-write can still tear the
last one: the reader skips it, the next writer cuts it). W&B is offline by default; its
group and tags come from the config axes so runs of one sweep compare side by side, and an
offline run ends with a line saying where it lies and the `wandb sync` that uploads it.
"""

from __future__ import annotations

import contextlib
import json
import os
import warnings
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from zkl import invariance
from zkl.console import say
from zkl.errors import ConfigError, RunFault
from zkl.tracking import wandb_run
from zkl.tracking.jsonl import NOT_JSON, read_jsonl

METRICS_FILE = "metrics.jsonl"
TOKENS_FILE = "tokens.jsonl"
CONFIG_FILE = "config.yaml"


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """A saved config's nested dicts as one dict of dotted keys (`rl.lr`), to compare by key."""
    if isinstance(tree, dict):
        out: dict[str, Any] = {}
        for key, value in tree.items():
            out.update(flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: tree}


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
    def __init__(self, run_dir: str | Path, cfg, wandb_id: str | None = None) -> None:
        self.run_dir = Path(run_dir)
        self._fds: list[int] = []
        self._wandb = None
        resolved = OmegaConf.to_container(OmegaConf.structured(cfg))
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / CONFIG_FILE).write_text(OmegaConf.to_yaml(resolved))
            self._start_wandb(cfg, resolved, wandb_id)  # before the logs: a refusal leaves none
            self._metrics = self._open(METRICS_FILE)
            self._tokens = self._open(TOKENS_FILE)
        except OSError as err:
            self.close()
            where = f"{Path(err.filename).name}: " if err.filename else ""
            raise ConfigError(
                f"hydra.run.dir={self.run_dir} cannot be written ({where}{err.strerror or err}); "
                "choose another hydra.run.dir."
            ) from None

    def _start_wandb(self, cfg, resolved: dict, wandb_id: str | None) -> None:
        self.wandb_id = wandb_id  # a resumed run continues its W&B run
        group = cfg.tracking.wandb.group or "-".join(axes(cfg).values())
        self._wandb = wandb_run.start(cfg, self.run_dir, resolved, wandb_id, group, tags(cfg))
        if self._wandb is not None:
            self.wandb_id = self._wandb.id

    def _open(self, name: str) -> int:
        """An append descriptor for `name`, a torn last line left by a killed writer cut off."""
        fd = os.open(self.run_dir / name, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        self._fds.append(fd)
        end = keep = os.lseek(fd, 0, os.SEEK_END)
        if end == 0 or os.pread(fd, 1, end - 1) == b"\n":
            return fd
        while keep > 0:
            size = min(keep, 1 << 16)
            newline = os.pread(fd, size, keep - size).rfind(b"\n")
            keep -= size if newline < 0 else size - newline - 1
            if newline >= 0:
                break
        os.ftruncate(fd, keep)
        warnings.warn(f"{name}: cut a torn last line ({end - keep} bytes)", stacklevel=3)
        return fd

    def _append(self, fd: int, name: str, text: str, sync: bool) -> None:
        """Append whole lines in one write; on failure or interrupt, cut back what went out."""
        data = memoryview(text.encode())
        start = os.lseek(fd, 0, os.SEEK_END)
        done = 0
        try:
            while done < len(data):
                done += os.write(fd, data[done:])
            if sync:
                os.fsync(fd)
        except BaseException as err:
            if done < len(data):
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, start)
            if isinstance(err, OSError):
                raise RunFault(
                    f"cannot write {name} in hydra.run.dir={self.run_dir} "
                    f"({err.strerror or err}); every step before is complete."
                ) from None
            raise

    def log(self, step: int, row: dict[str, Any], tokens: list[dict[str, Any]] = ()) -> None:
        """A step's token records, then its metrics row: the row commits the step.

        The records are on disk (fsync) before the row goes out, and cut back when the row
        cannot be written, so a step is either logged with its token records or not at all.
        A kill between the two leaves records without a row, which a resume drops.
        """
        row = {"step": step, **row}
        start = os.lseek(self._tokens, 0, os.SEEK_END)
        if tokens:
            self.log_tokens(tokens, sync=True)
        try:
            self._append(self._metrics, METRICS_FILE, json.dumps(row) + "\n", sync=True)
        except BaseException:
            with contextlib.suppress(OSError):
                os.ftruncate(self._tokens, start)
            raise
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
        say(f"zkl: W&B stopped ({type(err).__name__}); metrics.jsonl goes on")
        self._wandb = None

    def log_tokens(self, records: list[dict[str, Any]], sync: bool = False) -> None:
        text = "".join(json.dumps(record) + "\n" for record in records)
        self._append(self._tokens, TOKENS_FILE, text, sync=sync)

    def close(self) -> None:
        while self._fds:
            os.close(self._fds.pop())
        if getattr(self, "_wandb", None) is not None:
            hint = wandb_run.sync_hint(self._wandb)
            try:
                self._wandb.finish()
            except Exception as err:
                self._wandb_lost(err)
            else:
                if hint:
                    say(hint)
            self._wandb = None


class NullLog:
    """A trainer rank other than 0: rank 0 alone writes the run's logs (the same rows)."""

    wandb_id: str | None = None

    def log(self, step: int, row: dict[str, Any], tokens: list[dict[str, Any]] = ()) -> None:
        pass

    def replay_to_wandb(self, rows: list[dict[str, Any]]) -> None:
        pass

    def log_tokens(self, records: list[dict[str, Any]], sync: bool = False) -> None:
        pass

    def close(self) -> None:
        pass


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """Every step's row; a torn last line (a writer killed mid-line) is skipped with a warning."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist.")
    read = read_jsonl(path)
    for line in read.lines:
        if line.record is NOT_JSON:
            raise ValueError(f"{path} line {line.number} is not JSON.")
    rows = [line.record for line in read.lines]
    if read.torn is not None and read.torn.record is not NOT_JSON:
        rows.append(read.torn.record)  # complete, only its newline missing
    elif read.torn is not None:
        warnings.warn(
            f"{path}: skipped a torn last line ({len(read.torn.text)} characters)", stacklevel=2
        )
    return rows
