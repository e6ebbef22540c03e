"""The GPU run (`python3 -m pytest -m gpu`) must not hinge on the report's plotting library:
the bare GPU image may lack plotly, and one module that cannot import stops a whole run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_gpu_run_collects_with_plotly_missing(tmp_path):
    (tmp_path / "sitecustomize.py").write_text("import sys\nsys.modules['plotly'] = None\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "gpu", "-p", "no:cacheprovider"],  # noqa: E501
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    out = result.stdout + result.stderr
    assert "error" not in out.lower(), out[-3000:]
    assert result.returncode == 0, out[-3000:]
    assert "tests collected" in out
