"""The HTTP side of ``forge codec-server``: routing, CORS, auth and the body limits.

Split from :mod:`forge.services.codec_server` (the command and ``CodecServer``) so
each half reads on its own; the protocol and the reasons for each choice are in
that module's docstring.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import socket
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from google.protobuf import json_format
from temporalio.api.common.v1 import Payloads
from temporalio.converter import PayloadCodec

__all__ = [
    "ALLOWED_HEADERS",
    "DEFAULT_PORT",
    "MAX_BODY",
    "MAX_DECODED",
    "CodecHTTPServer",
    "CodecServerConfig",
]

DEFAULT_PORT = 8081
#: The largest request body read (Temporal's payload limit is 2 MiB; the CLI and
#: the UI send a handful of payloads per request).
MAX_BODY = 16 * 1024 * 1024
#: The most one payload may inflate to.
MAX_DECODED = 64 * 1024 * 1024
#: Request headers a browser may send cross-origin (the UI sends the first two,
#: and ``Authorization`` when it passes the user's access token).
ALLOWED_HEADERS = ("Content-Type", "X-Namespace", "Authorization")

_JSON = "application/json"


@dataclass(frozen=True)
class CodecServerConfig:
    """Where to listen and whom to answer. ``origins`` are exact browser origins
    (``scheme://host[:port]``) or ``*`` for any; ``token`` empty means no auth."""

    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    origins: frozenset[str] = frozenset()
    token: str = field(default="", repr=False)

    def allows(self, origin: str | None) -> bool:
        return origin is not None and ("*" in self.origins or origin in self.origins)


class _Refused(Exception):
    """A request answered with an error status; the message is the reply body."""

    def __init__(self, status: int, message: str, headers: Iterable[tuple[str, str]] = ()) -> None:
        super().__init__(message)
        self.status = status
        self.headers = list(headers)


class CodecHTTPServer(ThreadingHTTPServer):
    daemon_threads = True  # a stuck client must not hold up shutdown
    config: CodecServerConfig
    codec: PayloadCodec

    def __init__(self, config: CodecServerConfig, codec: PayloadCodec) -> None:
        if ":" in config.host:
            self.address_family = socket.AF_INET6
        self.config = config
        self.codec = codec
        super().__init__((config.host, config.port), _Handler)


class _Handler(BaseHTTPRequestHandler):
    server: CodecHTTPServer
    protocol_version = "HTTP/1.1"  # keep-alive: the CLI sends one request per event
    server_version = "forge-codec-server"
    # Headers and body go out in two writes; with Nagle's algorithm on, the body
    # waits for the client's delayed ACK, 40 ms per request (measured: 44 ms -> <1 ms).
    disable_nagle_algorithm = True

    # -- routing ------------------------------------------------------------------
    def do_OPTIONS(self) -> None:
        origin = self.headers.get("Origin")
        if not self.server.config.allows(origin):
            self._reply(403, _error(f"origin {origin!r} is not allowed (see --allow-origin)"))
            return
        headers = [
            ("Access-Control-Allow-Methods", "POST, OPTIONS"),
            ("Access-Control-Allow-Headers", ", ".join(ALLOWED_HEADERS)),
            ("Access-Control-Max-Age", "600"),
        ]
        if self.headers.get("Access-Control-Request-Private-Network") == "true":
            # Chrome asks before a page on a public address calls a loopback one
            headers.append(("Access-Control-Allow-Private-Network", "true"))
        self._reply(204, b"", headers)

    def do_POST(self) -> None:
        action = self._action()
        try:
            if action not in ("encode", "decode"):
                raise _Refused(
                    404, f"no such endpoint {self.path!r}: POST .../decode or .../encode"
                )
            self._check_auth()
            payloads = self._read_payloads()
            codec = self.server.codec
            run = codec.decode if action == "decode" else codec.encode
            try:
                out = asyncio.run(run(payloads))  # Forge's codec never awaits: no loop to share
            except Exception as err:
                raise _Refused(400, f"cannot {action}: {_describe(err)}") from None
        except _Refused as err:
            self._reply(err.status, _error(str(err)), err.headers)
            return
        self._reply(200, _to_json(out), [("Content-Type", _JSON)])

    def do_GET(self) -> None:
        if self._action() == "health":
            self._reply(200, b'{"status":"ok"}', [("Content-Type", _JSON)])
        elif self._action() in ("encode", "decode"):
            self._reply(405, _error("use POST"), [("Allow", "POST, OPTIONS")])
        else:
            self._reply(404, _error(f"no such endpoint {self.path!r}"))

    def _action(self) -> str:
        """The last path segment: the protocol lets the endpoints sit at any depth."""
        path = urlsplit(self.path).path.rstrip("/")
        return path.rsplit("/", 1)[-1]

    # -- checks ---------------------------------------------------------------------
    def _check_auth(self) -> None:
        token = self.server.config.token
        if not token:
            return
        given = self.headers.get("Authorization", "")
        if given.lower().startswith("bearer "):
            given = given[7:].strip()
        if not hmac.compare_digest(given.encode(), token.encode()):
            problem = "a wrong token" if given else "no Authorization header"
            raise _Refused(
                401,
                f"{problem}: send Authorization: Bearer TOKEN (temporal --codec-auth TOKEN)",
                [("WWW-Authenticate", 'Bearer realm="forge-codec"')],
            )

    def _read_payloads(self) -> list[Any]:
        length_text = self.headers.get("Content-Length")
        if length_text is None or not length_text.isdigit():
            raise _Refused(411, "a Content-Length header is required")
        length = int(length_text)
        if length > MAX_BODY:
            self.close_connection = True  # the unread body must not be parsed as a request
            raise _Refused(413, f"body of {length:,} bytes; the limit is {MAX_BODY:,}")
        body = self.rfile.read(length)
        message = Payloads()
        try:
            data = json.loads(body)
            if not isinstance(data, dict):  # json_format alone takes `[]` for no payloads
                raise ValueError(f"a JSON {type(data).__name__}, not an object")
            json_format.ParseDict(data, message, ignore_unknown_fields=True)
        except (json_format.ParseError, ValueError, RecursionError) as err:
            first = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise _Refused(
                400, f'the body is not Payloads JSON ({{"payloads": [...]}}): {first[:300]}'
            ) from None
        return list(message.payloads)

    # -- output ---------------------------------------------------------------------
    def _reply(self, status: int, body: bytes, headers: Iterable[tuple[str, str]] = ()) -> None:
        self.send_response(status)
        sent = {"content-type"} if status == 204 else set()
        for name, value in headers:
            self.send_header(name, value)
            sent.add(name.lower())
        if "content-type" not in sent:
            self.send_header("Content-Type", _JSON)
        origin = self.headers.get("Origin")
        if self.server.config.allows(origin):
            assert origin is not None
            self.send_header("Access-Control-Allow-Origin", origin)
            self.send_header("Access-Control-Allow-Credentials", "true")
        self.send_header("Vary", "Origin")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """One line per request, to stderr (the server's log): errors are what an
        operator looks for, so successful codec calls are not logged."""

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        if isinstance(code, int) and code >= 400:
            headers = getattr(self, "headers", None)  # absent on a malformed request line
            ns = headers.get("X-Namespace", "-") if headers is not None else "-"
            line = f'{self.address_string()} "{self.requestline}" {code} namespace={ns}'
            print(f"forge codec-server: {line}", file=sys.stderr, flush=True)


def _error(message: str) -> bytes:
    return json.dumps({"error": message}).encode()


def _to_json(payloads: Sequence[Any]) -> bytes:
    as_dict = json_format.MessageToDict(Payloads(payloads=payloads))
    return json.dumps({"payloads": as_dict.get("payloads", [])}, separators=(",", ":")).encode()


def _describe(err: Exception) -> str:
    text = str(err).splitlines()[0] if str(err) else ""
    return f"{type(err).__name__}: {text[:300]}" if text else type(err).__name__
