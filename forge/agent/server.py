"""The agent's small HTTP API: task logs and what runs here.

``GET /v1/logs/JOB/GROUP/ORDINAL?task=NAME&offset=N`` returns the log bytes from
``offset`` and, in the ``X-Forge-Offset`` header, the offset to ask next: a
follower polls with it (``forge logs --follow``), and a rotation (the file shrank
under the offset) restarts from the beginning of the new file.
``GET /v1/replicas`` lists the replicas with their state, ports and usage.

On a loopback address anyone on the machine may read, as with the log files
themselves; on any other address every request needs ``Authorization: Bearer
TOKEN``.
"""

from __future__ import annotations

import hmac
import json
import threading
from collections.abc import Callable
from dataclasses import asdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from forge.agent.agent import ReplicaView
from forge.agent.logfiles import read_from
from forge.core.models import is_valid_name

__all__ = ["LogServer"]


class LogServer:
    def __init__(
        self,
        address: str,
        data_dir: Path,
        views: Callable[[], list[ReplicaView]],
        token: str = "",
    ) -> None:
        host, _, port = address.rpartition(":")
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server._handle(self)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # the agent logs its own events; access lines would drown them

        self._views = views
        self._token = token
        self._root = data_dir / "logs"
        self.httpd = ThreadingHTTPServer((host.strip("[]"), int(port)), Handler)
        self.httpd.daemon_threads = True
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def address(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"{host!s}:{port}"

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def _handle(self, req: BaseHTTPRequestHandler) -> None:
        if self._token:
            given = req.headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {self._token}".encode()):
                return _send(req, 401, b"missing or wrong token\n")
        url = urlsplit(req.path)
        query = parse_qs(url.query)
        parts = url.path.strip("/").split("/")
        if parts == ["v1", "replicas"]:
            body = json.dumps([asdict(v) for v in self._views()]).encode()
            return _send(req, 200, body, "application/json")
        if len(parts) != 5 or parts[:2] != ["v1", "logs"]:
            return _send(req, 404, b"not found: use /v1/logs/JOB/GROUP/ORDINAL\n")
        job, group, ordinal = parts[2:]
        task = query.get("task", [""])[0]
        if not (is_valid_name(job) and is_valid_name(group) and ordinal.isdigit()):
            return _send(req, 400, b"bad workload id\n")
        folder = self._root / job / group / ordinal
        if task:
            if not is_valid_name(task):
                return _send(req, 400, b"bad task name\n")
            path = folder / f"{task}.log"
        else:
            found = sorted(folder.glob("*.log")) if folder.is_dir() else []
            if not found:
                return _send(req, 404, f"no logs of {job}/{group}/{ordinal} here\n".encode())
            path = found[0]
        try:
            offset = int(query.get("offset", ["0"])[0])
        except ValueError:
            return _send(req, 400, b"offset must be an integer\n")
        if not path.exists():
            return _send(req, 404, f"no log of task {task} of {job}/{group}/{ordinal}\n".encode())
        data, next_offset = read_from(path, max(0, offset))
        _send(req, 200, data, "application/octet-stream", {"X-Forge-Offset": str(next_offset)})


def _send(
    req: BaseHTTPRequestHandler,
    code: int,
    body: bytes,
    kind: str = "text/plain; charset=utf-8",
    headers: dict[str, str] | None = None,
) -> None:
    req.send_response(code)
    req.send_header("Content-Type", kind)
    req.send_header("Content-Length", str(len(body)))
    for k, v in (headers or {}).items():
        req.send_header(k, v)
    req.end_headers()
    req.wfile.write(body)
