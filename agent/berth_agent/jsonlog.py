"""Structured JSON logging for the agent: one JSON object per line on stdout (journald keeps it).

``setup()`` once at start; then ``logging.getLogger(__name__).info("claimed", extra={"job_id": j})``
puts ``job_id`` into the object. Job output never goes here: it goes to CloudWatch Logs (logship).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any, TextIO

# Attributes every LogRecord has; anything else came from ``extra=`` and is emitted as a field.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
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
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, separators=(",", ":"))


def setup(level: str = "INFO", stream: TextIO | None = None) -> None:
    """Route the root logger to ``stream`` (stdout by default) as JSON lines."""
    handler = logging.StreamHandler(stream or sys.stdout)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
