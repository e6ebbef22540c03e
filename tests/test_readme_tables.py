"""The README's measured table is the script's output, and a drifted verdict fails a test.

`scripts/readme_tables.py` reruns `python -m zkl.cert cert.ablate=true` and rewrites the
table; the numbers vary by machine, the verdicts per fix are the claim.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from zkl.invariance import FIXES

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location(
    "readme_tables", REPO / "scripts" / "readme_tables.py"
)
tables = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tables)
README = (REPO / "README.md").read_text()


def _results_as_stated() -> list[dict]:
    """cert.jsonl rows that say what the README's table says (numbers made up)."""
    rows = [{"fix": None, "mode": m, "passed": True, "result": "PASS"} for m in ("step0",)]
    for fix, verdict in tables.readme_verdicts(README).items():
        rows.append(
            {"fix": fix, "mode": "step0", "result": verdict, "passed": False}
            | {"train/max_abs_logprob_diff": 0.5 if verdict == "contributes error" else 0.0}
        )
    return rows


def test_the_readme_table_lists_every_fix_with_a_verdict():
    stated = tables.readme_verdicts(README)
    assert list(stated) == list(FIXES)
    assert set(stated.values()) <= {"contributes error", "no effect"}


def test_a_drifted_verdict_is_named():
    results = _results_as_stated()
    assert tables.drift(README, results) == []
    flipped = next(r for r in results if r["fix"] == "refit_exactness")
    flipped["result"] = "no effect"
    assert tables.drift(README, results) == [
        "refit_exactness: README says 'contributes error', measured 'no effect'"
    ]
    results[0]["passed"] = False  # all fixes on not exactly 0: a drift too
    assert any(line.startswith("(all fixes on)") for line in tables.drift(README, results))


def test_rendering_rewrites_only_between_the_markers(tmp_path):
    results = _results_as_stated()
    new = tables.updated(README, results)
    assert tables.readme_verdicts(new) == tables.readme_verdicts(README)
    before, after = README.split(tables.START)[0], README.split(tables.END)[1]
    assert new.startswith(before) and new.endswith(after)
    path = tmp_path / "cert.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in results))
    assert tables.read(path) == results


@pytest.mark.slow
def test_the_measured_verdicts_match_the_readme():
    """Runs the ablation on this machine (about 25 s on 2 cores)."""
    assert tables.drift(README, tables.measure()) == []
