"""A spawned child process the trainer depends on, watched so that its death is one sentence.

Every wait watches the child's sentinel as well as the pipe (the parent closes its copy of
the child's end, so the child's death closes the pipe), and a blocking collective runs in a
thread the parent watches. The child's stderr goes to a file and its exit code or signal is
the sentence the trainer fails with. The child ignores Ctrl-C, SIGTERM and the preemption
signal: the trainer handles them and stops the child itself.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import threading
from collections.abc import Callable
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

import torch.multiprocessing as mp

from zkl.environment import preempt_signal
from zkl.errors import RunFault


class Supervisor:
    """Runs `target(conn, *args)` in a spawned child and talks to it over `conn`.

    Messages are tuples whose first item names them; the child answers a request with the
    name the parent `expect`s, or with ("error", sentence) and exits.
    """

    def __init__(
        self,
        target: Callable[..., None],
        args: tuple,
        timeout: float,
        stderr_path: Path | None,
        name: str = "the generation process",
    ):
        self.name = name
        self.timeout = timeout
        self.stderr_path = stderr_path
        ctx = mp.get_context("spawn")
        self.conn, child_conn = ctx.Pipe()
        stderr = str(stderr_path) if stderr_path else None
        self.proc = ctx.Process(
            target=_child_main, args=(target, child_conn, stderr, *args), daemon=True
        )
        self.busy = True  # a request is out: stop() kills instead of asking to stop
        with _sigint_ignored():  # the child starts with Ctrl-C ignored: the parent stops it
            self.proc.start()
        child_conn.close()  # the child's death now closes the pipe

    def died(self) -> RunFault:
        """The sentence for a child that is gone (or, if alive, stopped answering)."""
        self.proc.join(timeout=5)
        code = self.proc.exitcode
        if code is None:
            what = f"stopped answering for {self.timeout:g}s (layout.timeout_s)"
        elif code < 0:
            what = f"was killed by signal {signal.Signals(-code).name}"
        else:
            what = f"died with exit code {code}"
        return RunFault(f"{self.name} {what}{self._stderr_tail()}.")

    def _stderr_tail(self, last_line: bool = True) -> str:
        if self.stderr_path is None or not self.stderr_path.exists():
            return ""
        lines = [x for x in self.stderr_path.read_text(errors="replace").splitlines() if x.strip()]
        last = f" (last: {lines[-1].strip()[:200]})" if lines and last_line else ""
        return f"; its stderr is in {self.stderr_path}{last}"

    def watch(self, what: str, blocking: Callable[[], object]) -> None:
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
                raise self.died()
        if errors:
            self.proc.join(timeout=1)
            if not self.proc.is_alive():
                raise self.died()
            first = (str(errors[0]).strip().splitlines() or [""])[0][:300]
            raise RunFault(f"{what} {self.name} failed ({type(errors[0]).__name__}: {first}).")

    def send(self, msg: tuple) -> None:
        self.busy = True
        try:
            self.conn.send(msg)
        except OSError:  # BrokenPipeError, ConnectionResetError: the child is gone
            raise self.died() from None

    def expect(self, kind: str) -> tuple:
        """The rest of the child's next message, which must be `kind`."""
        ready = wait([self.conn, self.proc.sentinel], self.timeout)
        if not ready:
            raise self.died()
        try:
            msg = self.conn.recv() if self.conn in ready or self.conn.poll() else None
        except (EOFError, OSError):
            msg = None
        if msg is None:
            raise self.died()
        if msg[0] == "error":
            self.proc.join(timeout=5)
            tail = self._stderr_tail(last_line=False)
            raise RunFault(f"{self.name} failed with {msg[1]}{tail}.")
        assert msg[0] == kind, msg[0]
        self.busy = False
        return msg[1:]

    def stop(self) -> None:
        """Stop the child: politely when it is idle, at once when it is busy or interrupted."""
        if self.proc.is_alive() and not self.busy:
            with contextlib.suppress(OSError):
                self.conn.send(("stop",))
                self.proc.join(timeout=30)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(timeout=5)
        self.conn.close()


def _child_main(target: Callable[..., None], conn: Any, stderr: str | None, *args: Any) -> None:
    """The child's first steps: the trainer's signals ignored, stderr into its file."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle
    if stderr is not None:
        fd = os.open(stderr, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 2)
        os.close(fd)
    faulthandler.enable()  # a crash in native code leaves its stack in the stderr file
    for sig in (signal.SIGTERM, preempt_signal()):  # the trainer stops us at a step boundary
        signal.signal(sig, signal.SIG_IGN)
    target(conn, *args)


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
