"""`python -m zkl`: one experiment (GRPO steps, per-step metrics) from the Hydra config.

The command line, then each part's keys and the files the config names (`model.checkpoint`,
a dataset task's) are checked before torch loads (`zkl.cli`, `zkl.run.checks`), so a refused
run answers at once; the loop is imported after that, and starts once the checks that span
parts and the environment have passed (`zkl.run.validate.check_run`).
"""

from __future__ import annotations

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from zkl.cli import hydra_entry, job
from zkl.rl.summary import summary_line
from zkl.run.checks import check_composed
from zkl.run.schema import CONF_DIR


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base=None)
def main(dcfg: DictConfig) -> None:
    job("zkl", lambda: experiment(dcfg))


def experiment(dcfg: DictConfig) -> None:
    run_dir = HydraConfig.get().runtime.output_dir
    check_composed(dcfg)  # each part's keys and files, before torch loads
    # lazy: torch and the loop load once the config has passed its checks (a refusal is quick)
    from zkl.rl.loop import run
    from zkl.run.compose import to_object  # lazy: reads a checkpoint (torch)
    from zkl.run.validate import check_run  # lazy: builds the task, imports the models

    cfg = to_object(dcfg)
    task = check_run(cfg)  # the checks that span parts, and the environment, before any work
    rows = run(cfg, run_dir, task=task)
    print(summary_line(rows, run_dir))


if __name__ == "__main__":
    hydra_entry("zkl", main)
