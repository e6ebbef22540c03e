"""`resume=true` without a run directory of its own: the latest run of the same config.

Hydra makes each run a fresh folder from the `hydra.run.dir` pattern (by default
`outputs/${now:%Y-%m-%d}/${now:%H-%M-%S}`), so a resume that names no folder would start a
new run from step 0. As W&B's `resume="auto"` and Lightning's `ckpt_path="last"`, such a
resume continues the latest run of the same config instead: among the folders the pattern
matches (each `${...}` a wildcard), those that hold a `checkpoint.pt` and Hydra's record of
the config they ran (`.hydra/config.yaml`) of the same run (zkl/state/same_config.py: every
key equal but those a resume may change), held by no live run; the latest is the one whose
checkpoint was saved last. When none qualifies the resume is refused with one sentence naming
the folders it considered and why each was passed over. A pattern without `${...}` is one
folder, which the resume uses as it is. Torch-free: it runs before Hydra makes the folder.
"""

from __future__ import annotations

import glob
import os
import re
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from zkl.errors import ConfigError
from zkl.state import run_lock
from zkl.state.config import CHECKPOINT_FILE
from zkl.state.same_config import first_difference

HYDRA_CONFIG = Path(".hydra") / "config.yaml"  # Hydra's copy of the job config, every run
SHOWN = 5  # folders a refusal names; the rest are counted
_INTERPOLATION = re.compile(r"\$\{[^}]*\}")


def folder_glob(pattern: str) -> str | None:
    """The `hydra.run.dir` pattern as a glob (each `${...}` a `*`); None for a fixed folder."""
    if not _INTERPOLATION.search(pattern):
        return None
    return _INTERPOLATION.sub("*", pattern)


def _as_saved(job_config: Any) -> dict[str, Any]:
    """The job config as `.hydra/config.yaml` reads back (Hydra writes it with to_yaml)."""
    return OmegaConf.to_container(OmegaConf.create(OmegaConf.to_yaml(job_config)))


def _passed_over(folder: Path, now: dict[str, Any]) -> str | None:
    """Why `folder` cannot be the run to continue, or None when it can."""
    if not (folder / CHECKPOINT_FILE).is_file():
        return f"no {CHECKPOINT_FILE}"
    try:
        then = OmegaConf.to_container(OmegaConf.load(folder / HYDRA_CONFIG))
    except Exception:  # missing, unreadable or not YAML: not a run Hydra started
        return f"no readable {HYDRA_CONFIG}"
    if not isinstance(then, dict):
        return f"no readable {HYDRA_CONFIG}"
    difference = first_difference(now, then)
    if difference is not None:
        key, was, is_now = difference
        return f"another config ({key} was {was!r}, now {is_now!r})"
    if run_lock.in_use(folder):
        return "in use by a live run"
    return None


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def latest_run(pattern: str, job_config: Any) -> Path:
    """The folder `resume=true` continues: the latest run of `job_config` among the folders
    `pattern` (`hydra.run.dir`, uninterpolated) matches; ConfigError when there is none."""
    where = folder_glob(pattern)
    assert where is not None, "a fixed hydra.run.dir is resumed as it is"
    now = _as_saved(job_config)
    folders = [Path(p) for p in glob.glob(where) if os.path.isdir(p)]
    folders.sort(key=lambda f: (_mtime(f / CHECKPOINT_FILE), _mtime(f), str(f)), reverse=True)
    considered = []
    for folder in folders:
        why = _passed_over(folder, now)
        if why is None:
            return folder
        considered.append(f"{folder}: {why}")
    if considered:
        shown = "; ".join(considered[:SHOWN])
        more = f"; and {len(considered) - SHOWN} more" if len(considered) > SHOWN else ""
        count = f"{len(considered)} folder{'s' if len(considered) > 1 else ''}"
        found = f"among the {count} matching {where} ({shown}{more})"
    else:
        found = f"in {where} (no folder matches it)"
    raise ConfigError(
        f"resume=true found no run of this config to continue {found}; pass "
        "hydra.run.dir=DIR of the run to continue, or drop resume=true to start afresh."
    )
