"""`python -m zkl.cert`: certify the config bitwise (`zkl.cert.certificate` says how).

`--help`, a refused command line and each part's keys and input files (`zkl.run.checks`)
answer before the certification (and torch) loads.
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from zkl.cert.config import check_cert
from zkl.cert.schema import CertRunConfig
from zkl.cli import check_command_line, job, run_hydra
from zkl.run.checks import check_composed
from zkl.run.schema import CONF_DIR


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base=None)
def main(dcfg: DictConfig) -> None:
    job("zkl.cert", lambda: certify(dcfg))


def certify(dcfg: DictConfig) -> int:
    """The exit code of certifying the job's config: 0 when every bed is exactly zero."""
    check_cert(check_composed(dcfg).cert)  # each part's keys and files, before torch loads
    # lazy: torch and the certification load once the config has passed its checks
    from zkl.cert.certificate import certify_all

    return certify_all(dcfg)


if __name__ == "__main__":
    check_command_line("zkl.cert", CertRunConfig)
    if "--list-fixes" in sys.argv[1:]:
        # lazy: the fixes' registry is printed without running Hydra
        from zkl.cert.certificate import list_fixes

        print(list_fixes())
        sys.exit(0)
    if not any(arg.startswith("hydra.job.name=") for arg in sys.argv[1:]):
        sys.argv.append("hydra.job.name=cert")  # Hydra would name the job (and its log) __main__
    run_hydra("zkl.cert", main, CertRunConfig)
