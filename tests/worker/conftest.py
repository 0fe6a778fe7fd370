"""Fixtures for the worker tests: skip without the ``worker`` extra; seeded tiny models."""

from __future__ import annotations

import socket

import pytest

torch = pytest.importorskip("torch", reason="the worker tests need the `worker` extra (torch)")
pytest.importorskip("grpc")
pytest.importorskip("safetensors")


@pytest.fixture(scope="session")
def tiny64():
    """The tiny MoE model in float64, seed 7 (the seed the engine fixtures use)."""
    from vertumnus.worker.config import ModelConfig
    from vertumnus.worker.model import Model

    return Model.random(ModelConfig.tiny(), seed=7, dtype=torch.float64)


def random_tokens(n: int, seed: int, vocab: int = 256) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n,), generator=gen).tolist()


def free_ports(count: int) -> int:
    """A base port such that ``base .. base + count - 1`` are free on loopback now."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + count - 1 > 65535:
            continue
        held = []
        try:
            for port in range(base, base + count):
                sock = socket.socket()
                held.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for sock in held:
                sock.close()
    raise RuntimeError(f"no {count} consecutive free ports found")
