"""Processes end with the process that owns them, however it ends.

A rank's parent is the multiprocessing forkserver, which survives a host
killed with SIGKILL; without the host watch the ranks (and on a GPU node the
memory they hold) would outlive it. ``vertumnus serve --exit-with PID`` stops,
draining first, when PID ends (``vertumnus up`` passes its own).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

HOST = """
import sys, time
from vertumnus.worker.pool import RankPool
from vertumnus.worker.rank import RankSpec
pool = RankPool(2, RankSpec(num_blocks=16))
print(" ".join(str(p.pid) for p in pool._procs), flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it has ended all the same.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_ranks_exit_when_the_host_is_killed() -> None:
    host = subprocess.Popen([sys.executable, "-c", HOST], stdout=subprocess.PIPE, text=True)
    try:
        assert host.stdout is not None
        ranks = [int(p) for p in host.stdout.readline().split()]
        assert len(ranks) == 2 and all(_alive(p) for p in ranks)
        host.send_signal(signal.SIGKILL)
        host.wait(10)
        deadline = time.monotonic() + 15
        while any(_alive(p) for p in ranks) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(p) for p in ranks), "rank processes outlived their host"
    finally:
        if host.poll() is None:
            host.kill()


def test_serve_stops_when_the_process_it_exits_with_ends(tmp_path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    log = tmp_path / "serve.log"
    serve = subprocess.Popen(
        [sys.executable, "-m", "vertumnus", "serve", "--ranks", "1", "--base-port", str(port)]
        + ["--num-blocks", "16", "--exit-with", str(owner.pid)],
        stderr=log.open("w"),
    )
    try:
        deadline = time.monotonic() + 120
        while "serving 1 ranks" not in log.read_text():
            assert serve.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        owner.kill()
        owner.wait(10)
        assert serve.wait(60) == 0, log.read_text()
        assert "vertumnus: stopped" in log.read_text()
    finally:
        for p in (owner, serve):
            if p.poll() is None:
                p.kill()
