"""Shared fixtures: the default prefill-time model and the shared traces folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from vertumnus.core.costmodel import PrefillModel
from vertumnus.profiles import load_model

SHARED_TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
MOONCAKE = SHARED_TRACES / "mooncake" / "conversation_trace.jsonl"
AZURE_CODE = SHARED_TRACES / "azure_llm_2023" / "AzureLLMInferenceTrace_code.csv"
AZURE_CONV = SHARED_TRACES / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"


def needs(path: Path) -> pytest.MarkDecorator:
    """Skip a test that replays a public trace when ``../shared`` is not beside the
    checkout (CI always has it)."""
    return pytest.mark.skipif(not path.exists(), reason=f"needs {path} (the ../shared traces)")


@pytest.fixture(scope="session")
def model() -> PrefillModel:
    return load_model()
