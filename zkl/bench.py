"""`python -m zkl.bench`: what zero mode costs, side by side (`zkl.lab.bench`).

`--help`, a refused command line and each part's keys and input files (`zkl.run.checks`)
answer before the benchmark (and torch) loads.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from zkl.cli import hydra_entry, job
from zkl.lab.schema import BenchRunConfig
from zkl.run.checks import check_composed
from zkl.run.schema import CONF_DIR


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base=None)
def main(dcfg: DictConfig) -> None:
    job("zkl.bench", lambda: bench(dcfg))


def bench(dcfg: DictConfig) -> None:
    check_composed(dcfg)  # each part's keys and files, before torch loads
    # lazy: torch and the benchmark load once the config has passed its checks
    from zkl.lab.bench import bench as run

    run(dcfg)


if __name__ == "__main__":
    hydra_entry("zkl.bench", main, BenchRunConfig)
