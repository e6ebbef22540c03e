"""The refit transport's own bandwidth: bare broadcasts of a refit-sized buffer from the
trainer's device to the generator's, between this process and a peer it spawns (the peak a
refit's GB/s is compared against in `python -m zkl.bench +layout=dedicated`)."""

from __future__ import annotations

import os
import shutil
import time

import torch
import torch.distributed as dist

from zkl.layouts import transport
from zkl.layouts.supervisor import Supervisor


def peak_gb_per_s(cfg, nbytes: int, repeats: int) -> float:
    """GB/s of `repeats` broadcasts of `nbytes` bytes, after one warm-up, acked at the end.

    Run while no generator holds the transport (its group is this process's default one).
    """
    kind = transport.kind(cfg)
    if kind not in transport.BROADCAST:
        raise ValueError(f"the peak is measured on a broadcast transport, not {kind}")
    private = dist.is_initialized()  # a sharded trainer's ranks hold the default group
    store_file = transport.rendezvous_file()
    args = (cfg, store_file, nbytes, repeats, private)
    peer = Supervisor(_receive, args, cfg.layout.timeout_s, None, "the bandwidth peer")
    try:
        peer.expect("alive")
        peer.watch("the rendezvous with", lambda: transport.init_group(cfg, store_file, 0, private))
        flat = torch.empty(nbytes, dtype=torch.uint8, device=transport.landing_device(cfg, 0))
        peer.watch("the warm-up broadcast to", lambda: transport.broadcast(flat))
        peer.expect("warm")
        t0 = time.perf_counter()
        for _ in range(repeats):
            peer.watch("a broadcast to", lambda: transport.broadcast(flat))
        peer.expect("received")
        seconds = time.perf_counter() - t0
    finally:
        peer.stop()
        transport.abort_group(private)
        shutil.rmtree(os.path.dirname(store_file), ignore_errors=True)
    return nbytes * repeats / seconds / 1e9


def _receive(conn, cfg, store_file: str, nbytes: int, repeats: int, private: bool) -> None:
    """The peer: rank 1 of the transport, on the generator's device; acks once all arrived."""
    try:
        conn.send(("alive",))
        device = transport.landing_device(cfg, 1)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        transport.init_group(cfg, store_file, 1, private)
        flat = torch.empty(nbytes, dtype=torch.uint8, device=device)
        for count, ack in ((1, "warm"), (repeats, "received")):
            for _ in range(count):
                transport.broadcast(flat)
            if flat.is_cuda:
                torch.cuda.current_stream(flat.device).synchronize()
            conn.send((ack,))
        conn.recv()  # ("stop",)
    finally:
        transport.abort_group(private)
