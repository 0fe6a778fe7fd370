"""The adapter's HTTP calls to one SGLang server: ``/generate`` (one prefill) and ``/flush_cache``.

**Prefill** = ``POST /generate`` with SGLang's native request (``GenerateReqInput``):
``input_ids``, ``sampling_params`` ``{"max_new_tokens": 1, "temperature": 0.0}`` (greedy:
the first token is the argmax, as the torch engine's). The servers run with
``--disaggregation-mode prefill``, where a request names the decode server that
receives its KV (``bootstrap_host``, ``bootstrap_room``). Our ``Prefill`` RPC has no
decode peer, so the request carries SGLang's placeholder host ``2.2.2.2``
(``FAKE_BOOTSTRAP_HOST``, ``sglang/srt/disaggregation/utils.py``), which makes the
prefill server use its fake KV sender — what SGLang's own ``/health`` does in
disaggregation mode (``http_server.py``, ``health_generate``). Not verified on a GPU:
that such a request still inserts its pages into the radix cache (the GPU check,
``bench/gpu/sglang_check.py``, looks at ``cached_tokens`` on a repeat).

The answer is read as SGLang builds it: ``output_ids`` (the generated token ids) and
``meta_info`` with ``prompt_tokens``, ``cached_tokens`` (prefix tokens served from the
radix cache) and ``e2e_latency`` (seconds from the tokenizer manager receiving the
request to the answer) — the fields ``worker/http_surface.py`` emits for our torch
worker too. A field missing from the answer is an error naming it, not a guess.

**Flush** = ``POST /flush_cache``: 200 once the radix cache is reset, 400 when requests
are running or waiting (SGLang flushes only an idle server; ``http_server.py``,
``flush_cache``).

Errors: SGLang refusing a request (HTTP 400) → :class:`InvalidRequest`; a server that
does not answer → :class:`ServerUnreachable`; anything else → :class:`SglangError`.
Standard library only.
"""

from __future__ import annotations

import json
import secrets
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidRequest, NotReady
from ..pool import RankError

__all__ = [
    "FAKE_BOOTSTRAP_HOST",
    "FlushRefused",
    "Generated",
    "ServerUnreachable",
    "SglangClient",
    "SglangError",
]

FAKE_BOOTSTRAP_HOST = "2.2.2.2"
"""SGLang's placeholder decode host: no KV transfer (``disaggregation/utils.py``)."""


class SglangError(RankError):
    """The server answered with an error, or with something that is not SGLang's answer
    (gRPC INTERNAL, as a failed rank of the torch engine)."""


class ServerUnreachable(NotReady):
    """The server did not answer (not listening, reset, timed out)."""


class FlushRefused(NotReady):
    """``/flush_cache`` refused: requests are running or waiting on the server."""


@dataclass(frozen=True)
class Generated:
    """What one prefill returned."""

    first_token: int
    prompt_tokens: int
    cached_tokens: int
    e2e_latency: float  # seconds, as the server measured them
    round_trip: float  # seconds, as the adapter measured the HTTP call


def _message(body: bytes) -> str:
    """SGLang's error text: ``{"message": ...}`` or ``{"error": {"message": ...}}``."""
    try:
        doc = json.loads(body)
    except ValueError:
        return body.decode(errors="replace").strip()[:500]
    if isinstance(doc, dict):
        inner = doc.get("error")
        if isinstance(inner, dict) and "message" in inner:
            return str(inner["message"])
        if "message" in doc:
            return str(doc["message"])
    return json.dumps(doc)[:500]


class SglangClient:
    """HTTP calls to the server at ``http://host:port`` (loopback: the same container)."""

    def __init__(
        self,
        port: int,
        *,
        host: str = "127.0.0.1",
        timeout_s: float = 600.0,
        fake_bootstrap: bool = True,
    ) -> None:
        self.base = f"http://{host}:{port}"
        self.timeout_s = timeout_s
        self.fake_bootstrap = fake_bootstrap

    def _call(self, method: str, path: str, body: Any = None) -> tuple[int, bytes]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.base + path,
            data=data,
            method=method,
            headers={"Content-Type": "application/json"} if data is not None else {},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()
        except (OSError, ValueError) as e:  # refused, reset, timed out
            raise ServerUnreachable(
                f"{self.base}{path}: no answer ({getattr(e, 'reason', e)})"
            ) from None

    def generate(self, input_ids: list[int]) -> Generated:
        body: dict[str, Any] = {
            "input_ids": input_ids,
            "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
        }
        if self.fake_bootstrap:
            body["bootstrap_host"] = FAKE_BOOTSTRAP_HOST
            body["bootstrap_room"] = secrets.randbits(63)
        started = time.perf_counter()
        status, raw = self._call("POST", "/generate", body)
        round_trip = time.perf_counter() - started
        if status == 400:
            raise InvalidRequest(f"SGLang refused the prefill: {_message(raw)}")
        if status != 200:
            raise SglangError(f"{self.base}/generate: HTTP {status}: {_message(raw)}")
        try:
            doc = json.loads(raw)
            if isinstance(doc, list):  # a batch answer; we send one sequence
                doc = doc[0]
            ids, meta = doc["output_ids"], doc["meta_info"]
            return Generated(
                first_token=int(ids[0]),
                prompt_tokens=int(meta["prompt_tokens"]),
                cached_tokens=int(meta["cached_tokens"]),
                e2e_latency=float(meta.get("e2e_latency", round_trip)),
                round_trip=round_trip,
            )
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise SglangError(
                f"{self.base}/generate: not SGLang's answer (output_ids[0], "
                f"meta_info.prompt_tokens, meta_info.cached_tokens): {type(e).__name__} {e}"
            ) from None

    def flush_cache(self) -> None:
        status, raw = self._call("POST", "/flush_cache")
        if status == 400:
            raise FlushRefused(
                f"{self.base}/flush_cache refused: SGLang flushes only when no request is "
                f"running or waiting ({_message(raw)})"
            )
        if status != 200:
            raise SglangError(f"{self.base}/flush_cache: HTTP {status}: {_message(raw)}")
