"""`python -m zkl`: one experiment (GRPO steps, per-step metrics) from the Hydra config."""

from __future__ import annotations

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from zkl.cli import guarded, hydra_entry
from zkl.rl.loop import run
from zkl.rl.summary import summary_line
from zkl.run.compose import to_object
from zkl.run.schema import CONF_DIR
from zkl.state import run_lock
from zkl.tracking.errors import clear_error, record_error


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base=None)
def main(dcfg: DictConfig) -> None:
    guarded("zkl", lambda: experiment(dcfg))


def experiment(dcfg: DictConfig) -> None:
    run_dir = HydraConfig.get().runtime.output_dir
    if not run_lock.in_use(run_dir):  # a live run's error.txt is its own; run() refuses
        clear_error(run_dir)
    try:
        rows = run(to_object(dcfg), run_dir)
    except Exception as err:  # a sweep job's sentence goes to error.txt for the report
        in_use = isinstance(err, run_lock.RunDirInUse)  # error.txt is the holder's
        if HydraConfig.get().mode == RunMode.MULTIRUN and not in_use:
            record_error(run_dir, err)
        raise
    print(summary_line(rows, run_dir))


if __name__ == "__main__":
    hydra_entry("zkl", main)
