"""``engine verify``, ``profile`` and ``serve`` through :func:`vertumnus.worker.cli.register`."""

from __future__ import annotations

import argparse
import csv
import json

import pytest

from vertumnus.worker import cli

from .conftest import free_ports


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="vertumnus")
    cli.register(parser.add_subparsers(dest="cmd", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_verify_writes_the_report(tmp_path):
    out = tmp_path / "verify.json"
    assert (
        run(
            [
                "engine",
                "verify",
                "--degrees",
                "1,2",
                "--prefix",
                "16",
                "--tokens",
                "21",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    report = json.loads(out.read_text())
    assert report["dtype"] == "float64" and report["passed"]
    assert set(report["degrees"]) == {"1", "2"}
    assert report["degrees"]["2"]["max_abs_diff"] <= 1e-9
    assert report["degrees"]["2"]["prefix_max_abs_diff"] <= 1e-9


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["engine", "verify", "--degrees", "1,3", "--json", "-"],
            "degrees must be powers of two, got [3]",
        ),
        (
            ["engine", "verify", "--model", "/nonexistent", "--json", "-"],
            "--model /nonexistent: not a directory with config.json",
        ),
        (["profile", "--cached", "10", "--out", "x.csv"], "not multiples of the block size 16"),
        (["profile", "--warmup", "-1", "--out", "x.csv"], "--warmup must be >= 0"),
        (
            ["serve", "--ranks", "4", "--degrees", "2,1"],
            "--degrees [2, 1] cover 3 ranks, --ranks is 4",
        ),
    ],
    ids=["degree-3", "missing-model", "unaligned-prefix", "negative-warmup", "short-grouping"],
)
def test_bad_input_exits_2_naming_the_problem(argv, message, capsys):
    assert run(argv) == 2
    assert message in capsys.readouterr().err


def test_profile_writes_the_csv_vertumnus_fit_reads(tmp_path):
    out, fit = tmp_path / "profile.csv", tmp_path / "fit.json"
    argv = [
        "profile",
        "--degrees",
        "1,2",
        "--uncached",
        "32,96",
        "--cached",
        "0,32",
        "--repeats",
        "1",
        "--out",
        str(out),
        "--fit-json",
        str(fit),
    ]
    assert run(argv) == 0
    rows = list(csv.reader(out.open()))
    assert rows[0] == ["degree", "uncached_tokens", "cached_tokens", "seconds"]
    body = [(int(d), int(r), int(p)) for d, r, p, _ in rows[1:]]
    assert sorted(body) == sorted((d, r, p) for d in (1, 2) for r in (32, 96) for p in (0, 32))
    assert all(float(s) > 0 for *_, s in rows[1:])
    assert "mape" in json.loads(fit.read_text())


def read_lines_until(proc, prefix: str, timeout_s: float = 120) -> list[str]:
    """stderr lines of ``proc`` up to the first that starts with ``prefix`` (fails if it exits first)."""
    import time

    deadline = time.monotonic() + timeout_s
    lines: list[str] = []
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            pytest.fail(
                f"serve exited ({proc.wait(10)}) before printing {prefix!r}:\n" + "\n".join(lines)
            )
        lines.append(line.rstrip("\n"))
        if line.startswith(prefix):
            return lines
    pytest.fail(f"no {prefix!r} within {timeout_s} s:\n" + "\n".join(lines))


SERVE = (
    "import argparse, sys\n"
    "from vertumnus.worker import cli\n"
    "p = argparse.ArgumentParser(); cli.register(p.add_subparsers(dest='cmd', required=True))\n"
    "a = p.parse_args(sys.argv[1:]); raise SystemExit(a.func(a))\n"
)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--ranks", "3"], "--ranks 3: the rank count must be a power of two (1, 2, 4, 8, ...)"),
        (
            ["--ranks", "2", "--base-port", "70000"],
            "--base-port 70000: ranks 0..1 listen on ports 70000..70001, and a port is 1..65535",
        ),
        (["--ranks", "4", "--base-port", "65534"], "ports 65534..65537, and a port is 1..65535"),
        (["--ranks", "2", "--base-port", "0"], "--base-port 0"),
        (
            ["--ranks", "4", "--degrees", "2,2", "--worker-ids", "5"],
            "--worker-ids [5]: 1 ids for 2 workers",
        ),
        (["--ranks", "4", "--degrees", "1,2,1"], "a CP2 worker cannot start at rank 1"),
    ],
    ids=["ranks-3", "port-70000", "last-port-too-high", "port-0", "ids-count", "misaligned"],
)
def test_serve_refuses_bad_arguments_before_starting_anything(argv, message, capsys):
    assert run(["serve", *argv]) == 2
    assert message in capsys.readouterr().err


