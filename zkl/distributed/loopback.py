"""Process groups whose ranks share one host talk over the loopback interface."""

from __future__ import annotations

import os
import socket


def loopback_only() -> None:
    """Gloo's and NCCL's own sockets on the loopback interface: every rank is on this host.

    Gloo binds the address the host name resolves to, NCCL's bootstrap the first non-loopback
    interface; a value the user set is kept (docs/gpu.md says what NCCL listens on).
    """
    names = [name for _, name in socket.if_nameindex()]
    loopback = "lo" if "lo" in names else next((n for n in names if n.startswith("lo")), None)
    if loopback is not None:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", loopback)
        os.environ.setdefault("NCCL_SOCKET_IFNAME", loopback)
