"""The ablation command end to end on a slice of the Mooncake trace."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import MOONCAKE, bench_script, needs


@needs(MOONCAKE)
def test_cache_ablation_writes_json_and_plot(tmp_path: Path) -> None:
    mod = bench_script("cache_ablation.py")
    out = tmp_path / "ablation.json"
    args = ["--trace", str(MOONCAKE), "--rates", "4", "--seeds", "2", "--limit", "300"]
    assert mod.main([*args, "--jobs", "1", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    (row,) = doc["rows"]
    assert row["vertumnus"]["rate_rps"] > 0 and len(doc["runs"]) == 4
    assert {r["requests"] for r in doc["runs"]} == {300}
    assert out.with_suffix(".png").exists()
