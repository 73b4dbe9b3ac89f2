"""structlog set-up shared by the worker, ``forge dev`` and the CLI.

Console rendering on a terminal, JSON lines otherwise (log shippers parse them).
Values of keys that look like secrets are redacted before rendering, so a
credential that reaches a log call by accident never reaches the output: at any
depth of a logged mapping or list (a job's task ``env``), in pydantic models (logged
as their redacted fields), and inside strings (a URL's ``user:password@`` or
``?password=``).
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Mapping, MutableMapping
from typing import Any

import structlog
from pydantic import BaseModel

__all__ = ["REDACTED", "configure", "redact"]

REDACTED = "***"
_SECRET_WORDS = (
    "password", "secret", "token", "api_key", "apikey", "private_key", "codec_keys", "env",
)  # fmt: skip
_URL_PASSWORD = re.compile(r"(://[^:/@\s]*):[^@/\s]*@")
_QUERY_SECRET = re.compile(r"(?i)([?&](?:ssl)?(?:password|secret|token|api_key|apikey)=)[^&#\s]*")
_MAX_DEPTH = 10


def _secret(key: object) -> bool:
    return isinstance(key, str) and any(w in key.lower() for w in _SECRET_WORDS)


def _scrub(value: Any, depth: int = 0) -> Any:
    """``value`` with secret-keyed entries and credentials in strings redacted."""
    if isinstance(value, str):
        if "://" in value or "=" in value:
            value = _URL_PASSWORD.sub(rf"\1:{REDACTED}@", value)
            value = _QUERY_SECRET.sub(rf"\1{REDACTED}", value)
        return value
    if depth >= _MAX_DEPTH:
        return value
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    if isinstance(value, Mapping):
        return {k: REDACTED if _secret(k) else _scrub(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_scrub(v, depth + 1) for v in value]
    return value


def redact(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    for key in list(event):
        event[key] = REDACTED if _secret(key) else _scrub(event[key])
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
