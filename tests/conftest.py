"""Shared fixtures: the default prefill-time model and the shared traces folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from vertumnus.core.costmodel import PrefillModel
from vertumnus.profiles import load_model

SHARED_TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
MOONCAKE = SHARED_TRACES / "mooncake" / "conversation_trace.jsonl"


@pytest.fixture(scope="session")
def model() -> PrefillModel:
    return load_model()
