"""Fixtures for the worker tests: skip without the ``worker`` extra; seeded tiny models."""

from __future__ import annotations

import pytest

from vertumnus.ports import free_port_base as free_ports  # noqa: F401  (the tests' name)

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
