"""Free loopback ports for processes started side by side (tests, benchmarks, local pools).

A CP engine of R ranks listens on R consecutive ports (``base + rank``), so
callers need a *base* whose whole run is free, not one free port.
"""

from __future__ import annotations

import socket

__all__ = ["free_port_base"]


def free_port_base(count: int, host: str = "127.0.0.1") -> int:
    """A base port such that ``base .. base + count - 1`` are all free on ``host`` now
    (bound together once, then released; another process may still take them)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind((host, 0))
            base = s.getsockname()[1]
        if base + count - 1 > 65535:
            continue
        held = []
        try:
            for port in range(base, base + count):
                sock = socket.socket()
                held.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind((host, port))
            return base
        except OSError:
            continue
        finally:
            for sock in held:
                sock.close()
    raise RuntimeError(f"no {count} consecutive free ports on {host}")
