"""Errors a caller can fix; the engine stays up after either.

The gRPC service maps them to status codes (see :mod:`vertumnus.worker.service`).
"""

from __future__ import annotations

from collections.abc import Sequence


class InvalidRequest(ValueError):
    """The request itself is wrong (gRPC INVALID_ARGUMENT)."""


class NotReady(RuntimeError):
    """The request is fine but the engine's state forbids it now (gRPC FAILED_PRECONDITION)."""


def check_tokens(request_id: str, tokens: Sequence[int], max_tokens: int, vocab_size: int) -> None:
    """Raise :class:`InvalidRequest` naming what is wrong with a prefill's ``tokens``
    (empty, longer than the engine's ``max_tokens``, or an id outside the vocabulary):
    the same checks and messages from every engine, before any work starts."""
    if not tokens:
        raise InvalidRequest(f"request {request_id!r}: token_ids is empty")
    if len(tokens) > max_tokens:
        raise InvalidRequest(
            f"request {request_id!r}: {len(tokens)} tokens exceed the engine maximum of {max_tokens}"
        )
    bad = next((t for t in tokens if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise InvalidRequest(
            f"request {request_id!r}: token id {bad} outside the vocabulary [0, {vocab_size})"
        )
