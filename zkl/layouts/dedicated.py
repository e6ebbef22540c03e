"""Dedicated: the generator is a separate process with its own copy of the weights.

Requests, results and refit manifests travel over the `Supervisor`'s pipe to the `worker`;
the weights travel as one flat buffer in the `wire` format over the configured `transport`
(gloo on the CPU, CUDA IPC on one GPU, NCCL to a GPU of the generator's own). A dead child
is reported in seconds, with its stderr kept in `generator_stderr.log` in the run directory.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch
import torch.distributed as dist

from zkl import invariance
from zkl.errors import RunFault
from zkl.generation.scheduler import Completion, Request, SchedulerStats
from zkl.layouts import transport, worker
from zkl.layouts.refit import refit_payload
from zkl.layouts.supervisor import Supervisor
from zkl.layouts.wire import pack
from zkl.precision.recipes import DTYPES

STDERR_FILE = "generator_stderr.log"


class DedicatedGenerator:
    """The trainer's handle on the generation process (rank 0 of the refit transport)."""

    def __init__(self, cfg, eos_id: int, run_dir: str | Path | None = None, rank: int = 0):
        # a sharded trainer's rank keeps the default group for its ranks, and each rank's
        # generator writes its own stderr file
        self.private = dist.is_initialized()
        self.gen_dtype = DTYPES[cfg.precision.compute_dtype]
        self.transport = transport.kind(cfg)
        name = STDERR_FILE if rank == 0 else STDERR_FILE.replace(".log", f".rank{rank}.log")
        stderr_path = Path(run_dir) / name if run_dir is not None else None
        self.store_file = transport.rendezvous_file()
        fixes = invariance.active()
        args = (cfg, fixes, eos_id, self.store_file, torch.get_num_threads(), self.private)
        # `worker.serve` is read at each start: a fault test swaps in a worker that dies
        self.child = Supervisor(worker.serve, args, cfg.layout.timeout_s, stderr_path)
        try:
            self.child.expect("alive")
            if self.transport in transport.BROADCAST:
                self.child.watch(
                    "the rendezvous with",
                    lambda: transport.init_group(cfg, self.store_file, 0, self.private),
                )
            self.child.expect("ready")
        except BaseException:
            self.close()  # nobody else holds this half-built generator
            raise

    def generate(self, requests: list[Request]) -> tuple[list[Completion], SchedulerStats]:
        self.child.send(("generate", requests))
        completions, stats = self.child.expect("completions")
        return completions, stats

    def refit(self, state: dict[str, torch.Tensor], version: int) -> None:
        manifest, flat = pack(refit_payload(state, self.gen_dtype))
        if self.transport == "cuda_ipc":  # the pipe carries an IPC handle to `flat`
            torch.cuda.current_stream(flat.device).synchronize()
            self.child.send(("refit", version, manifest, flat))
        else:
            self.child.send(("refit", version, manifest, flat.numel()))
            self.child.watch("the weight transfer to", lambda: transport.broadcast(flat))
        (got,) = self.child.expect("refitted")  # `flat` stays alive until the copy is done
        if got != version:
            raise RunFault(f"the generation process acknowledged version {got}, not {version}.")

    def configure(self, max_batch_size: int | None, prefill_chunk: int | None) -> None:
        self.child.send(("configure", max_batch_size, prefill_chunk))
        self.child.expect("configured")

    def close(self) -> None:
        """Stop the child (politely when idle), tear the transport down, remove its store."""
        self.child.stop()
        transport.abort_group(self.private)
        shutil.rmtree(os.path.dirname(self.store_file), ignore_errors=True)
