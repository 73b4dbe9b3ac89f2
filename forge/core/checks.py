"""A task's named ports, its stop grace and its health check: what the agent needs
beyond the command to run a task and to tell that it serves."""

from __future__ import annotations

from typing import Annotated, Self

from pydantic import Field, Strict, model_validator

from forge.core.fields import Model, ShortStr
from forge.core.limits import MAX_ARGS

__all__ = ["STOP_GRACE", "HealthCheck", "HttpCheck", "PortName", "TcpCheck"]


#: A named port a task asks for: it becomes ``FORGE_PORT_<NAME>`` (upper-cased).
PortName = Annotated[
    str, Field(pattern=r"^[A-Za-z][A-Za-z0-9_]{0,31}$", description="1-32 of [A-Za-z0-9_]")
]
#: The default time a task gets between SIGTERM and SIGKILL when it is stopped.
STOP_GRACE = 10.0


class HttpCheck(Model):
    """Healthy when ``GET http://127.0.0.1:<port><path>`` answers ``status``."""

    port: PortName | Annotated[int, Strict(), Field(ge=1, le=65535)]
    path: Annotated[str, Field(pattern=r"^/[^\s]*$", max_length=256)] = "/"
    status: Annotated[int, Strict(), Field(ge=100, le=599)] = 200


class TcpCheck(Model):
    """Healthy when a TCP connection to ``127.0.0.1:<port>`` opens."""

    port: PortName | Annotated[int, Strict(), Field(ge=1, le=65535)]


class HealthCheck(Model):
    """How the agent tells that a running task is healthy: exactly one of ``http``,
    ``tcp`` or ``command`` (exit 0), every ``interval`` seconds, each given
    ``timeout`` seconds. A port may be one of the task's named ports."""

    http: HttpCheck | None = None
    tcp: TcpCheck | None = None
    command: tuple[ShortStr, ...] | None = Field(default=None, min_length=1, max_length=MAX_ARGS)
    interval: Annotated[float, Strict(), Field(gt=0, le=3600)] = 10.0
    timeout: Annotated[float, Strict(), Field(gt=0, le=600)] = 2.0

    @model_validator(mode="after")
    def _exactly_one(self) -> Self:
        kinds = [k for k in ("http", "tcp", "command") if getattr(self, k) is not None]
        if len(kinds) != 1:
            raise ValueError(
                "check: give exactly one of http, tcp or command"
                + (f" (got {', '.join(kinds)})" if kinds else "")
            )
        return self
