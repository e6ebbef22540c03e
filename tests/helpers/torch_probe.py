"""Run an entry point (`python tests/helpers/torch_probe.py zkl.cert ARGS`) as `python -m`
would and, as the process exits, print on stdout whether torch was imported: a refusal of the
check phase (the command line, the keys, the files the config names) leaves it unloaded."""

from __future__ import annotations

import atexit
import runpy
import sys

MARK = "torch_probe: torch imported="


def _report() -> None:
    sys.stdout.write(f"{MARK}{'torch' in sys.modules}\n")
    sys.stdout.flush()


if __name__ == "__main__":
    atexit.register(_report)
    module = sys.argv.pop(1)
    runpy.run_module(module, run_name="__main__", alter_sys=True)
