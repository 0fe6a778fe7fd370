"""Validation of what clients send, at the edge: every error names the field.

A request that fails here never reaches the routing core or a worker; the
gRPC servicer turns :class:`BadRequest` into ``INVALID_ARGUMENT`` with the
message as is.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import numpy as np

__all__ = ["BadRequest", "check_prefill"]

_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")


class BadRequest(ValueError):
    """A malformed request; the message names the field and what is wrong with it."""


def check_prefill(
    request_id: str,
    token_ids: Sequence[int] | np.ndarray,
    ttft_slo_seconds: float,
    *,
    max_tokens: int,
    vocab_size: int,
) -> None:
    """Raise :class:`BadRequest` unless the prefill request is well formed."""
    if not _ID.match(request_id):
        shown = request_id if len(request_id) <= 40 else request_id[:40] + "..."
        raise BadRequest(
            f"request_id: must be 1 to 128 characters of letters, digits and '._:-', got {shown!r}"
        )
    n = len(token_ids)
    if n == 0:
        raise BadRequest(f"token_ids: empty (request {request_id})")
    if n > max_tokens:
        raise BadRequest(
            f"token_ids: {n} tokens, more than the pool's maximum of {max_tokens} (request {request_id})"
        )
    # The router passes the ids as an array: min/max in C (a long prompt's ids in a
    # Python loop would cost more than placing the request).
    ids = token_ids if isinstance(token_ids, np.ndarray) else np.asarray(token_ids)
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= vocab_size:
        i = int(np.flatnonzero((ids < 0) | (ids >= vocab_size))[0])
        bad = int(ids[i])
        raise BadRequest(
            f"token_ids[{i}]: {bad} is outside the vocabulary [0, {vocab_size}) (request {request_id})"
        )
    if not (math.isfinite(ttft_slo_seconds) and ttft_slo_seconds >= 0):
        raise BadRequest(
            f"ttft_slo_seconds: must be >= 0, got {ttft_slo_seconds} (request {request_id})"
        )
