"""Lines to stderr stay whole when several processes write it at once (ranks of one run)."""

from __future__ import annotations

import ast
import io
import os
import subprocess
import sys
from pathlib import Path

from zkl import console

REPO = Path(__file__).resolve().parents[1]


class Writes(io.FileIO):
    """A file that records each write(2) it is asked for."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, "w")
        self.calls: list[bytes] = []

    def write(self, data) -> int:
        self.calls.append(bytes(data))
        return super().write(data)


def unbuffered_stderr(path: Path) -> tuple[io.TextIOWrapper, Writes]:
    """sys.stderr as Python makes it under PYTHONUNBUFFERED: each write goes straight down."""
    raw = Writes(path)
    return io.TextIOWrapper(raw, encoding="utf-8", write_through=True), raw


def test_print_splits_a_line_and_say_writes_it_whole(tmp_path, monkeypatch):
    line = "zkl: rank 2 of 3: rank 1 stopped answering; this rank stops."
    stream, raw = unbuffered_stderr(tmp_path / "printed")
    print(line, file=stream, flush=True)
    assert raw.calls == [line.encode(), b"\n"]  # another process can write in between

    stream, raw = unbuffered_stderr(tmp_path / "said")
    monkeypatch.setattr(sys, "stderr", stream)
    console.say(line)
    assert raw.calls == [f"{line}\n".encode()]


def test_processes_saying_at_once_keep_every_line_whole():
    code = (
        "import sys; from zkl.console import say\n"
        "for i in range(300): say(f'process {sys.argv[1]} line {i} ' + 'x' * 200)\n"
    )
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO)}
    read, write = os.pipe()
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(p)], stderr=write, env=env)
        for p in range(4)
    ]
    os.close(write)
    with os.fdopen(read) as pipe:
        lines = pipe.read().splitlines()
    assert all(p.wait() == 0 for p in procs)
    expected = {f"process {p} line {i} " + "x" * 200 for p in range(4) for i in range(300)}
    assert sorted(lines) == sorted(expected)


def stderr_prints(path: Path) -> list[int]:
    """Lines of `path` that print to sys.stderr instead of saying the line whole."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and ast.unparse(node.func) in ("print", "sys.stderr.write"):
            target = {k.arg: ast.unparse(k.value) for k in node.keywords}.get("file")
            if ast.unparse(node.func) == "sys.stderr.write" or target == "sys.stderr":
                found.append(node.lineno)
    return found


def test_every_stderr_line_of_the_package_goes_through_say():
    writers = sorted((REPO / "zkl").rglob("*.py"))
    found = {str(p.relative_to(REPO)): stderr_prints(p) for p in writers if p.name != "console.py"}
    assert {path: lines for path, lines in found.items() if lines} == {}, "use zkl.console.say"
