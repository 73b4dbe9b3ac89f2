"""structlog set-up shared by the worker, ``forge dev`` and the CLI.

Console rendering on a terminal, JSON lines otherwise (log shippers parse them).
Values of keys that look like secrets are redacted before rendering, so a
credential that reaches a log call by accident never reaches the output.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog

__all__ = ["REDACTED", "configure", "redact"]

REDACTED = "***"
_SECRET_WORDS = ("password", "secret", "token", "api_key", "apikey", "private_key", "env")


def redact(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    for key in list(event):
        if any(w in key.lower() for w in _SECRET_WORDS):
            event[key] = REDACTED
    return event


def configure(fmt: str = "auto", level: int = logging.INFO) -> None:
    json_out = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    renderer: Any = (
        structlog.processors.JSONRenderer() if json_out else structlog.dev.ConsoleRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            redact,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    # the Temporal SDK logs through the standard library: keep it, at WARNING
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="%(name)s: %(message)s")
