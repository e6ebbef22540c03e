"""One line to stderr in one write, so the lines of processes that share it never mix.

`print(msg, file=sys.stderr)` writes the text and its newline as two calls; under
PYTHONUNBUFFERED (set in many containers and CI images) each is its own write(2), and two
ranks reporting at the same moment print "...this rank stops.zkl: rank 0 ..." on one line.
One write of a line shorter than PIPE_BUF (4096 bytes) reaches a pipe whole.
"""

from __future__ import annotations

import sys


def say(line: str) -> None:
    """Write `line` and its newline to stderr in one call, then flush."""
    sys.stderr.write(f"{line}\n")
    sys.stderr.flush()
