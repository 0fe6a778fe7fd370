"""The SGLang pod's readiness probe against stand-in servers that answer ``/health``."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from vertumnus.worker.sglang import probe

from .conftest import free_ports


def _server(port: int, status: int) -> ThreadingHTTPServer:
    class Health(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            self.send_response(status if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", port), Health)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


def test_offsets_are_each_workers_first_gpu():
    assert probe.offsets([4, 2, 1, 1]) == [0, 4, 6, 7]
    with pytest.raises(ValueError, match="a CP4 worker cannot start at GPU 2"):
        probe.offsets([2, 4, 2])


def test_every_server_of_the_grouping_must_be_healthy(tmp_path, capsys):
    base = free_ports(4)
    degrees = tmp_path / "degrees"
    degrees.write_text("2,1,1")  # servers at GPUs 0, 2 and 3
    servers = [_server(base, 200), _server(base + 2, 200)]  # GPU 3's is not up
    try:
        argv = ["--degrees-file", str(degrees), "--http-base-port", str(base), "--timeout", "2"]
        assert probe.main(argv) == 1
        assert f"127.0.0.1:{base + 3}/health" in capsys.readouterr().err
        servers.append(_server(base + 3, 503))  # starting
        assert probe.main(argv) == 1
        assert "HTTP 503" in capsys.readouterr().err
        degrees.write_text("2,2")  # after a regroup: servers at GPUs 0 and 2
        assert probe.main(argv) == 0
    finally:
        for s in servers:
            s.shutdown()
            s.server_close()


def test_bad_degrees_exit_2(capsys):
    assert probe.main(["--degrees", "2,4"]) == 2
    assert "cannot start at GPU 2" in capsys.readouterr().err
