"""An SGLang-style HTTP surface for one CP worker, so that SGLang's router can route to it.

``vertumnus http-surface --worker HOST:PORT --listen HOST:PORT`` serves, for the
worker whose gRPC endpoint is ``--worker`` (``vertumnus.worker.v1.Worker``, the
endpoint of its first rank), the HTTP calls that SGLang's router
(``sglang-router`` / sgl-model-gateway, and its fork ``vllm-router``) makes on
an SGLang server:

=====================================  ======================================================
``GET /health``                        200 while the endpoint leads a worker that admits
                                       requests (``Describe``), else 503 — the router's
                                       periodic health check (``--health-check-endpoint``)
``GET /health_generate``               a one-token prefill, 200 when it answers
``GET /server_info``, ``/get_server_info``  model name, ``dp_size`` 1, capacities, and the
                                       worker's identity (worker id, CP degree, epoch)
``GET /model_info``, ``/get_model_info``    model name, ``is_generation``
``GET /v1/models``                     the one model, OpenAI-style
``GET /get_load``                      ``{"load": requests in flight}`` (power-of-two policy)
``POST|GET /flush_cache``              ``FlushCache`` on the worker
``POST /generate``                     one prefill (below)
``GET /vertumnus/stats``               calls per path and tokens served (for benchmarks)
=====================================  ======================================================

``/generate`` takes SGLang's native request: exactly one of ``input_ids`` (one
sequence of token ids) or ``text``, and optionally ``rid`` (the request id).
Its answer has SGLang's shape — ``text``, ``output_ids`` (the first token) and
``meta_info`` with ``id``, ``prompt_tokens``, ``cached_tokens``,
``completion_tokens`` (1), ``finish_reason`` and ``e2e_latency`` (seconds in
this surface) — plus the worker's ``queue_seconds``, ``execution_seconds``,
``worker``, ``degree`` and ``epoch``. A prefill worker returns one token:
``sampling_params.max_new_tokens`` is accepted and not honoured beyond it.

**Queueing.** By default every request goes to the worker at once, as to an
SGLang server: the worker's dispatcher then batches whatever is queued into
one engine step (up to its token budget). ``--max-outstanding N`` holds all
but N at the surface, in arrival order — with N = 2 the discipline of our
router (one running, one forwarded ahead), so that a comparison of routers
over this surface can separate placement from queueing. ``queue_seconds``
then includes the wait here (``surface_queue_seconds``).

**Text.** This surface has no tokenizer of a model's own. It tokenizes
``text`` one token per character, the token id being the character's code
point; for the tiny model's 256-token vocabulary that is Latin-1 (bytes as
characters), and ``text`` in the answer is the first token as a character.
The mapping is a bijection, so a client holding token ids can send them as
text (``"".join(map(chr, ids))``), and a router that keys its prefix tree on
the request's characters (SGLang's cache-aware policy does: the tree holds
raw text, and a match is matched characters over request characters) then
sees exactly the token prefixes the worker's block index sees. With
``input_ids`` that router keys on the ids written in decimal and joined by
spaces, which keeps every shared token prefix a shared character prefix (a
match can reach at most a few digits into the first differing token).

Errors are JSON ``{"error": {"message", "type", "code", "param"}}`` naming the
field: 400 for bad input (``input_ids[3]: 70000 is outside the vocabulary
[0, 256)``), 404 unknown path, 405 wrong method, 413 body too large, 503
when the endpoint serves no worker or the worker drains (the router retries
elsewhere), 504 past the deadline, 500 when the engine failed.

The server is the standard library's threaded HTTP/1.1 server (keep-alive),
one thread per connection, each making a blocking gRPC call: nothing beyond
the ``worker`` extra. grpc is imported when a surface is created, so
``vertumnus --help`` works without it.
"""

from __future__ import annotations

import argparse
import itertools
import json
import secrets
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = [
    "BadInput",
    "HttpSurface",
    "SurfaceInfo",
    "parse_generate",
    "parse_hostport",
    "register",
    "text_to_ids",
]

MAX_BODY_BYTES = 64 << 20
"""The largest request body accepted (a 64 MiB JSON of token ids is ~10 M tokens)."""

