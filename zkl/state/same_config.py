"""When two configs are the same run: every key equal but those a resumed run may change.

One rule for the resume's check against its checkpoint (zkl/state/resume.py) and for the
search of `resume=true` without `hydra.run.dir` (zkl/state/latest_run.py). Torch-free, so
the search answers before torch loads.
"""

from __future__ import annotations

from typing import Any

from zkl.renamed import read_back
from zkl.tracking.run_log import flatten

# Keys a resumed run may change: none of them changes a logged number (the run directory is
# not a key of the config; where the run lives is Hydra's).
MAY_CHANGE = (
    "resume",
    "rl.steps",
    "rl.warn_untrained_after",
    "checkpoint.",
    "tracking.progress",
    "tracking.wandb.",
)


def first_difference(now: dict[str, Any], then: dict[str, Any]) -> tuple[str, Any, Any] | None:
    """The first key (sorted) whose value differs between two nested configs, with its value
    then and now; None when they are the same run. `then`, saved by an older zkl, is read
    under today's key names (`zkl.renamed.read_back`)."""
    flat_now, flat_then = flatten(now), flatten(read_back(then))
    for key in sorted(set(flat_now) | set(flat_then)):
        if key.startswith(MAY_CHANGE) or flat_now.get(key) == flat_then.get(key):
            continue
        return key, flat_then.get(key), flat_now.get(key)
    return None
