"""Shared fixtures: the default prefill-time model, the shared traces folder, and the
benchmark scripts as modules."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from vertumnus.core.costmodel import PrefillModel
from vertumnus.profiles import load_model

BENCH = Path(__file__).resolve().parents[1] / "bench"
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


def bench_script(path: str) -> ModuleType:
    """The script ``bench/<path>`` as a module (bench/ is not a package), loaded once.

    It is registered in ``sys.modules`` (as ``vertumnus_bench_<path>``) before it runs,
    as an import would: its dataclasses look their module up there."""
    name = "vertumnus_bench_" + path.removesuffix(".py").replace("/", "_")
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, BENCH / path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]  # as a failed import leaves nothing behind
            raise
    return module
