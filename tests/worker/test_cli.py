"""``engine verify``, ``profile`` and ``serve`` through :func:`vertumnus.worker.cli.register`."""

from __future__ import annotations

import argparse
import csv
import json

import pytest
from vertumnus.worker import cli


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="vertumnus")
    cli.register(parser.add_subparsers(dest="cmd", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_verify_writes_the_report(tmp_path):
    out = tmp_path / "verify.json"
    assert run(["engine", "verify", "--degrees", "1,2", "--prefix", "16", "--tokens", "21", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["dtype"] == "float64" and report["passed"]
    assert set(report["degrees"]) == {"1", "2"}
    assert report["degrees"]["2"]["max_abs_diff"] <= 1e-9
    assert report["degrees"]["2"]["prefix_max_abs_diff"] <= 1e-9


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["engine", "verify", "--degrees", "1,3", "--json", "-"], "degrees must be powers of two, got [3]"),
        (["engine", "verify", "--model", "/nonexistent", "--json", "-"], "--model /nonexistent: not a directory with config.json"),
        (["profile", "--cached", "10", "--out", "x.csv"], "not multiples of the block size 16"),
        (["serve", "--ranks", "4", "--degrees", "2,1"], "--degrees [2, 1] cover 3 ranks, --ranks is 4"),
    ],
    ids=["degree-3", "missing-model", "unaligned-prefix", "short-grouping"],
)
def test_bad_input_exits_2_naming_the_problem(argv, message, capsys):
    assert run(argv) == 2
    assert message in capsys.readouterr().err


def test_profile_writes_the_csv_vertumnus_fit_reads(tmp_path):
    out, fit = tmp_path / "profile.csv", tmp_path / "fit.json"
    argv = ["profile", "--degrees", "1,2", "--uncached", "32,96", "--cached", "0,32",
            "--repeats", "1", "--out", str(out), "--fit-json", str(fit)]
    assert run(argv) == 0
    rows = list(csv.reader(out.open()))
    assert rows[0] == ["degree", "uncached_tokens", "cached_tokens", "seconds"]
    body = [(int(d), int(r), int(p)) for d, r, p, _ in rows[1:]]
    assert sorted(body) == sorted((d, r, p) for d in (1, 2) for r in (32, 96) for p in (0, 32))
    assert all(float(s) > 0 for *_, s in rows[1:])
    assert "mape" in json.loads(fit.read_text())


def test_serve_starts_endpoints_and_stops_on_sigterm(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    import grpc
    from vertumnus.worker._proto import worker_pb2, worker_pb2_grpc
    from vertumnus.worker.pool import free_port

    base = free_port()
    runner = (
        "import argparse, sys\n"
        "from vertumnus.worker import cli\n"
        "p = argparse.ArgumentParser(); cli.register(p.add_subparsers(dest='cmd', required=True))\n"
        "a = p.parse_args(sys.argv[1:]); raise SystemExit(a.func(a))\n"
    )
    argv = [sys.executable, "-c", runner, "serve", "--ranks", "2", "--degrees", "1,1", "--base-port", str(base)]
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        lines = []
        while len(lines) < 2 and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if line.startswith("worker "):
                lines.append(line.strip())
        assert lines == [f"worker 0 (CP1) at 127.0.0.1:{base}", f"worker 1 (CP1) at 127.0.0.1:{base + 1}"]
        with grpc.insecure_channel(f"127.0.0.1:{base + 1}") as channel:
            stub = worker_pb2_grpc.WorkerStub(channel)
            out = stub.Prefill(worker_pb2.PrefillRequest(request_id="x", token_ids=[1, 2, 3]), timeout=60)
            assert out.degree == 1
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
