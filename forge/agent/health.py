"""Health checks of running tasks: HTTP, TCP or a command, as the task declares.

A task's ``check`` (``forge.core.models.HealthCheck``) says how the agent tells that
a running replica is healthy; the agent reports the verdict in its task reports
(``TaskReport.healthy``), and the loop's rollouts count a replica healthy only
when it runs *and* its check passes. :class:`Checker` keeps, per replica, when its
check is next due and what the last one said; :func:`probe` runs one check.
"""

from __future__ import annotations

import http.client
import socket
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from forge.core.models import HealthCheck

__all__ = ["Checker", "probe", "resolve_port"]


def resolve_port(port: str | int, ports: Mapping[str, int]) -> int | None:
    """A check's port: a number, or one of the task's named ports (any case)."""
    if isinstance(port, int):
        return port
    by_name = {k.upper(): v for k, v in ports.items()}
    return by_name.get(port.upper())


def probe(
    check: HealthCheck,
    ports: Mapping[str, int],
    env: Mapping[str, str] | None = None,
    host: str = "127.0.0.1",
) -> bool:
    """Run ``check`` once: True when it passes within its timeout."""
    if check.http is not None:
        port = resolve_port(check.http.port, ports)
        if port is None:
            return False
        conn = http.client.HTTPConnection(host, port, timeout=check.timeout)
        try:
            conn.request("GET", check.http.path)
            return conn.getresponse().status == check.http.status
        except (OSError, http.client.HTTPException):
            return False
        finally:
            conn.close()
    if check.tcp is not None:
        port = resolve_port(check.tcp.port, ports)
        if port is None:
            return False
        try:
            with socket.create_connection((host, port), timeout=check.timeout):
                return True
        except OSError:
            return False
    assert check.command is not None
    try:
        done = subprocess.run(
            list(check.command),
            env=dict(env) if env is not None else None,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=check.timeout,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


@dataclass
class Checker:
    """Per replica: the last verdict and when the next check is due. ``run`` is
    :func:`probe` (a test passes its own)."""

    run: Callable[[HealthCheck, Mapping[str, int]], bool] = probe
    verdict: dict[str, bool] = field(default_factory=dict)
    due: dict[str, float] = field(default_factory=dict)

    def tick(
        self, wid: str, check: HealthCheck, ports: Mapping[str, int], now: float
    ) -> bool | None:
        """Check ``wid`` if due; returns the verdict when it changed (or is the
        first), None otherwise (nothing new to report)."""
        if now < self.due.get(wid, 0.0):
            return None
        self.due[wid] = now + check.interval
        ok = self.run(check, ports)
        changed = self.verdict.get(wid) != ok
        self.verdict[wid] = ok
        return ok if changed else None

    def forget(self, wid: str) -> None:
        """The replica ended: its next start is checked afresh."""
        self.verdict.pop(wid, None)
        self.due.pop(wid, None)
