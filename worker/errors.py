"""Errors a caller can fix; the engine stays up after either.

The gRPC service maps them to status codes (see :mod:`vertumnus.worker.service`).
"""

from __future__ import annotations


class InvalidRequest(ValueError):
    """The request itself is wrong (gRPC INVALID_ARGUMENT)."""


class NotReady(RuntimeError):
    """The request is fine but the engine's state forbids it now (gRPC FAILED_PRECONDITION)."""