def test_serve_help_describes_every_flag():
    parser = argparse.ArgumentParser(prog="vertumnus")
    sub = parser.add_subparsers(dest="cmd", required=True)
    cli.register(sub)
    serve = sub.choices["serve"]
    assert serve.description and "Ctrl-C" in serve.description
    flags = [a for a in serve._actions if a.option_strings and a.dest != "help"]
    assert {a.dest for a in flags} >= {
        "ranks",
        "degrees",
        "worker_ids",
        "host",
        "base_port",
        "dtype",
        "seed",
    }
    assert [a.option_strings for a in flags if not a.help] == []
    assert "--base-port" in serve.format_help()


def test_serve_prints_its_workers_refuses_a_taken_port_and_stops_cleanly_on_signals():
    import os
    import signal
    import subprocess
    import sys

    import grpc

    from vertumnus._proto import worker_pb2, worker_pb2_grpc

    base, other = free_ports(2), free_ports(1)
    # Two servers start side by side (their start-up overlaps). The first runs in its own
    # session, so that Ctrl-C reaches its whole process group (host, forkserver, ranks),
    # as at a terminal; the second gets SIGTERM, as from a supervisor.
    first = subprocess.Popen(
        [
            sys.executable,
            "-c",
            SERVE,
            "serve",
            "--ranks",
            "2",
            "--degrees",
            "1,1",
            "--base-port",
            str(base),
        ],
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    second = subprocess.Popen(
        [
            sys.executable,
            "-c",
            SERVE,
            "serve",
            "--ranks",
            "1",
            "--worker-ids",
            "42",
            "--base-port",
            str(other),
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert read_lines_until(first, "serving")[-3:] == [
            f"worker 0 (CP1, rank 0) at 127.0.0.1:{base}",
            f"worker 1 (CP1, rank 1) at 127.0.0.1:{base + 1}",
            "serving 2 ranks, epoch 1; Ctrl-C or SIGTERM stops (workers are drained first)",
        ]
        with grpc.insecure_channel(f"127.0.0.1:{base + 1}") as channel:
            stub = worker_pb2_grpc.WorkerStub(channel)
            out = stub.Prefill(
                worker_pb2.PrefillRequest(request_id="x", token_ids=[1, 2, 3]), timeout=60
            )
            assert out.degree == 1

        taken = subprocess.run(
            [sys.executable, "-c", SERVE, "serve", "--ranks", "2", "--base-port", str(base)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert taken.returncode == 2
        assert (
            f"vertumnus: error: cannot listen on 127.0.0.1:{base} for rank 0: Address already in use"
            in taken.stderr
        )
        with grpc.insecure_channel(
            f"127.0.0.1:{base}"
        ) as channel:  # the first server still has its port
            d = worker_pb2_grpc.WorkerStub(channel).Describe(
                worker_pb2.DescribeRequest(), timeout=10
            )
            assert (d.worker, d.offset) == (0, 0)

        assert (
            read_lines_until(second, "worker ")[-1]
            == f"worker 42 (CP1, rank 0) at 127.0.0.1:{other}"
        )
        read_lines_until(second, "serving")
        second.send_signal(signal.SIGTERM)
        os.killpg(first.pid, signal.SIGINT)
        for proc in (first, second):
            assert proc.wait(timeout=60) == 0
            rest = proc.stderr.read()
            assert "Traceback" not in rest and "KeyboardInterrupt" not in rest, rest
            assert "vertumnus: stopping: draining workers" in rest and "vertumnus: stopped" in rest
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
        if second.poll() is None:
            second.kill()
            second.wait()
