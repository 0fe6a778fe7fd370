"""The prepared GPU check (``bench/gpu/sglang_check.py``) on CPU: its arguments, its
fast failure without SGLang or CUDA, and one whole run against the stand-in server."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from tests.conftest import bench_script
from vertumnus.profiles import read_profile_csv

from .conftest import free_ports

STANDIN = Path(__file__).with_name("sglang_standin.py")


def _script():
    return bench_script("gpu/sglang_check.py")


def test_arguments_are_checked(tmp_path, capsys):
    check = _script()
    with pytest.raises(SystemExit) as e:
        check.parse_args(["--model", str(tmp_path), "--out", "x.json", "--cached", "0,100"])
    assert e.value.code == 2
    assert "--cached [100]: prefixes are whole pages, multiples of 16" in capsys.readouterr().err
    args = check.parse_args(["--model", str(tmp_path), "--out", str(tmp_path / "r.json")])
    assert args.profile_csv == tmp_path / "r.csv" and args.sglang_arg == ["--disable-cuda-graph"]


@pytest.mark.skipif(
    importlib.util.find_spec("sglang") is not None, reason="SGLang is installed here"
)
def test_without_sglang_it_fails_at_once_naming_what_is_missing(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert _script().main(["--model", str(tmp_path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "SGLang 0.5.23 is not installed" in err and "no config.json" in err
    doc = json.loads(out.read_text())
    assert doc["ok"] is False and any("SGLang" in p for p in doc["problems"])


def test_a_whole_run_against_the_stand_in_writes_a_profile(tmp_path):
    pytest.importorskip("zmq", reason="the adapter's event subscriber needs pyzmq (sglang extra)")
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 256}))
    out = tmp_path / "r.json"
    argv = ["--model", str(tmp_path), "--out", str(out), "--uncached", "40,70", "--cached", "0,32"]
    argv += ["--launcher", f"{sys.executable} {STANDIN}", "--base-port", str(free_ports(401))]
    assert _script().main(argv) == 0
    doc = json.loads(out.read_text())
    assert doc["ok"] and doc["repeat"]["ok"] and doc["restart_s"] > 0
    assert [c["cached_tokens"] for c in doc["prefills"]] == [0, 0, 0, 0, 32, 32, 32, 32]
    assert all(c["events_ok"] for c in doc["prefills"])
    rows = read_profile_csv(doc["profile_csv"])
    assert len(rows) == 8 and {r.degree for r in rows} == {1}
