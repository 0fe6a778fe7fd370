#!/usr/bin/env python3
"""A stand-in SGLang 0.5.23 prefill server for the adapter's tests: no GPU, no model.

The adapter runs it with exactly the flags :mod:`vertumnus.worker.sglang.command`
builds (``--launcher "python3 tests/worker/sglang_standin.py"`` replaces ``python3 -m
sglang.launch_server``). It reads the flags it needs — ``--model-path`` (for
``config.json``'s ``vocab_size``, default 256), ``--tp-size``, ``--attn-cp-size``,
``--page-size``, ``--kv-events-config``, ``--host``, ``--port`` — and ignores the rest,
and serves what the adapter calls, in SGLang's shapes:

- ``GET /health``: 503 while "loading" (``STANDIN_START_SECONDS``), then 200;
- ``POST /generate`` with ``input_ids``: one token id (a hash of the prompt) and
  ``meta_info`` with ``id``, ``prompt_tokens``, ``cached_tokens``,
  ``completion_tokens``, ``finish_reason``, ``e2e_latency``. ``cached_tokens`` comes
  from an in-process prefix cache of pages (a radix cache by whole pages, as SGLang's
  with ``--page-size``): the longest cached page prefix, at most the prompt's length
  minus one rounded down to a page (the last token is always computed). Every full
  page of the prompt is then cached; least recently used leaf pages are evicted beyond
  ``STANDIN_CAPACITY_PAGES``;
- ``POST /flush_cache``: 200 and an empty cache, 400 while a request runs (as SGLang);
- ``GET /get_server_info``: ``tp_size``, ``attn_cp_size``, ``page_size``, ``port``
  (SGLang's server-args names), plus ``standin`` (pid, ``CUDA_VISIBLE_DEVICES``, the
  last ``/generate`` body's keys);
- **KV events** over ZMQ exactly as SGLang's ``ZmqEventPublisher`` sends them: PUB
  frames ``[topic, 8-byte big-endian sequence from 0, msgpack [ts, events, 0]]``,
  events as maps tagged ``type`` (``BlockStored``, ``BlockRemoved``,
  ``AllBlocksCleared``); a ROUTER at ``replay_endpoint`` answering ``[id, b"", start]``
  with ``[id, b"", topic, seq, payload]`` per buffered batch ≥ start and
  ``[id, b"", b"", -1, b""]`` at the end (see ``worker/sglang/events.py``).

Faults on demand, by environment (every server the adapter starts) or per server by
``POST /standin/control`` with a JSON object:

=========================  ===========================  ================================
environment                control key                  effect
=========================  ===========================  ================================
``STANDIN_EXIT_AT_START``  —                            exit with that code at once
``STANDIN_CRASH_AFTER``    ``crash`` (exit code, now)   exit (code 3) after N /generate
``STANDIN_DROP``           ``drop`` (list)              never send these sequences live
                                                        (the replay still has them)
``STANDIN_FORGET``         ``forget`` (list)            neither live nor in the replay
``STANDIN_START_SECONDS``  —                            /health 503 for that long
``STANDIN_IGNORE_SIGTERM`` —                            only SIGKILL stops it
—                          ``delay`` (seconds)          each /generate takes this long
=========================  ===========================  ================================

It exits when its parent (the adapter) is gone, so a killed test leaves nothing behind.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import queue
import signal
import sys
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import msgpack
import zmq

END = (-1).to_bytes(8, "big", signed=True)


def _ints(text: str) -> set[int]:
    return {int(x) for x in text.split(",") if x.strip()}


def _say(text: str) -> None:
    print(f"stand-in SGLang: {text}", file=sys.stderr, flush=True)


class Publisher:
    """SGLang's ZMQ event publisher: a PUB socket, a replay ROUTER, a buffer; one thread."""

    def __init__(self, config: dict, drop: set[int], forget: set[int]) -> None:
        self.topic = config.get("topic", "").encode()
        self.drop, self.forget = drop, forget
        self._ctx = zmq.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.SNDHWM, int(config.get("hwm", 100000)))
        if config.get("bind", False):
            self._pub.bind(config["endpoint"])
        else:
            self._pub.connect(config["endpoint"])
        self._router = None
        if config.get("replay_endpoint"):
            self._router = self._ctx.socket(zmq.ROUTER)
            self._router.bind(config["replay_endpoint"])
        self._buffer: deque[tuple[int, bytes]] = deque(
            maxlen=int(config.get("buffer_steps", 10000))
        )
        self._queue: queue.Queue[list] = queue.Queue()
        self._sequence = 0
        threading.Thread(target=self._run, daemon=True).start()

    def publish(self, events: list) -> None:
        if events:
            self._queue.put(events)

    def _run(self) -> None:
        while True:
            try:
                events = self._queue.get(timeout=0.005)
            except queue.Empty:
                events = None
            if events is not None:
                seq = self._sequence
                self._sequence += 1
                payload = msgpack.packb([time.time(), events, 0])
                if seq not in self.forget:
                    self._buffer.append((seq, payload))
                if seq not in self.drop and seq not in self.forget:
                    self._pub.send_multipart([self.topic, seq.to_bytes(8, "big"), payload])
            if self._router is not None and self._router.poll(0):
                ident, _, start = self._router.recv_multipart()
                first = int.from_bytes(start, "big")
                for seq, payload in list(self._buffer):
                    if seq >= first:
                        self._router.send_multipart(
                            [ident, b"", self.topic, seq.to_bytes(8, "big"), payload]
                        )
                self._router.send_multipart([ident, b"", b"", END, b""])


