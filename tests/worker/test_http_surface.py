"""The SGLang-style HTTP surface over a real engine on loopback (``vertumnus http-surface``).

A real ``vertumnus serve`` (one CPU rank of the seeded tiny model) and the surface in front
of its gRPC endpoint: ``/generate`` with ``input_ids`` and with ``text`` gives the first
token the worker's own ``Prefill`` gives, the cached prefix grows on a repeat, bad input is
a 400 naming the field, and the calls SGLang's router makes on a server answer. When
``sglang-router`` is installed (never in CI), the real router is driven over the surface too.
"""

from __future__ import annotations

import http.client
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .conftest import free_ports, random_tokens

grpc = pytest.importorskip("grpc")

from vertumnus._proto import worker_pb2, worker_pb2_grpc  # noqa: E402
from vertumnus.worker.http_surface import HttpSurface  # noqa: E402

BLOCK = 16


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real one-rank engine; its gRPC endpoint."""
    port = free_ports(1)
    log = tmp_path_factory.mktemp("engine") / "serve.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "vertumnus", "serve", "--ranks", "1", "--base-port", str(port)]
        + ["--num-blocks", "64", "--max-tokens", "512", "--block-size", str(BLOCK)]
        + ["--exit-with", str(os.getpid())],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    address = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        with grpc.insecure_channel(address) as ch:
            stub = worker_pb2_grpc.WorkerStub(ch)
            while True:
                assert proc.poll() is None, log.read_text()
                try:
                    stub.Describe(worker_pb2.DescribeRequest(), timeout=1)
                    break
                except grpc.RpcError:
                    assert time.monotonic() < deadline, log.read_text()
                    time.sleep(0.3)
        yield address
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="module")
def surface(worker: str) -> Iterator[HttpSurface]:
    s = HttpSurface(worker, "127.0.0.1:0").start(wait_s=30)
    try:
        yield s
    finally:
        s.stop()


def call(
    address: str, method: str, path: str, body: Any = None, raw: bytes | None = None
) -> tuple[int, Any]:
    host, port = address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        headers = {"Content-Type": "application/json"} if data is not None else {}
        conn.request(method, path, body=data, headers=headers)
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read() or b"null")
    finally:
        conn.close()


def grpc_prefill(worker: str, tokens: list[int], rid: str) -> Any:
    with grpc.insecure_channel(worker) as ch:
        return worker_pb2_grpc.WorkerStub(ch).Prefill(
            worker_pb2.PrefillRequest(request_id=rid, token_ids=tokens), timeout=60
        )


def test_generate_gives_the_workers_first_token_and_the_cache_grows(worker, surface):
    tokens = random_tokens(3 * BLOCK + 5, seed=11)
    status, cold = call(surface.address, "POST", "/generate", {"input_ids": tokens, "rid": "h1"})
    assert status == 200, cold
    meta = cold["meta_info"]
    assert meta["id"] == "h1" and meta["prompt_tokens"] == len(tokens)
    assert meta["cached_tokens"] == 0 and meta["completion_tokens"] == 1
    assert meta["finish_reason"] == {"type": "length", "length": 1}
    assert meta["degree"] == 1 and meta["e2e_latency"] > 0
    first = cold["output_ids"][0]
    assert cold["text"] == chr(first)

    direct = grpc_prefill(worker, tokens, "g1")
    assert direct.first_token_id == first
    assert direct.cached_tokens >= 3 * BLOCK - BLOCK  # the repeat hits the blocks just stored

    # The same prompt as text (one character per token id): the same tokens, a warm cache.
    status, warm = call(surface.address, "POST", "/generate", {"text": "".join(map(chr, tokens))})
    assert status == 200, warm
    assert warm["output_ids"] == [first]
    assert warm["meta_info"]["cached_tokens"] > meta["cached_tokens"]
    assert warm["meta_info"]["cached_tokens"] % BLOCK == 0
    assert warm["meta_info"]["id"].startswith("http-")  # no rid: the surface names it


def test_a_chunked_body_is_read(surface):
    tokens = random_tokens(BLOCK + 3, seed=12)
    host, port = surface.address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    body = json.dumps({"input_ids": tokens}).encode()
    conn.request(
        "POST",
        "/generate",
        body=iter([body[:7], body[7:]]),
        encode_chunked=True,
        headers={"Content-Type": "application/json"},
    )
    resp = conn.getresponse()
    assert resp.status == 200
    assert json.loads(resp.read())["meta_info"]["prompt_tokens"] == len(tokens)
    conn.close()


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ({"input_ids": [1, 2, 300]}, "input_ids[2]", "300 is outside the vocabulary [0, 256)"),
        ({"input_ids": [1, "a"]}, "input_ids[1]", "expected an integer token id"),
        ({"input_ids": []}, "input_ids", "empty"),
        ({"input_ids": [[1, 2], [3]]}, "input_ids", "a batch of 2 sequences"),
        (
            {"input_ids": [1] * 513},
            "input_ids",
            "513 tokens, more than this worker's maximum of 512",
        ),
        ({"text": "ok \u4e2d"}, "text[3]", "U+4E2D"),
        ({"text": ["a", "b"]}, "text", "a batch of texts"),
        ({}, "input_ids", "missing"),
        ({"text": "a", "input_ids": [1]}, "text", "not both"),
        ({"input_ids": [1], "stream": True}, "stream", "not supported"),
        ({"input_ids": [1], "rid": 7}, "rid", "expected one string"),
        ({"input_ids": [1], "sampling_params": 3}, "sampling_params", "expected an object"),
        ([1, 2], "body", "expected a JSON object"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(surface, body, field, words):
    status, out = call(surface.address, "POST", "/generate", body)
    assert status == 400, out
    assert out["error"]["param"] == field
    assert out["error"]["message"].startswith(f"{field}: ") and words in out["error"]["message"]
    assert out["error"]["code"] == 400


def test_malformed_requests(surface):
    status, out = call(surface.address, "POST", "/generate", raw=b"{not json")
    assert status == 400 and out["error"]["message"].startswith("body: not valid JSON")
    status, out = call(surface.address, "POST", "/generate", raw=b"")
    assert status == 400 and out["error"]["param"] == "body"
    status, out = call(surface.address, "GET", "/generate")
    assert status == 405 and "use POST" in out["error"]["message"]
    status, out = call(surface.address, "GET", "/nope")
    assert status == 404 and "/generate" in out["error"]["message"]


def test_the_calls_sglangs_router_makes_on_a_server(worker, surface):
    assert call(surface.address, "GET", "/health")[0] == 200
    status, out = call(surface.address, "GET", "/health_generate")
    assert status == 200 and out["status"] == "ok"
    for path in ("/server_info", "/get_server_info"):
        status, info = call(surface.address, "GET", path)
        assert status == 200
        assert info["dp_size"] == 1 and info["served_model_name"] == "vertumnus-tiny"
        assert info["vertumnus"]["degree"] == 1 and info["vertumnus"]["grpc_endpoint"] == worker
        assert info["max_prefill_tokens"] == 512 and info["page_size"] == BLOCK
    for path in ("/model_info", "/get_model_info"):
        status, info = call(surface.address, "GET", path)
        assert status == 200 and info["is_generation"] is True
    status, models = call(surface.address, "GET", "/v1/models")
    assert status == 200 and models["data"][0]["id"] == "vertumnus-tiny"
    assert call(surface.address, "GET", "/get_load") == (200, {"load": 0})
    status, stats = call(surface.address, "GET", "/vertumnus/stats")
    assert status == 200 and stats["calls"]["GET /health"] >= 1


def test_flush_cache_empties_the_worker(worker, surface):
    tokens = random_tokens(2 * BLOCK + 1, seed=13)
    call(surface.address, "POST", "/generate", {"input_ids": tokens})
    status, out = call(surface.address, "POST", "/flush_cache")
    assert status == 200 and out["removed_blocks"] >= 2
    status, again = call(surface.address, "POST", "/generate", {"input_ids": tokens})
    assert status == 200 and again["meta_info"]["cached_tokens"] == 0


def test_max_outstanding_holds_the_rest_at_the_surface_in_order(worker):
    from concurrent.futures import ThreadPoolExecutor

    gated = HttpSurface(worker, "127.0.0.1:0", max_outstanding=1).start(wait_s=30)
    try:
        prompts = [random_tokens(3 * BLOCK, seed=20 + i) for i in range(4)]
        with ThreadPoolExecutor(4) as pool:
            outs = list(
                pool.map(
                    lambda t: call(gated.address, "POST", "/generate", {"input_ids": t}), prompts
                )
            )
        assert all(status == 200 for status, _ in outs), outs
        metas = [out["meta_info"] for _, out in outs]
        # The last one admitted waited at the surface for at least one whole prefill.
        assert max(m["surface_queue_seconds"] for m in metas) >= min(
            m["execution_seconds"] for m in metas
        )
        assert all(m["queue_seconds"] >= m["surface_queue_seconds"] for m in metas)
    finally:
        gated.stop()


def test_the_fifo_gate_admits_in_arrival_order():
    import threading

    from vertumnus.worker.http_surface import _FifoGate

    gate, order = _FifoGate(1), []
    gate.enter()  # held: the others queue behind it in the order they arrive
    threads = []
    for i in range(5):
        t = threading.Thread(target=lambda i=i: (gate.enter(), order.append(i), gate.exit()))
        t.start()
        threads.append(t)
        time.sleep(0.05)
    gate.exit()
    for t in threads:
        t.join(5)
    assert order == [0, 1, 2, 3, 4]


def test_the_command_serves_and_stops(worker):
    proc = subprocess.Popen(
        [sys.executable, "-m", "vertumnus", "http-surface", "--worker", worker]
        + ["--listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("vertumnus http-surface: http://127.0.0.1:"), line
        assert f"-> worker 0 (CP1, epoch 1) at {worker}" in line
        address = line.split("http://", 1)[1].split(" ", 1)[0]
        assert call(address, "GET", "/health")[0] == 200
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (["--worker", "nowhere"], 2, "--worker: expected HOST:PORT, got 'nowhere'"),
        (["--worker", "127.0.0.1:1", "--listen", "x"], 2, "--listen: expected HOST:PORT"),
        (["--worker", "127.0.0.1:1", "--wait", "0.5"], 1, "did not answer Describe within 0.5 s"),
    ],
)
def test_the_command_refuses_bad_flags(argv, code, message):
    out = subprocess.run(
        [sys.executable, "-m", "vertumnus", "http-surface", *argv, "--listen", "127.0.0.1:0"]
        if "--listen" not in argv
        else [sys.executable, "-m", "vertumnus", "http-surface", *argv],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == code, out.stderr
    assert message in out.stderr and "Traceback" not in out.stderr


# -- the real router (only where sglang-router is installed; never in CI) -------------------


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("sglang_router") is None,
    reason="sglang-router is not installed (pip install sglang-router; the `peers` extra)",
)
def test_the_real_sglang_router_routes_to_the_surface(worker, surface, tmp_path: Path):
    port, prom = free_ports(1), free_ports(1)
    log = tmp_path / "router.log"
    router = subprocess.Popen(
        [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1"]
        + ["--port", str(port), "--worker-urls", surface.url, "--policy", "cache_aware"]
        + ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(prom)],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    address = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert router.poll() is None, log.read_text()
            try:
                if call(address, "GET", "/readiness")[0] == 200:
                    break
            except (OSError, json.JSONDecodeError):
                pass
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.3)
        tokens = random_tokens(2 * BLOCK + 2, seed=14)
        status, out = call(address, "POST", "/generate", {"input_ids": tokens, "rid": "via-sgl"})
        assert status == 200, out
        assert out["meta_info"]["id"] == "via-sgl"
        assert out["output_ids"] == [grpc_prefill(worker, tokens, "check").first_token_id]
        status, out = call(address, "POST", "/generate", {"input_ids": tokens})
        assert status == 200 and out["meta_info"]["cached_tokens"] >= BLOCK
        calls = call(surface.address, "GET", "/vertumnus/stats")[1]["calls"]
        assert calls.get("GET /health", 0) >= 1 and calls["POST /generate"] >= 2
    finally:
        router.send_signal(signal.SIGINT)
        try:
            router.wait(30)
        except subprocess.TimeoutExpired:
            router.kill()
