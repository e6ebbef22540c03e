"""Dedicated: the generator is a separate process with its own copy of the weights.

Requests, results and refit manifests travel over a pipe; the weights themselves travel as
one flat byte buffer, so the copy is bitwise whatever the dtype. On the CPU (`gloo`) the
buffer is broadcast from the trainer (rank 0) to the generator (rank 1); on one GPU
(`cuda_ipc`) the trainer packs it in device memory and hands the generator a CUDA IPC
handle to it, so the generator copies device to device with no host round trip; with the
generator on a GPU of its own (`nccl`) the buffer is broadcast GPU to GPU over NCCL. The
generator only swaps weights in after the whole buffer has arrived and matches the
manifest: it never holds a mix of two versions, and the refit's version comes back with
its ack.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from datetime import timedelta
from multiprocessing.connection import wait
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from zkl import invariance
from zkl.checkpoint import preempt_signal
from zkl.device import generator_device, resolve_device
from zkl.distributed.loopback import loopback_only
from zkl.errors import RunFault
from zkl.generation.engine import Completion, EngineStats, Request
from zkl.layouts import build_engine, build_generation_model, load_refit, refit_payload
from zkl.precision import DTYPES

STDERR_FILE = "generator_stderr.log"
_DTYPES = {str(d): d for d in (torch.float32, torch.bfloat16, torch.float16, torch.int64)}


def _rendezvous_file() -> str:
    """A fresh file for the two ranks' FileStore, in a directory only this user can enter.

    torch's TCPStore binds every interface whatever host it is given, and has no
    authentication: on a shared node anyone could reach it for the run's whole lifetime. A
    FileStore opens no socket. Local temporary storage, not the run directory: a FileStore
    locks its file, which network file systems do unreliably.
    """
    return os.path.join(tempfile.mkdtemp(prefix="zkl-rendezvous-"), "store")


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


BROADCAST = ("gloo", "nccl")  # the transports that move the buffer with torch.distributed


def transport(cfg) -> str:
    """`layout.backend` with `auto` resolved: gloo on the CPU, cuda_ipc on a GPU."""
    if cfg.layout.backend != "auto":
        return cfg.layout.backend
    return "cuda_ipc" if resolve_device(cfg.device).type == "cuda" else "gloo"


_PRIVATE: list = []  # a sharded trainer's refit group: its default group is its ranks'


def _init_private_group(cfg, store_file: str, rank: int) -> None:
    """The two-rank gloo group of one trainer rank and its generator, outside the default
    group (which, in a sharded trainer, holds the trainer's ranks); a FileStore, no socket."""
    timeout = timedelta(seconds=cfg.layout.timeout_s)
    loopback_only()
    store = dist.FileStore(store_file, 2)
    _PRIVATE[:] = [store, dist.ProcessGroupGloo(store, rank, 2, timeout)]


def _broadcast(flat: torch.Tensor) -> None:
    """Rank 0's `flat` into the other's: over the private group when there is one."""
    if _PRIVATE:
        _PRIVATE[1].broadcast(flat, 0).wait()
    else:
        dist.broadcast(flat, src=0)


def _init_group(cfg, store_file: str, rank: int, private: bool = False) -> None:
    """The two-rank group of a broadcast transport; rank 0 the trainer, rank 1 the generator."""
    if private:
        return _init_private_group(cfg, store_file, rank)
    kind = transport(cfg)
    device = resolve_device(cfg.device) if rank == 0 else generator_device(cfg)
    if kind == "nccl":
        torch.cuda.set_device(device)
    loopback_only()
    dist.init_process_group(
        kind,
        store=dist.FileStore(store_file, 2),
        rank=rank,
        world_size=2,
        timeout=timedelta(seconds=cfg.layout.timeout_s),
        device_id=device if kind == "nccl" else None,
    )


def _abort_group(private: bool = False) -> None:
    """Tear the group down; NCCL's is aborted, so a peer that is gone cannot hang it."""
    if private:
        _PRIVATE.clear()
        return
    if not dist.is_initialized():
        return
    if dist.get_backend() == "nccl":
        with contextlib.suppress(Exception):
            dist.distributed_c10d._abort_process_group()
            return
    dist.destroy_process_group()


class DedicatedGenerator:
    """The trainer's handle on the generation process; a dead child is reported in seconds.

    Every wait watches the child's sentinel as well as the pipe (the parent closes its copy
    of the child's end, so the child's death closes the pipe), and the rendezvous runs in a
    thread the parent watches; the child's stderr goes to `generator_stderr.log` in the run
    directory and its exit code or signal is the one sentence the trainer fails with.
    """

    def __init__(self, cfg, eos_id: int, run_dir: str | Path | None = None, rank: int = 0):
        # a sharded trainer's rank keeps the default group for its ranks, and each rank's
        # generator writes its own stderr file
        self.private = dist.is_initialized()
        self.gen_dtype = DTYPES[cfg.precision.compute_dtype]
        self.device = resolve_device(cfg.device)
        self.timeout = cfg.layout.timeout_s
        self.transport = transport(cfg)
        name = STDERR_FILE if rank == 0 else STDERR_FILE.replace(".log", f".rank{rank}.log")
        self.stderr_path = Path(run_dir) / name if run_dir is not None else None
        self.store_file = _rendezvous_file()
        ctx = mp.get_context("spawn")
        self.conn, child_conn = ctx.Pipe()
        threads = torch.get_num_threads()
        stderr = str(self.stderr_path) if self.stderr_path else None
        args = (cfg, invariance.active(), eos_id, self.store_file, child_conn, threads, stderr)
        args += (True,) if self.private else ()
        self.proc = ctx.Process(target=_worker, args=args, daemon=True)
        self._busy = True  # a request is out: close() kills instead of asking to stop
        with _sigint_ignored():  # the child starts with Ctrl-C ignored: the parent stops it
            self.proc.start()
        child_conn.close()  # the child's death now closes the pipe
        try:
            self._expect("alive")
            if self.transport in BROADCAST:
                self._watch(
                    "the rendezvous with",
                    lambda: _init_group(cfg, self.store_file, 0, self.private),
                )
            self._expect("ready")
        except BaseException:
            self.close()  # nobody else holds this half-built generator
            raise

    def _died(self) -> RunFault:
        """The sentence for a child that is gone (or, if alive, stopped answering)."""
        self.proc.join(timeout=5)
        code = self.proc.exitcode
        if code is None:
            what = f"stopped answering for {self.timeout:g}s (layout.timeout_s)"
        elif code < 0:
            what = f"was killed by signal {signal.Signals(-code).name}"
        else:
            what = f"died with exit code {code}"
        return RunFault(f"the generation process {what}{self._stderr_tail()}.")

    def _stderr_tail(self, last_line: bool = True) -> str:
        if self.stderr_path is None or not self.stderr_path.exists():
            return ""
        lines = [x for x in self.stderr_path.read_text(errors="replace").splitlines() if x.strip()]
        last = f" (last: {lines[-1].strip()[:200]})" if lines and last_line else ""
        return f"; its stderr is in {self.stderr_path}{last}"

    def _watch(self, what: str, blocking) -> None:
        """Run a blocking collective in a thread; fail as soon as the child is gone."""
        errors: list[BaseException] = []

        def target():
            try:
                blocking()
            except BaseException as err:  # handed to the caller's thread
                errors.append(err)

        thread = threading.Thread(target=target, daemon=True)
        thread.start()
        while thread.is_alive():
            thread.join(0.05)
            if not self.proc.is_alive():
                raise self._died()
        if errors:
            self.proc.join(timeout=1)
            if not self.proc.is_alive():
                raise self._died()
            first = (str(errors[0]).strip().splitlines() or [""])[0][:300]
            raise RunFault(
                f"{what} the generation process failed ({type(errors[0]).__name__}: {first})."
            )

    def _send(self, msg) -> None:
        self._busy = True
        try:
            self.conn.send(msg)
        except OSError:  # BrokenPipeError, ConnectionResetError: the child is gone
            raise self._died() from None

    def _expect(self, kind: str):
        ready = wait([self.conn, self.proc.sentinel], self.timeout)
        if not ready:
            raise self._died()
        try:
            msg = self.conn.recv() if self.conn in ready or self.conn.poll() else None
        except (EOFError, OSError):
            msg = None
        if msg is None:
            raise self._died()
        if msg[0] == "error":
            self.proc.join(timeout=5)
            tail = self._stderr_tail(last_line=False)
            raise RunFault(f"the generation process failed with {msg[1]}{tail}.")
        assert msg[0] == kind, msg[0]
        self._busy = False
        return msg[1:]

    def generate(self, requests: list[Request]) -> tuple[list[Completion], EngineStats]:
        self._send(("generate", requests))
        completions, stats = self._expect("completions")
        return completions, stats

    def refit(self, state: dict[str, torch.Tensor], version: int) -> None:
        manifest, flat = pack(refit_payload(state, self.gen_dtype))
        if self.transport == "cuda_ipc":  # the pipe carries an IPC handle to `flat`
            torch.cuda.current_stream(flat.device).synchronize()
            self._send(("refit", version, manifest, flat))
        else:
            self._send(("refit", version, manifest, flat.numel()))
            self._watch("the weight transfer to", lambda: _broadcast(flat))
        (got,) = self._expect("refitted")  # `flat` stays alive until the copy is done
        if got != version:
            raise RunFault(f"the generation process acknowledged version {got}, not {version}.")

    def probe(self, nbytes: int, repeats: int = 5) -> float:
        """The transport's own bandwidth in GB/s: `repeats` broadcasts of `nbytes` bytes
        from the trainer's device to the generator's, as a refit moves them, acked at the end
        (the peak a refit's GB/s is compared against)."""
        if self.transport not in BROADCAST:
            raise ValueError(f"probe measures a broadcast transport, not {self.transport}")
        device = self.device if self.transport == "nccl" else torch.device("cpu")
        flat = torch.empty(nbytes, dtype=torch.uint8, device=device)
        self._send(("probe", nbytes, repeats))
        self._expect("probing")
        t0 = time.perf_counter()
        for _ in range(repeats):
            self._watch("the bandwidth probe with", lambda: _broadcast(flat))
        self._expect("probed")
        return nbytes * repeats / (time.perf_counter() - t0) / 1e9

    def configure(self, max_batch_size: int | None, prefill_chunk: int | None) -> None:
        self._send(("configure", max_batch_size, prefill_chunk))
        self._expect("configured")

    def close(self) -> None:
        """Stop the child: politely when it is idle, at once when it is busy or interrupted."""
        if self.proc.is_alive() and not self._busy:
            with contextlib.suppress(OSError):
                self.conn.send(("stop",))
                self.proc.join(timeout=30)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(timeout=5)
        self.conn.close()
        _abort_group(self.private)
        shutil.rmtree(os.path.dirname(self.store_file), ignore_errors=True)


@contextlib.contextmanager
def _sigint_ignored():
    """SIGINT ignored while a child starts (it inherits the disposition); main thread only."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


def _worker(
    cfg,
    fixes,
    eos_id: int,
    store: str,
    conn,
    threads: int,
    stderr: str | None,
    private: bool = False,
) -> None:
    """The generation process: build the engine, then serve refit / generate until stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle
    if stderr is not None:
        fd = os.open(stderr, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 2)
        os.close(fd)
    faulthandler.enable()  # a crash in native code leaves its stack in the stderr file
    try:
        for sig in (signal.SIGTERM, preempt_signal()):  # the trainer stops us at a step boundary
            signal.signal(sig, signal.SIG_IGN)
        torch.set_num_threads(threads)
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))
        conn.send(("alive",))
        kind, own = transport(cfg), generator_device(cfg)
        if own.type == "cuda":
            torch.cuda.set_device(own)
        device = own if kind == "nccl" else torch.device("cpu")  # where broadcasts land
        if kind in BROADCAST:
            _init_group(cfg, store, 1, private)
        with invariance.enabled(fixes):
            engine = build_engine(cfg, build_generation_model(cfg), eos_id)
            conn.send(("ready",))
            while True:
                msg = conn.recv()
                if msg[0] == "stop":
                    break
                if msg[0] == "refit":
                    _, version, manifest, payload = msg
                    if isinstance(payload, torch.Tensor):  # cuda_ipc: the trainer's buffer
                        flat = payload
                    else:
                        flat = torch.empty(payload, dtype=torch.uint8, device=device)
                        _broadcast(flat)
                    load_refit(engine.model, unpack(manifest, flat))
                    if flat.is_cuda:
                        torch.cuda.current_stream(flat.device).synchronize()
                    del flat, payload
                    engine.on_refit(version)
                    conn.send(("refitted", version))
                elif msg[0] == "probe":
                    _, nbytes, repeats = msg
                    flat = torch.empty(nbytes, dtype=torch.uint8, device=device)
                    conn.send(("probing",))
                    for _ in range(repeats):
                        _broadcast(flat)
                    if flat.is_cuda:
                        torch.cuda.current_stream(flat.device).synchronize()
                    del flat
                    conn.send(("probed",))
                elif msg[0] == "configure":
                    engine.configure(*msg[1:])
                    conn.send(("configured",))
                elif msg[0] == "generate":
                    completions = engine.generate(msg[1])
                    conn.send(("completions", completions, engine.stats))
    except EOFError:  # the trainer is gone: nothing to report to
        sys.exit(1)
    except Exception as err:
        traceback.print_exc()
        with contextlib.suppress(OSError):
            conn.send(("error", f"{type(err).__name__}: {err}".splitlines()[0][:300]))
        sys.exit(1)
    finally:
        _abort_group(private)
