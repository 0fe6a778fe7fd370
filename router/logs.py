"""Structured logs: one JSON object per line, with the request id on every line about a request.

Log calls pass context as ``extra`` (``request_id``, ``worker``, ``epoch``,
...); the formatter puts every such field into the object next to the time,
level, logger and message, so ``jq 'select(.request_id == "r-17")'`` follows
one request through placement, failures and its answer.
"""

from __future__ import annotations

import json
import logging
import sys
import time

__all__ = ["JsonFormatter", "configure_logging"]

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["error"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure_logging(fmt: str = "json", level: int = logging.INFO) -> None:
    """Log to stderr as JSON lines (``json``) or plain text (``text``)."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("vertumnus")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False
