"""A dedicated run listens on no address beyond loopback (its rendezvous is a FileStore)."""

from __future__ import annotations

import ipaddress
import os
import signal
from pathlib import Path

import pytest
import torch.distributed as dist

from tests.test_faults import generation_child, start, wait_for_step


def listening(pid: int) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket of `pid` in the LISTEN state (IPv4 and IPv6)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    out = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A" or fields[9] not in inodes:  # 0A: LISTEN
                continue
            address, port = fields[1].split(":")
            raw = bytes.fromhex(address)  # 32-bit words in host (little-endian) order
            raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
            out.append((str(ipaddress.ip_address(raw)), int(port, 16)))
    return out


def beyond_loopback(sockets: list[tuple[str, int]]) -> list[tuple[str, int]]:
    def loopback(address: str) -> bool:
        ip = ipaddress.ip_address(address)
        mapped = getattr(ip, "ipv4_mapped", None)
        return (mapped or ip).is_loopback

    return [s for s in sockets if not loopback(s[0])]


def test_the_reader_sees_a_tcpstore_listen_on_every_interface():
    """The old rendezvous: a TCPStore given 127.0.0.1 still binds the wildcard address."""
    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False)
    try:
        wide = beyond_loopback(listening(os.getpid()))
        assert any(port == store.port for _, port in wide), listening(os.getpid())
    finally:
        del store


@pytest.mark.slow
def test_a_dedicated_run_listens_on_loopback_only(tmp_path):
    run_dir = tmp_path / "run"
    proc = start(["+layout=dedicated", "rl.steps=500"], run_dir)
    try:
        child = generation_child(proc.pid)
        wait_for_step(proc, run_dir)  # the rendezvous is done and the group in use
        for pid in (proc.pid, child):
            assert beyond_loopback(listening(pid)) == [], (pid, listening(pid))
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.communicate(timeout=120)