GET, POST = ("GET",), ("POST",)


class BadInput(ValueError):
    """A request the surface refuses (HTTP 400); ``field`` names what is wrong."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def parse_hostport(text: str, what: str, *, port_zero: bool = False) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) -> (host, port); ValueError naming ``what``."""
    host, sep, port = text.rpartition(":")
    lowest = 0 if port_zero else 1
    if not (sep and host and port.isdigit() and lowest <= int(port) <= 65535):
        raise ValueError(f"{what}: expected HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


def text_to_ids(text: str, vocab_size: int) -> list[int]:
    """One token per character, its code point the token id (see the module docstring)."""
    ids = [ord(c) for c in text]
    for i, t in enumerate(ids):
        if t >= vocab_size:
            raise BadInput(
                f"text[{i}]",
                f"character U+{t:04X} (code point {t}) is outside the vocabulary [0, {vocab_size}): "
                "this surface tokenizes one token per character, the token id being its code point",
            )
    return ids


@dataclass(frozen=True)
class GenerateRequest:
    request_id: str | None
    token_ids: list[int]
    from_text: bool


def parse_generate(body: Any, vocab_size: int, max_tokens: int) -> GenerateRequest:
    """Check a ``/generate`` body (parsed JSON); :class:`BadInput` names the field at fault."""
    if not isinstance(body, dict):
        raise BadInput("body", f"expected a JSON object, got {type(body).__name__}")
    has_text, has_ids = body.get("text") is not None, body.get("input_ids") is not None
    if has_text and has_ids:
        raise BadInput("text", "give either text or input_ids, not both")
    if not (has_text or has_ids):
        raise BadInput("input_ids", "missing: give input_ids (a list of token ids) or text")
    if body.get("stream"):
        raise BadInput(
            "stream", "not supported: a prefill worker answers once, with the first token"
        )
    for flag in ("return_logprob", "return_hidden_states"):
        if body.get(flag):
            raise BadInput(flag, "not supported by a prefill-only worker")
    params = body.get("sampling_params")
    if params is not None and not isinstance(params, dict):
        raise BadInput("sampling_params", f"expected an object, got {type(params).__name__}")
    rid = body.get("rid")
    if rid is not None and not isinstance(rid, str):
        raise BadInput("rid", f"expected one string, got {type(rid).__name__}")
    if has_text:
        text = body["text"]
        if not isinstance(text, str):
            what = "a batch of texts" if isinstance(text, list) else type(text).__name__
            raise BadInput("text", f"expected one string, got {what}: send one prompt per request")
        ids = text_to_ids(text, vocab_size)
        field = "text"
    else:
        ids = body["input_ids"]
        if not isinstance(ids, list):
            raise BadInput("input_ids", f"expected a list of token ids, got {type(ids).__name__}")
        if ids and isinstance(ids[0], list):
            raise BadInput(
                "input_ids",
                f"a batch of {len(ids)} sequences: send one sequence per request",
            )
        for i, t in enumerate(ids):
            if isinstance(t, bool) or not isinstance(t, int):
                raise BadInput(f"input_ids[{i}]", f"expected an integer token id, got {t!r}")
            if not 0 <= t < vocab_size:
                raise BadInput(
                    f"input_ids[{i}]", f"{t} is outside the vocabulary [0, {vocab_size})"
                )
        field = "input_ids"
    if not ids:
        raise BadInput(field, "empty: a prefill needs at least one token")
    if len(ids) > max_tokens:
        raise BadInput(field, f"{len(ids)} tokens, more than this worker's maximum of {max_tokens}")
    return GenerateRequest(rid, list(ids), has_text)


@dataclass(frozen=True)
class SurfaceInfo:
    """What the worker's ``Describe`` said last."""

    worker: int
    degree: int
    epoch: int
    offset: int
    draining: bool
    block_size: int
    max_tokens: int
    vocab_size: int
    cache_blocks: int
    incarnation: int

    @classmethod
    def of(cls, d: Any) -> SurfaceInfo:
        return cls(
            worker=d.worker,
            degree=d.degree,
            epoch=d.epoch,
            offset=d.offset,
            draining=d.draining,
            block_size=d.block_size,
            max_tokens=d.max_tokens,
            vocab_size=d.vocab_size,
            cache_blocks=d.cache_blocks,
            incarnation=d.incarnation,
        )


class _FifoGate:
    """At most ``limit`` callers inside at once, admitted in arrival order."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._cv = threading.Condition()
        self._next = 0  # the next ticket to hand out
        self._turn = 0  # the ticket admitted next
        self._inside = 0

    def enter(self) -> None:
        with self._cv:
            ticket, self._next = self._next, self._next + 1
            while ticket != self._turn or self._inside >= self.limit:
                self._cv.wait()
            self._turn += 1
            self._inside += 1
            self._cv.notify_all()

    def exit(self) -> None:
        with self._cv:
            self._inside -= 1
            self._cv.notify_all()


class _HttpError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


def _grpc_status(code: Any) -> int:
    import grpc

    return {
        grpc.StatusCode.INVALID_ARGUMENT: 400,
        grpc.StatusCode.FAILED_PRECONDITION: 503,
        grpc.StatusCode.UNAVAILABLE: 503,
        grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
        grpc.StatusCode.DEADLINE_EXCEEDED: 504,
        grpc.StatusCode.CANCELLED: 503,
    }.get(code, 500)


class HttpSurface:
    """The HTTP surface of the worker at ``worker`` (``host:port`` of its gRPC endpoint).

    :meth:`start` asks the worker who it is (waiting up to ``wait_s`` for it to
    answer), binds ``listen`` (port 0: a free one) and serves in a background
    thread; :meth:`stop` shuts it down. ``address``/``url`` say where it listens.
    """

    def __init__(
        self,
        worker: str,
        listen: str = "127.0.0.1:0",
        *,
        model_name: str = "vertumnus-tiny",
        timeout_s: float = 120.0,
        max_outstanding: int = 0,
    ) -> None:
        import grpc

        from vertumnus._proto import worker_pb2, worker_pb2_grpc

        parse_hostport(worker, "--worker")
        self.host, self.port = parse_hostport(listen, "--listen", port_zero=True)
        self.worker = worker
        self.model_name = model_name
        self.timeout_s = timeout_s
        if max_outstanding < 0:
            raise ValueError(f"--max-outstanding: must be >= 0, got {max_outstanding}")
        self._gate = _FifoGate(max_outstanding) if max_outstanding else None
        self._pb = worker_pb2
        self._grpc = grpc
        self._channel = grpc.insecure_channel(worker)
        self._stub = worker_pb2_grpc.WorkerStub(self._channel)
        self.info: SurfaceInfo | None = None
        self._lock = threading.Lock()
        self.calls: Counter[str] = Counter()
        self.in_flight = 0
        self.completed = 0
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self._ids = itertools.count(1)
        self._tag = secrets.token_hex(3)
        self._routes = self._route_table()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.started_s = time.time()

    # -- lifecycle ------------------------------------------------------------------

    def describe(self, timeout_s: float = 5.0) -> SurfaceInfo:
        info = SurfaceInfo.of(self._stub.Describe(self._pb.DescribeRequest(), timeout=timeout_s))
        self.info = info
        return info

    def wait_for_worker(self, wait_s: float) -> SurfaceInfo:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                return self.describe(timeout_s=min(5.0, max(0.5, wait_s)))
            except self._grpc.RpcError as e:
                if time.monotonic() >= deadline:
                    raise ConnectionError(
                        f"worker {self.worker} did not answer Describe within {wait_s:g} s: "
                        f"{e.code().name}: {e.details()}"
                    ) from None
                time.sleep(0.3)

    def bind(self) -> None:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        surface = self

        class Server(ThreadingHTTPServer):
            address_family = family
            daemon_threads = True
            allow_reuse_address = True

        class Handler(_Handler):
            pass

        Handler.surface = surface
        try:
            self._server = Server((self.host, self.port), Handler)
        except OSError as e:
            raise OSError(f"cannot listen on {self.host}:{self.port}: {e.strerror or e}") from None
        self.port = self._server.server_address[1]

    def start(self, wait_s: float = 60.0) -> HttpSurface:
        self.wait_for_worker(wait_s)
        if self._server is None:
            self.bind()
        assert self._server is not None
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.2},
            name=f"http-surface-{self.port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            if self._thread is not None:  # shutdown() waits for a serve_forever that ran
                self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None
        self._channel.close()

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    # -- the endpoints -------------------------------------------------------------

    def routes(self) -> dict[str, tuple[tuple[str, ...], Callable[[Any], tuple[int, Any]]]]:
        """Path -> (methods, handler)."""
        return self._routes

    def _route_table(self) -> dict[str, tuple[tuple[str, ...], Callable[[Any], tuple[int, Any]]]]:
        info = (GET, self.server_info)
        model = (GET, self.model_info)
        return {
            "/health": (GET, self.health),
            "/health_generate": (GET, self.health_generate),
            "/server_info": info,
            "/get_server_info": info,
            "/model_info": model,
            "/get_model_info": model,
            "/v1/models": (GET, self.models),
            "/get_load": (GET, self.load),
            "/flush_cache": (GET + POST, self.flush_cache),
            "/generate": (POST, self.generate),
            "/vertumnus/stats": (GET, self.stats),
        }

    def _current(self) -> SurfaceInfo:
        try:
            return self.describe()
        except self._grpc.RpcError as e:
            raise _HttpError(
                _grpc_status(e.code()), f"worker {self.worker}: {e.code().name}: {e.details()}"
            ) from None

    def health(self, body: Any) -> tuple[int, Any]:
        info = self._current()
        if info.draining:
            raise _HttpError(503, f"worker {info.worker} at {self.worker} is draining")
        return 200, {"status": "ok", "worker": info.worker, "degree": info.degree}

    def health_generate(self, body: Any) -> tuple[int, Any]:
        # One token: shorter than a block, so it leaves nothing in the cache.
        status, out = self._prefill(f"health-{self._tag}-{next(self._ids)}", [0], from_text=False)
        return status, {"status": "ok", "first_token": out["output_ids"][0]}

    def server_info(self, body: Any) -> tuple[int, Any]:
        from vertumnus import __version__

        info = self.info or self._current()
        return 200, {
            "model_path": self.model_name,
            "served_model_name": self.model_name,
            "tokenizer_path": None,
            "version": f"vertumnus-{__version__}",
            "dp_size": 1,
            # An SGLang CP worker of degree C runs --tp-size C --attn-cp-size C.
            "tp_size": info.degree,
            "attn_cp_size": info.degree,
            "page_size": info.block_size,
            "max_total_num_tokens": info.cache_blocks * info.block_size,
            "max_prefill_tokens": info.max_tokens,
            "context_length": info.max_tokens,
            "max_running_requests": 1,
            "disaggregation_mode": "prefill",
            "vertumnus": {
                "grpc_endpoint": self.worker,
                "worker": info.worker,
                "degree": info.degree,
                "epoch": info.epoch,
                "offset": info.offset,
                "incarnation": info.incarnation,
                "vocab_size": info.vocab_size,
                "tokenizer": "one token per character, the token id being its code point",
            },
        }

    def model_info(self, body: Any) -> tuple[int, Any]:
        return 200, {
            "model_path": self.model_name,
            "tokenizer_path": None,
            "is_generation": True,
            "model_type": None,
            "architectures": None,
        }

    def models(self, body: Any) -> tuple[int, Any]:
        info = self.info or self._current()
        return 200, {
            "object": "list",
            "data": [
                {
                    "id": self.model_name,
                    "object": "model",
                    "created": int(self.started_s),
                    "owned_by": "vertumnus",
                    "root": self.model_name,
                    "max_model_len": info.max_tokens,
                }
            ],
        }

    def load(self, body: Any) -> tuple[int, Any]:
        with self._lock:
            return 200, {"load": self.in_flight}

    def flush_cache(self, body: Any) -> tuple[int, Any]:
        try:
            rep = self._stub.FlushCache(self._pb.FlushCacheRequest(), timeout=30)
        except self._grpc.RpcError as e:
            raise _HttpError(_grpc_status(e.code()), f"flush_cache: {e.details()}") from None
        return 200, {"removed_blocks": rep.removed_blocks}

    def stats(self, body: Any) -> tuple[int, Any]:
        with self._lock:
            return 200, {
                "worker": self.worker,
                "calls": dict(sorted(self.calls.items())),
                "in_flight": self.in_flight,
                "completed": self.completed,
                "prompt_tokens": self.prompt_tokens,
                "cached_tokens": self.cached_tokens,
            }

    def generate(self, body: Any) -> tuple[int, Any]:
        info = self.info or self._current()
        req = parse_generate(body, info.vocab_size, info.max_tokens)
        rid = req.request_id or f"http-{self._tag}-{next(self._ids)}"
        return self._prefill(rid, req.token_ids, from_text=req.from_text)

    def _prefill(self, rid: str, ids: list[int], *, from_text: bool) -> tuple[int, Any]:
        started = time.perf_counter()
        with self._lock:
            self.in_flight += 1
        waited = 0.0
        gate = self._gate
        try:
            if gate is not None:
                gate.enter()
                waited = time.perf_counter() - started
            try:
                rep = self._stub.Prefill(
                    self._pb.PrefillRequest(request_id=rid, token_ids=ids), timeout=self.timeout_s
                )
            finally:
                if gate is not None:
                    gate.exit()
        except self._grpc.RpcError as e:
            field = "input_ids" if e.code() == self._grpc.StatusCode.INVALID_ARGUMENT else None
            raise _HttpError(
                _grpc_status(e.code()), f"worker {self.worker}: {e.details()}", field
            ) from None
        finally:
            with self._lock:
                self.in_flight -= 1
        latency = time.perf_counter() - started
        with self._lock:
            self.completed += 1
            self.prompt_tokens += len(ids)
            self.cached_tokens += rep.cached_tokens
        first = rep.first_token_id
        return 200, {
            "text": chr(first),
            "output_ids": [first],
            "meta_info": {
                "id": rid,
                "finish_reason": {"type": "length", "length": 1},
                "prompt_tokens": len(ids),
                "completion_tokens": 1,
                "cached_tokens": rep.cached_tokens,
                "e2e_latency": latency,
                "weight_version": "default",
                "queue_seconds": waited + rep.queue_seconds,
                "surface_queue_seconds": waited,
                "execution_seconds": rep.execution_seconds,
                "worker": self.info.worker if self.info else None,
                "degree": rep.degree,
                "epoch": rep.epoch,
            },
        }


class _Handler(BaseHTTPRequestHandler):
    surface: HttpSurface
    protocol_version = "HTTP/1.1"  # keep-alive: the router pools its connections
    # TCP_NODELAY, and each answer in one write (see _send): with Nagle's algorithm the
    # body, written after the headers, would wait for the client's delayed ACK (up to
    # 40 ms on Linux) on a kept-alive connection.
    disable_nagle_algorithm = True
    server_version = "vertumnus-http-surface"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        pass  # one line per request would cost more than the request on the tiny model

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            chunks: list[bytes] = []
            total = 0
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                total += size
                if total > MAX_BODY_BYTES:
                    raise _HttpError(413, f"body: more than {MAX_BODY_BYTES} bytes")
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = self.headers.get("Content-Length")
        if not length:
            return b""
        if not length.isdigit():
            raise _HttpError(400, f"Content-Length: not a number: {length!r}")
        if int(length) > MAX_BODY_BYTES:
            self.close_connection = True
            raise _HttpError(413, f"body: {length} bytes, more than {MAX_BODY_BYTES}")
        return self.rfile.read(int(length))

    def _dispatch(self, method: str) -> None:
        surface = self.surface
        path = self.path.split("?", 1)[0]
        with surface._lock:
            surface.calls[f"{method} {path}"] += 1
        routes = surface.routes()
        try:
            raw = self._read_body()
            route = routes.get(path)
            if route is None:
                raise _HttpError(
                    404, f"path {path!r}: not served; this surface serves {', '.join(routes)}"
                )
            methods, fn = route
            if method not in methods:
                raise _HttpError(405, f"{method} {path}: use {' or '.join(methods)}")
            body: Any = None
            if raw.strip():
                try:
                    body = json.loads(raw)
                except (UnicodeDecodeError, json.JSONDecodeError) as e:
                    raise _HttpError(400, f"body: not valid JSON ({e})", "body") from None
            elif method == "POST" and path == "/generate":
                raise _HttpError(400, "body: empty; expected a JSON object", "body")
            status, out = fn(body)
        except BadInput as e:
            status, out = 400, _error(400, str(e), e.field)
        except _HttpError as e:
            status, out = e.status, _error(e.status, e.message, e.param)
        except Exception as e:  # a bug here must not kill the connection thread silently
            status, out = 500, _error(500, f"{type(e).__name__}: {e}", None)
        self._send(status, out)

    def _send(self, status: int, out: Any) -> None:
        data = json.dumps(out).encode()
        head = (
            f"{self.protocol_version} {status} {HTTPStatus(status).phrase}\r\n"
            f"Server: {self.version_string()}\r\nDate: {self.date_time_string()}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
        )
        self.wfile.write(head.encode("latin-1") + data)  # headers and body in one write


def _error(status: int, message: str, param: str | None) -> dict[str, Any]:
    phrase = HTTPStatus(status).phrase.replace(" ", "")
    return {"error": {"message": message, "type": f"{phrase}Error", "code": status, "param": param}}


# -- the command ------------------------------------------------------------------------


def register(sub: Any) -> None:
    p = sub.add_parser(
        "http-surface",
        help="an SGLang-style HTTP surface (/generate, /health, /server_info...) for one worker",
        description=(
            "Serve SGLang's native HTTP API for one CP worker (its gRPC endpoint: the endpoint of "
            "its first rank), so that SGLang's router (sglang-router, vllm-router) can route to it: "
            "/generate with input_ids or text, /health, /health_generate, /server_info, "
            "/model_info, /v1/models, /get_load, /flush_cache. Runs until Ctrl-C."
        ),
    )
    p.add_argument(
        "--worker", required=True, metavar="HOST:PORT", help="the worker's gRPC endpoint"
    )
    p.add_argument(
        "--listen",
        default="127.0.0.1:30000",
        metavar="HOST:PORT",
        help="where to serve HTTP (default 127.0.0.1:30000; port 0 picks a free one)",
    )
    p.add_argument(
        "--model-name",
        default="vertumnus-tiny",
        help="the model name /server_info and /v1/models report (default vertumnus-tiny)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=120.0,
        help="deadline of each prefill at the worker, seconds (default 120)",
    )
    p.add_argument(
        "--max-outstanding",
        type=int,
        default=0,
        metavar="N",
        help="at most N prefills at the worker at once, the rest waiting here in arrival order "
        "(default 0: no limit, every request goes to the worker's own queue at once)",
    )
    p.add_argument(
        "--wait",
        type=float,
        default=60.0,
        help="seconds to wait for the worker to answer at start (default 60)",
    )
    p.set_defaults(func=cmd_http_surface)


def cmd_http_surface(args: argparse.Namespace) -> int:
    import signal

    if not args.timeout > 0 or args.wait < 0:
        print("vertumnus: error: --timeout must be > 0 and --wait >= 0", file=sys.stderr)
        return 2
    try:
        surface = HttpSurface(
            args.worker,
            args.listen,
            model_name=args.model_name,
            timeout_s=args.timeout,
            max_outstanding=args.max_outstanding,
        )
        surface.bind()
    except (ValueError, OSError) as e:
        print(f"vertumnus: error: {e}", file=sys.stderr)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        surface.start(wait_s=args.wait)
    except ConnectionError as e:
        print(f"vertumnus: error: {e}", file=sys.stderr)
        surface.stop()
        return 1
    info = surface.info
    assert info is not None
    print(
        f"vertumnus http-surface: {surface.url} -> worker {info.worker} (CP{info.degree}, epoch "
        f"{info.epoch}) at {args.worker}; Ctrl-C stops it",
        flush=True,
    )
    while not stop.wait(0.5):
        pass
    surface.stop()
    return 0
