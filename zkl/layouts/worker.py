"""The dedicated generation process's loop: build the scheduler, then serve the trainer's
requests (refit, configure, generate) until it says stop.

A refit swaps weights in only once the whole buffer has arrived and matches the manifest,
so the scheduler never holds a mix of two versions; the refit's version goes back with its ack.
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from multiprocessing.connection import Connection

import torch

from zkl import invariance
from zkl.device import generator_device
from zkl.generation.scheduler import Scheduler
from zkl.layouts import transport
from zkl.layouts.generator_setup import build_generation_model, build_scheduler
from zkl.layouts.refit import load_refit
from zkl.layouts.wire import Manifest, unpack


def serve(
    conn: Connection,
    cfg,
    fixes: frozenset[str],
    eos_id: int,
    store: str,
    threads: int,
    private: bool,
) -> None:
    """The child's body (`Supervisor` has set its signals and stderr): answer until stop."""
    try:
        torch.set_num_threads(threads)
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))
        conn.send(("alive",))
        own = generator_device(cfg)
        if own.type == "cuda":
            torch.cuda.set_device(own)
        if transport.kind(cfg) in transport.BROADCAST:
            transport.init_group(cfg, store, 1, private)
        with invariance.enabled(fixes):
            scheduler = build_scheduler(cfg, build_generation_model(cfg), eos_id)
            conn.send(("ready",))
            while (msg := conn.recv())[0] != "stop":
                if msg[0] == "refit":
                    _, version, manifest, payload = msg
                    refit(scheduler, cfg, manifest, payload)
                    scheduler.on_refit(version)
                    conn.send(("refitted", version))
                elif msg[0] == "configure":
                    scheduler.configure(*msg[1:])
                    conn.send(("configured",))
                elif msg[0] == "generate":
                    completions = scheduler.generate(msg[1])
                    conn.send(("completions", completions, scheduler.stats))
    except EOFError:  # the trainer is gone: nothing to report to
        sys.exit(1)
    except Exception as err:
        traceback.print_exc()
        with contextlib.suppress(OSError):
            conn.send(("error", f"{type(err).__name__}: {err}".splitlines()[0][:300]))
        sys.exit(1)
    finally:
        transport.abort_group(private)


def refit(scheduler: Scheduler, cfg, manifest: Manifest, payload) -> None:
    """Load one refit: `payload` is the trainer's buffer itself (cuda_ipc) or its size in
    bytes, to be received by broadcast; the copy is done before this returns."""
    if isinstance(payload, torch.Tensor):
        flat = payload
    else:
        flat = torch.empty(payload, dtype=torch.uint8, device=transport.landing_device(cfg, 1))
        transport.broadcast(flat)
    load_refit(scheduler.model, unpack(manifest, flat))
    if flat.is_cuda:  # the trainer may free its buffer once we ack
        torch.cuda.current_stream(flat.device).synchronize()
