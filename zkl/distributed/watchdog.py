"""A heartbeat per rank through the rendezvous store, so no rank hangs on a dead peer.

A collective waits for every rank; a rank that died (killed, out of memory) would hold the
others until the collective's timeout (gloo's and NCCL's are minutes). Each rank's thread
bumps its counter in the store several times a heartbeat and watches everyone else's: a
counter that has not moved for `trainer.heartbeat_s`, or a store that is gone (rank 0 holds
it), is reported by this rank in one line, and the rank exits at once (exit 1), whatever its
main thread waits in. Every step already logged stays logged (metrics.jsonl is flushed at
each step).
"""

from __future__ import annotations

import os
import threading
import time

import torch.distributed as dist

from zkl.console import say

GONE = "zkl/gone"  # the first rank found gone, for every other rank's report


class Watchdog(threading.Thread):
    def __init__(self, world, heartbeat_s: float) -> None:
        super().__init__(name="zkl-heartbeat", daemon=True)
        self.world, self.heartbeat_s = world, heartbeat_s
        self.store = dist.distributed_c10d._get_default_store()
        self._halt = threading.Event()

    def diagnose(self) -> None:
        """After a collective failed: give the heartbeat time to name a rank that is gone
        (it then reports and exits); return when every rank is still beating."""
        self.join(1.5 * self.heartbeat_s + 1)

    def stop(self) -> None:
        self._halt.set()
        self.join(self.heartbeat_s)

    def run(self) -> None:
        me, size = self.world.rank, self.world.size
        peers = [r for r in range(size) if r != me]
        seen = {r: (-1, time.monotonic()) for r in peers}
        while not self._halt.wait(self.heartbeat_s / 10):
            try:
                self.store.add(f"zkl/heartbeat/{me}", 1)
                counts = {r: self.store.add(f"zkl/heartbeat/{r}", 0) for r in peers}
                if self.store.check([GONE]):  # another rank saw one go first
                    gone = int(self.store.get(GONE))
                    self._report(f"rank {gone} stopped answering (trainer.heartbeat_s)")
                    return
            except Exception:
                if self._halt.is_set():
                    return
                self._report("rank 0, which holds the rendezvous store, stopped answering")
                return
            now = time.monotonic()
            for r in peers:
                if counts[r] != seen[r][0]:
                    seen[r] = (counts[r], now)
                elif now - seen[r][1] > self.heartbeat_s:
                    quiet = now - seen[r][1]
                    why = f"no heartbeat for {quiet:.0f} s, trainer.heartbeat_s"
                    self._report(f"rank {r} stopped answering ({why})", gone=r)
                    return

    def _report(self, what: str, gone: int | None = None) -> None:
        if self._halt.is_set():
            return
        me, size = self.world.rank, self.world.size
        say(f"zkl: rank {me} of {size}: {what}; this rank stops.")
        if gone is not None:  # tell the others which rank it was, before the store goes
            try:
                self.store.set(GONE, str(gone))
                if me == 0:  # the store lives in this process: let the others read it
                    time.sleep(self.heartbeat_s / 2)
            except Exception:
                pass
        os._exit(1)
