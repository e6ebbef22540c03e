"""Dedicated: the generator is a separate process; weights go over torch.distributed.

Requests, results and refit manifests travel over a pipe; the weights themselves travel as
one flat byte buffer broadcast from the trainer (rank 0) to the generator (rank 1), so the
copy is bitwise whatever the dtype. The generator only swaps weights in after the whole
buffer has arrived and matches the manifest: it never holds a mix of two versions.
"""

from __future__ import annotations

import os
import signal
import socket
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from zkl import invariance
from zkl.checkpoint import preempt_signal
from zkl.generation.engine import Completion, EngineStats, Request
from zkl.layouts import build_engine, build_generation_model, load_refit, refit_payload
from zkl.precision import DTYPES

_DTYPES = {str(d): d for d in (torch.float32, torch.bfloat16, torch.float16, torch.int64)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pack(state: dict[str, torch.Tensor]) -> tuple[list[tuple[str, str, list[int]]], torch.Tensor]:
    """A manifest (name, dtype, shape) and the tensors' raw bytes in one uint8 buffer."""
    manifest = [(name, str(t.dtype), list(t.shape)) for name, t in state.items()]
    flat = torch.cat(
        [t.detach().contiguous().reshape(-1).view(torch.uint8) for t in state.values()]
    )
    return manifest, flat


def unpack(manifest, flat: torch.Tensor) -> dict[str, torch.Tensor]:
    out, offset = {}, 0
    for name, dtype, shape in manifest:
        dt = _DTYPES[dtype]
        numel = 1
        for s in shape:
            numel *= s
        nbytes = numel * dt.itemsize
        out[name] = flat[offset : offset + nbytes].view(dt).reshape(shape)
        offset += nbytes
    if offset != flat.numel():
        raise RuntimeError(f"refit buffer has {flat.numel()} bytes, the manifest {offset}")
    return out


class DedicatedGenerator:
    def __init__(self, cfg, eos_id: int):
        self.gen_dtype = DTYPES[cfg.precision.compute_dtype]
        self.timeout = cfg.layout.timeout_s
        port = _free_port()
        ctx = mp.get_context("spawn")
        self.conn, child_conn = ctx.Pipe()
        threads = torch.get_num_threads()
        args = (cfg, invariance.active(), eos_id, port, child_conn, threads)
        self.proc = ctx.Process(target=_worker, args=args, daemon=True)
        self.proc.start()
        self._expect("alive")  # a child that dies at start-up fails here, not at rendezvous
        dist.init_process_group(
            cfg.layout.backend,
            init_method=f"tcp://127.0.0.1:{port}",
            rank=0,
            world_size=2,
            timeout=timedelta(seconds=self.timeout),
        )
        self._expect("ready")

    def _expect(self, kind: str):
        if not self.conn.poll(self.timeout):
            raise RuntimeError(f"the generation process sent nothing for {self.timeout}s")
        try:
            msg = self.conn.recv()
        except EOFError:
            raise RuntimeError("the generation process exited unexpectedly") from None
        if msg[0] == "error":
            raise RuntimeError(f"the generation process failed:\n{msg[1]}")
        assert msg[0] == kind, msg[0]
        return msg[1:]

    def generate(self, requests: list[Request]) -> tuple[list[Completion], EngineStats]:
        self.conn.send(("generate", requests))
        completions, stats = self._expect("completions")
        return completions, stats

    def refit(self, state: dict[str, torch.Tensor], version: int) -> None:
        manifest, flat = pack(refit_payload(state, self.gen_dtype))
        self.conn.send(("refit", version, manifest, flat.numel()))
        dist.broadcast(flat, src=0)
        (got,) = self._expect("refitted")
        assert got == version

    def configure(self, max_batch_size: int | None, prefill_chunk: int | None) -> None:
        self.conn.send(("configure", max_batch_size, prefill_chunk))
        self._expect("configured")

    def close(self) -> None:
        if self.proc.is_alive():
            self.conn.send(("stop",))
            self.proc.join(timeout=30)
        if self.proc.is_alive():
            self.proc.kill()
        if dist.is_initialized():
            dist.destroy_process_group()


def _worker(cfg, fixes, eos_id: int, port: int, conn, threads: int) -> None:
    """The generation process: build the engine, then serve refit / generate until stop."""
    try:
        for sig in (signal.SIGTERM, preempt_signal()):  # the trainer stops us at a step boundary
            signal.signal(sig, signal.SIG_IGN)
        torch.set_num_threads(threads)
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))
        conn.send(("alive",))
        dist.init_process_group(
            cfg.layout.backend,
            init_method=f"tcp://127.0.0.1:{port}",
            rank=1,
            world_size=2,
            timeout=timedelta(seconds=cfg.layout.timeout_s),
        )
        with invariance.enabled(fixes):
            engine = build_engine(cfg, build_generation_model(cfg), eos_id)
            conn.send(("ready",))
            while True:
                msg = conn.recv()
                if msg[0] == "stop":
                    break
                if msg[0] == "refit":
                    _, version, manifest, nbytes = msg
                    flat = torch.empty(nbytes, dtype=torch.uint8)
                    dist.broadcast(flat, src=0)
                    load_refit(engine.model, unpack(manifest, flat))
                    engine.on_refit(version)
                    conn.send(("refitted", version))
                elif msg[0] == "configure":
                    engine.configure(*msg[1:])
                    conn.send(("configured",))
                elif msg[0] == "generate":
                    completions = engine.generate(msg[1])
                    conn.send(("completions", completions, engine.stats))
    except Exception:
        conn.send(("error", traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
