"""``bench/gpu/h200_all.sh`` — every GPU check in one script — on CPU with tiny shapes
(``VERTUMNUS_CPU_SMOKE=1``): each step runs from the checkout laid out as a package, the
engine's one-rank check passes, and the profile reaches the CSV ``vertumnus fit`` reads."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from vertumnus.profiles import read_profile_csv

ROOT = Path(__file__).resolve().parents[2]


def run_checks(out: Path, **env: str) -> None:
    """``bench/gpu/h200_all.sh out``, tiny on CPU, with ``env`` added."""
    subprocess.run(
        ["bash", str(ROOT / "bench/gpu/h200_all.sh"), str(out)],
        env={**os.environ, "VERTUMNUS_CPU_SMOKE": "1", **env},
        check=True,
        timeout=300,
        capture_output=True,
    )


def test_every_gpu_check_runs_tiny_on_cpu(tmp_path):
    run_checks(tmp_path)
    steps = (tmp_path / "steps.log").read_text()
    assert "zigzag_h200 exit 0" in steps and "profile exit 0" in steps, steps
    assert "torch" in (tmp_path / "machine.txt").read_text()
    report = json.loads((tmp_path / "h200.json").read_text())
    assert report["engine_check"]["passed"] is True
    assert not report["failures"]
    profile = read_profile_csv(tmp_path / "profile.csv")
    assert len(profile) == 4  # 2 uncached x 2 cached lengths, CP1, one repeat
    # the written model is removed; only the results stay
    assert not any(p.is_dir() for p in tmp_path.iterdir())


def test_gpu_steps_picks_which_checks_run(tmp_path):
    run_checks(tmp_path, VERTUMNUS_GPU_STEPS="profile")
    steps = (tmp_path / "steps.log").read_text()
    assert "profile exit 0" in steps and "zigzag" not in steps, steps
    assert not (tmp_path / "h200.json").exists()
    assert len(read_profile_csv(tmp_path / "profile.csv")) == 4
