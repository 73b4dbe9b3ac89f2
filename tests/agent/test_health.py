"""Agent health checks: HTTP, TCP and command probes, the per-replica checker, the
task's ``check`` field and the report's ``healthy`` flag (omitted when None)."""

from __future__ import annotations

import http.server
import socket
import sys
import threading
from collections.abc import Iterator, Mapping

import pytest
from pydantic import ValidationError

from forge.agent.health import Checker, probe, resolve_port
from forge.core.models import HealthCheck, Task
from forge.stores.base import TaskReport


@pytest.fixture
def web() -> Iterator[int]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/ok" else 503)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def check(**kw: object) -> HealthCheck:
    return HealthCheck.model_validate({"timeout": 2.0, **kw})


def test_http_check_passes_on_the_expected_status_only(web: int) -> None:
    assert probe(check(http={"port": "http", "path": "/ok"}), {"HTTP": web})
    assert not probe(check(http={"port": web, "path": "/bad"}), {})
    assert probe(check(http={"port": web, "path": "/bad", "status": 503}), {})
    assert not probe(check(http={"port": closed_port()}), {})
    assert not probe(check(http={"port": "missing"}), {})  # no such named port


def test_tcp_check_passes_when_a_connection_opens(web: int) -> None:
    assert probe(check(tcp={"port": web}), {})
    assert not probe(check(tcp={"port": closed_port()}), {})


def test_command_check_passes_on_exit_zero_within_its_timeout() -> None:
    assert probe(check(command=[sys.executable, "-c", "pass"]), {})
    assert not probe(check(command=[sys.executable, "-c", "raise SystemExit(3)"]), {})
    slow = check(command=[sys.executable, "-c", "import time; time.sleep(30)"], timeout=0.3)
    assert not probe(slow, {})
    assert not probe(check(command=["/nonexistent/forge-check"]), {})


def test_checker_runs_when_due_and_reports_changes_only() -> None:
    answers = iter([True, True, False, False, True])

    def run(c: HealthCheck, ports: Mapping[str, int]) -> bool:
        return next(answers)

    ck = Checker(run=run)
    c = check(tcp={"port": 1}, interval=5.0)
    assert ck.tick("w", c, {}, now=0.0) is True  # the first verdict
    assert ck.tick("w", c, {}, now=1.0) is None  # not due
    assert ck.tick("w", c, {}, now=5.0) is None  # due, unchanged
    assert ck.tick("w", c, {}, now=10.0) is False
    assert ck.tick("w", c, {}, now=15.0) is None
    ck.forget("w")
    assert ck.tick("w", c, {}, now=16.0) is True  # a fresh start is reported


def test_a_check_is_exactly_one_kind_and_names_a_port_of_its_task() -> None:
    with pytest.raises(ValidationError, match="exactly one of http, tcp or command"):
        HealthCheck.model_validate({})
    with pytest.raises(ValidationError, match="exactly one"):
        HealthCheck.model_validate({"tcp": {"port": 1}, "command": ["true"]})
    base = {"name": "t", "resources": {"cpu": 1, "memory": 1}}
    with pytest.raises(ValidationError, match="not one of the task's ports"):
        Task.model_validate({**base, "check": {"tcp": {"port": "web"}}})
    t = Task.model_validate({**base, "ports": ["WEB"], "check": {"http": {"port": "web"}}})
    assert t.check is not None and resolve_port("web", {"WEB": 8080}) == 8080
    # a task without a check dumps as before (its version digest is unchanged)
    assert "check" not in Task.model_validate(base).model_dump_json()


def test_the_healthy_flag_is_left_out_of_a_report_without_a_check() -> None:
    plain = TaskReport(workload_id="j/g/0", status="running", at=1.0)
    assert "healthy" not in plain.model_dump_json()
    checked = plain.model_copy(update={"healthy": False})
    assert '"healthy":false' in checked.model_dump_json()
    assert TaskReport.model_validate_json(checked.model_dump_json()).healthy is False
