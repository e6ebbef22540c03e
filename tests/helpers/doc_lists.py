"""What the docs' "Adding ..." sections and tables say, read for the tests that hold them to
the code (tests/test_engines.py, tests/models/test_families.py)."""

from __future__ import annotations

import re
from pathlib import Path


def adding_steps(doc: Path, heading: str) -> list[str]:
    """The numbered steps under `## heading` (continuation lines joined)."""
    section = doc.read_text().split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    steps: list[str] = []
    for line in section.splitlines():
        if re.match(r"\d+\. ", line):
            steps.append(line.split(". ", 1)[1])
        elif steps and line.startswith("   "):
            steps[-1] += " " + line.strip()
    return steps


def step_places(steps: list[str]) -> list[str]:
    """The place each step names first (its first backquoted word)."""
    return [re.match(r"`([^`]+)`", step).group(1) for step in steps]


def table_rows(doc: Path) -> dict[str, list[str]]:
    """The doc's table rows by their first cell (`| `name` | ...`): the other cells."""
    rows = re.findall(r"^\| `(\w+)` \|(.*)\|$", doc.read_text(), flags=re.M)
    return {name: [cell.strip() for cell in rest.split("|")] for name, rest in rows}
