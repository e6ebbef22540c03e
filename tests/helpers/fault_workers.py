"""Parts that fail on purpose, for the fault tests.

Generation workers that die: `python tests/helpers/fault_workers.py MODE RUN_DIR` builds a
DedicatedGenerator whose child runs one of these instead of `zkl.layouts.worker.serve` (spawn
imports them from here by name), and prints the one-line fault the trainer gets and how long
it took. A task whose reward stalls mid-step (`task._target_=fault_workers:StallingAddTask`,
with tests/helpers/ on PYTHONPATH), so a signal surely arrives while a step is in flight.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from zkl.data.tasks import AddTask


class StallingAddTask(AddTask):
    """The add task (the same rewards), whose reward call number `task.params.stall_at`
    (counted from 0 in this process) writes the file `task.params.marker` and sleeps until a
    signal's handler raises (a second Ctrl-C). It stalls only while the marker is absent, so a
    resumed run goes through."""

    def __init__(self, cfg, vocab_size: int):
        super().__init__(cfg.max_operand)
        self.stall_at = int(cfg.params["stall_at"])
        self.marker = Path(cfg.params["marker"])
        self.calls = 0

    def reward(self, problem, response: list[int]) -> float:
        if self.calls == self.stall_at and not self.marker.exists():
            self.marker.write_text(f"{os.getpid()}\n")
            time.sleep(600)
        self.calls += 1
        return super().reward(problem, response)


def exit_during_rendezvous(conn, cfg, fixes, eos_id, store, threads, private) -> None:
    """Say alive, then die before joining the process group (the trainer is in the rendezvous)."""
    print("fault_workers: exiting during the rendezvous", file=sys.stderr, flush=True)
    conn.send(("alive",))
    time.sleep(0.5)
    os._exit(3)


def main(mode: str, run_dir: str) -> None:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import fault_workers

    from tests.conftest import make_cfg
    from zkl.errors import RunFault
    from zkl.layouts import dedicated, worker

    worker.serve = getattr(fault_workers, mode)
    os.makedirs(run_dir, exist_ok=True)
    cfg = make_cfg("+layout=dedicated")
    start = time.perf_counter()
    try:
        dedicated.DedicatedGenerator(cfg, eos_id=1, run_dir=run_dir).close()
    except RunFault as err:
        print(f"{time.perf_counter() - start:.2f} {err}")
        os._exit(0)  # the trainer's rendezvous thread is still waiting: do not join it
    print("no fault")


if __name__ == "__main__":
    main(*sys.argv[1:])
