"""Run an entry point (`python tests/helpers/entry_runner.py zkl.cert ARGS`) as `python -m` would,
with every model build announced on stderr, so a test sees whether a refusal came first."""

from __future__ import annotations

import runpy
import sys

import zkl.models.build

MARK = "entry_runner: a model was built"
_build = zkl.models.build.build_model


def _announced_build(*args, **kwargs):
    print(MARK, file=sys.stderr)
    return _build(*args, **kwargs)


if __name__ == "__main__":
    zkl.models.build.build_model = _announced_build
    module = sys.argv.pop(1)
    runpy.run_module(module, run_name="__main__", alter_sys=True)