class PageCache:
    """A radix cache by whole pages: page hash -> (parent hash, tokens); LRU leaf eviction."""

    def __init__(self, page: int, capacity: int, publisher: Publisher) -> None:
        self.page, self.capacity, self.publisher = page, capacity, publisher
        self.index: dict[tuple[int | None, tuple[int, ...]], int] = {}
        self.pages: dict[int, tuple[int | None, tuple[int, ...]]] = {}
        self.children: dict[int, int] = {}
        self.used: dict[int, float] = {}

    @staticmethod
    def _hash(parent: int | None, tokens: tuple[int, ...]) -> int:
        # SGLang: the first 64 bits of a chained SHA-256, signed (mem_cache/utils.py).
        h = hashlib.sha256(b"" if parent is None else parent.to_bytes(8, "big", signed=True))
        h.update(b"".join(t.to_bytes(8, "big", signed=True) for t in tokens))
        return int.from_bytes(h.digest()[:8], "big", signed=True)

    def prefill(self, ids: list[int]) -> int:
        """Match, then cache every full page; publish what changed; the cached tokens."""
        p = self.page
        full = [tuple(ids[i : i + p]) for i in range(0, len(ids) // p * p, p)]
        parent: int | None = None
        matched = 0
        now = time.monotonic()
        for tokens in full:
            h = self.index.get((parent, tokens))
            if h is None:
                break
            self.used[h] = now
            parent, matched = h, matched + 1
        cached = min(matched, (len(ids) - 1) // p) * p
        chain = {h for h in self._chain(parent)}
        events: list = []
        new_hashes, new_tokens, first_parent = [], [], parent
        for tokens in full[matched:]:
            removed = self._evict(chain)
            if removed:
                events.append({"type": "BlockRemoved", "block_hashes": removed, "medium": "GPU"})
            h = self._hash(parent, tokens)
            self.index[(parent, tokens)] = h
            self.pages[h] = (parent, tokens)
            self.children[h] = 0
            self.used[h] = now
            if parent is not None:
                self.children[parent] += 1
            chain.add(h)
            new_hashes.append(h)
            new_tokens += list(tokens)
            parent = h
        if new_hashes:
            events.append(
                {
                    "type": "BlockStored",
                    "block_hashes": new_hashes,
                    "parent_block_hash": first_parent,
                    "token_ids": new_tokens,
                    "block_size": p,
                    "lora_id": None,
                    "medium": "GPU",
                }
            )
        self.publisher.publish(events)
        return cached

    def _chain(self, h: int | None) -> list[int]:
        out = []
        while h is not None:
            out.append(h)
            h = self.pages[h][0]
        return out

    def _evict(self, protected: set[int]) -> list[int]:
        removed = []
        while len(self.pages) >= self.capacity:
            leaves = [h for h, n in self.children.items() if n == 0 and h not in protected]
            if not leaves:
                break
            victim = min(leaves, key=lambda h: self.used[h])
            parent, tokens = self.pages.pop(victim)
            del self.index[(parent, tokens)], self.children[victim], self.used[victim]
            if parent is not None:
                self.children[parent] -= 1
            removed.append(victim)
        return removed

    def clear(self) -> None:
        self.index.clear()
        self.pages.clear()
        self.children.clear()
        self.used.clear()
        self.publisher.publish([{"type": "AllBlocksCleared"}])


class State:
    def __init__(self, args: argparse.Namespace, config: dict) -> None:
        env = os.environ
        self.args = args
        self.lock = threading.Lock()
        self.publisher = Publisher(
            config, _ints(env.get("STANDIN_DROP", "")), _ints(env.get("STANDIN_FORGET", ""))
        )
        self.cache = PageCache(
            args.page_size, int(env.get("STANDIN_CAPACITY_PAGES", 1 << 20)), self.publisher
        )
        self.ready_at = time.monotonic() + float(env.get("STANDIN_START_SECONDS", 0))
        crash_after = env.get("STANDIN_CRASH_AFTER")
        self.crash_after = int(crash_after) if crash_after else None
        self.delay = 0.0
        self.generated = 0
        self.running = 0
        self.last_generate_keys: list[str] = []
        try:
            config_json = json.loads((Path(args.model_path) / "config.json").read_text())
            self.vocab = int(config_json.get("vocab_size", 256))
        except (OSError, ValueError):
            self.vocab = 256


def crash(code: int, why: str) -> None:
    print("Traceback (most recent call last):", file=sys.stderr)
    print(f"RuntimeError: stand-in crash on demand ({why})", file=sys.stderr, flush=True)
    os._exit(code)


def handler(state: State) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _answer(self, status: int, body: object) -> None:
            raw = body.encode() if isinstance(body, str) else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def _body(self) -> object:
            n = int(self.headers.get("Content-Length") or 0)
            return json.loads(self.rfile.read(n)) if n else None

        def _error(self, message: str) -> None:
            # SGLang's ErrorResponse (http_server.py, _create_error_response).
            body = {"object": "error", "message": message, "type": "BadRequestError", "code": 400}
            self._answer(400, body)

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if self.path == "/health":
                self._answer(200 if time.monotonic() >= state.ready_at else 503, "")
            elif self.path == "/get_server_info":
                a = state.args
                self._answer(
                    200,
                    {
                        "tp_size": a.tp_size,
                        "attn_cp_size": a.attn_cp_size,
                        "page_size": a.page_size,
                        "port": a.port,
                        "standin": {
                            "pid": os.getpid(),
                            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
                            "last_generate_keys": state.last_generate_keys,
                            "generated": state.generated,
                        },
                    },
                )
            elif self.path == "/flush_cache":
                self._flush()
            else:
                self._answer(404, {"message": f"no {self.path}"})

        def do_POST(self) -> None:  # noqa: N802
            if self.path == "/generate":
                self._generate(self._body())
            elif self.path == "/flush_cache":
                self._body()
                self._flush()
            elif self.path == "/standin/control":
                self._control(self._body())
            else:
                self._answer(404, {"message": f"no {self.path}"})

        def _flush(self) -> None:
            with state.lock:
                if state.running:
                    self._answer(400, "Cache not flushed: requests are running.\n")
                    return
                state.cache.clear()
            self._answer(200, "Cache flushed.\n")

        def _control(self, body: object) -> None:
            assert isinstance(body, dict)
            state.publisher.drop |= set(body.get("drop", ()))
            state.publisher.forget |= set(body.get("forget", ()))
            state.delay = float(body.get("delay", state.delay))
            if "crash" in body:
                self._answer(200, {"crashing": body["crash"]})
                self.wfile.flush()
                crash(int(body["crash"]), "POST /standin/control")
            self._answer(200, {"ok": True})

        def _generate(self, body: object) -> None:
            started = time.perf_counter()
            if not isinstance(body, dict) or not isinstance(body.get("input_ids"), list):
                self._error("input_ids: a list of token ids is required")
                return
            ids = body["input_ids"]
            if not ids or any(not isinstance(t, int) or not 0 <= t < state.vocab for t in ids):
                self._error(f"input_ids: token ids must be in [0, {state.vocab})")
                return
            with state.lock:
                state.last_generate_keys = sorted(body)
                state.running += 1
                cached = state.cache.prefill(ids)
            try:
                time.sleep(state.delay)
            finally:
                with state.lock:
                    state.running -= 1
                    state.generated += 1
                    n = state.generated
            if state.crash_after is not None and n >= state.crash_after:
                crash(3, f"STANDIN_CRASH_AFTER={state.crash_after}")
            digest = hashlib.sha256(json.dumps(ids).encode()).digest()
            self._answer(
                200,
                {
                    "text": "",
                    "output_ids": [int.from_bytes(digest[:4], "big") % state.vocab],
                    "meta_info": {
                        "id": f"standin-{n}",
                        "prompt_tokens": len(ids),
                        "cached_tokens": cached,
                        "completion_tokens": 1,
                        "finish_reason": {"type": "length", "length": 1},
                        "e2e_latency": time.perf_counter() - started,
                    },
                },
            )

    return Handler


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="sglang_standin", allow_abbrev=False)
    p.add_argument("--model-path", required=True)
    p.add_argument("--tp-size", type=int, default=1)
    p.add_argument("--attn-cp-size", type=int, default=1)
    p.add_argument("--page-size", type=int, default=1)
    p.add_argument("--kv-events-config", default=None)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    args, _ = p.parse_known_args(argv)  # the rest of SGLang's flags are accepted and ignored
    code = os.environ.get("STANDIN_EXIT_AT_START")
    if code:
        _say("failing at start as asked (STANDIN_EXIT_AT_START)")
        return int(code)
    if os.environ.get("STANDIN_IGNORE_SIGTERM"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.kv_events_config is None:
        _say("--kv-events-config is required here (the adapter always sets it)")
        return 2
    state = State(args, json.loads(args.kv_events_config))
    parent = os.getppid()

    def watch_parent() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(0)

    threading.Thread(target=watch_parent, daemon=True).start()
    httpd = ThreadingHTTPServer((args.host, args.port), handler(state))
    httpd.daemon_threads = True
    _say(
        f"tp_size={args.tp_size} attn_cp_size={args.attn_cp_size} page_size={args.page_size} "
        f"on {args.host}:{args.port}, pid {os.getpid()}"
    )
    httpd.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
