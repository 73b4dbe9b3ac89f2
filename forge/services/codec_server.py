"""``forge codec-server``: Temporal's remote codec protocol over Forge's payload codec.

Forge compresses every payload of 512 bytes or more (:mod:`forge.wire.codec`), so
nothing outside a Forge process can read them: the Web UI shows base64, its
"current details" and queries stay blank, and ``temporal workflow query`` prints
blobs. Temporal's answer is a codec server, a small HTTP service the UI and the
CLI (``--codec-endpoint``) call to turn stored payloads back into readable ones:

- ``POST .../decode`` and ``POST .../encode`` take and return
  ``{"payloads": [...]}``, the ``Payloads`` protobuf in its JSON form (metadata
  values and data base64). Only the last path segment counts, so the CLI's
  ``http://host:port/{namespace}`` template works too; ``X-Namespace`` is accepted
  and ignored (one codec serves every namespace).
- A body that is not ``Payloads`` JSON, or a payload the codec cannot decode,
  answers 400, as the protocol asks; the message says what was wrong.
- ``GET /health`` answers 200, for compose health checks and readiness polls.

Why it is built this way:

- **The standard library's threaded HTTP server.** The codec is CPU work on small
  bodies; a thread per connection is plenty and needs no new dependency.
- **CORS only for the UI's origin.** The Web UI calls the codec server from the
  browser, so the browser asks first (``OPTIONS``); only the origins given with
  ``--allow-origin`` get an answer that lets the page read the reply.
- **Loopback by default, an optional token.** With ``--auth-file`` (or
  ``FORGE_CODEC_TOKEN``) every ``POST`` must carry ``Authorization: Bearer TOKEN``
  (the UI's form) or the bare token (``temporal --codec-auth TOKEN``). A preflight
  never carries credentials, so it is answered without them.
- **Decryption only for whom the token admits.** With payload encryption keys
  (``FORGE_CODEC_KEYS`` / ``FORGE_CODEC_KEY_FILE``, :mod:`forge.wire.encryption`)
  this server can read every payload of the namespace, so it refuses to start on a
  non-loopback address without a token: that would hand the plaintext to anyone
  who reaches the port. On loopback it may run without one: only this machine's
  users reach it, and ``forge dev`` needs that (the dev server's UI cannot send a
  static token). On a machine shared with people who must not read the history,
  give it a token there too.
  ``--allow-no-auth`` overrides the refusal for a listener that something else
  guards (a container port published on the host's loopback only).
- **Bounded work per request.** A body over ``MAX_BODY`` is refused before it is
  read, and one payload may inflate to at most ``MAX_DECODED`` bytes, so a tiny
  zlib bomb cannot take the process down.
"""

from __future__ import annotations

import ipaddress
import signal
import sys
import threading
from collections.abc import Iterable
from pathlib import Path
from types import FrameType, TracebackType

from temporalio.converter import PayloadCodec

from forge.services.codec_http import (
    ALLOWED_HEADERS,
    DEFAULT_PORT,
    MAX_BODY,
    MAX_DECODED,
    CodecHTTPServer,
    CodecServerConfig,
)
from forge.wire.codec import codec_chain
from forge.wire.encryption import CodecKeys

__all__ = [
    "ALLOWED_HEADERS",
    "DEFAULT_PORT",
    "DESCRIPTION",
    "MAX_BODY",
    "MAX_DECODED",
    "TOKEN_ENV",
    "CodecServer",
    "CodecServerConfig",
    "run",
]

TOKEN_ENV = "FORGE_CODEC_TOKEN"

DESCRIPTION = f"""\
Serve Temporal's remote codec protocol (POST /decode, POST /encode) with Forge's
payload codec, so the Temporal Web UI and `temporal ... --codec-endpoint URL` show
Forge's compressed (and, with keys, encrypted) payloads as readable JSON. `forge
dev` starts one for you.

  forge codec-server --allow-origin http://localhost:8233
  temporal workflow query -w forge-cluster-default --name status \\
      --codec-endpoint http://127.0.0.1:{DEFAULT_PORT}

Point the Web UI at it with `temporal server start-dev --ui-codec-endpoint URL`,
TEMPORAL_CODEC_ENDPOINT for the temporalio/ui image, or the UI's "Codec Server"
setting. The token for --auth-file may also come from {TOKEN_ENV}.

Decryption keys come from FORGE_CODEC_KEYS / FORGE_CODEC_KEY_FILE, as for the
worker. With keys, a --host off loopback needs a token (--auth-file or
{TOKEN_ENV}), or --allow-no-auth when something else guards the port.
Stops on Ctrl-C or SIGTERM.
"""


class CodecServer:
    """A running codec server. ``with CodecServer(config):`` serves from a thread
    (tests, embedding); :func:`run` serves the ``forge codec-server`` command."""

    def __init__(
        self,
        config: CodecServerConfig,
        codec: PayloadCodec | None = None,
        *,
        keys: CodecKeys | None = None,
    ) -> None:
        """``codec`` replaces Forge's chain (tests); else compression, then
        encryption with ``keys`` (none: compression only), the worker's chain."""
        self.keys = keys or CodecKeys()
        codec = codec or codec_chain(self.keys, max_decoded=MAX_DECODED)
        self._server = CodecHTTPServer(config, codec)
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        host = self._server.config.host
        if host in ("0.0.0.0", "::", ""):
            host = "127.0.0.1"
        elif ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}"

    def start(self) -> CodecServer:
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="forge-codec-server", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
            self._thread = None
        self._server.server_close()

    def __enter__(self) -> CodecServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


# ------------------------------------------------------------------------- command


def _token(path: Path | None, from_env: str) -> str:
    from forge.settings import SettingsError

    if path is None:
        return from_env.strip()
    try:
        token = path.read_text().strip()
    except OSError as err:
        raise SettingsError(f"--auth-file {path}: {err.strerror or err}") from None
    if not token:
        raise SettingsError(f"--auth-file {path} is empty")
    return token


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def run(
    *,
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    allow_origin: Iterable[str] = (),
    auth_file: Path | None = None,
    allow_no_auth: bool = False,
) -> int:
    """Entry point from ``forge codec-server`` (the flags are defined in
    :mod:`forge.cli.services`); serves until SIGINT/SIGTERM."""
    from forge.settings import Settings, SettingsError

    settings = Settings.from_env()  # SettingsError -> exit 2 in forge.cli
    keys = settings.encryption_keys()
    config = CodecServerConfig(
        host=host,
        port=port,
        origins=frozenset(allow_origin),
        token=_token(auth_file, settings.codec_token),
    )
    exposed = not _is_loopback(config.host) and not config.token
    if keys and exposed and not allow_no_auth:
        raise SettingsError(
            f"codec-server: --host {config.host} is not loopback and there is no token, "
            f"so anyone who reaches the port could decrypt Forge's payloads (codec keys "
            f"{', '.join(keys.ids)}); pass --auth-file FILE (or set {TOKEN_ENV}), listen on "
            "127.0.0.1, or add --allow-no-auth if something else guards the port"
        )
    try:
        server = CodecServer(config, keys=keys)
    except OSError as err:
        where = f"{config.host}:{config.port}"
        hint = "; pick another with --port" if err.errno in (98, 48) else ""
        message = f"forge codec-server: cannot listen on {where}: {err.strerror}{hint}"
        print(message, file=sys.stderr)
        return 1
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.start()
        origins = ", ".join(sorted(config.origins)) or "none (CLI only)"
        auth = "token required" if config.token else "none"
        crypt = f"keys {', '.join(keys.ids)} (current {keys.current})" if keys else "off"
        print(
            f"forge codec-server: listening on {server.url} (POST /decode, /encode); "
            f"browser origins: {origins}; auth: {auth}; encryption: {crypt}",
            flush=True,
        )
        if exposed:
            print(
                f"forge codec-server: warning: listening on {config.host} without a token; "
                f"anyone who reaches port {server.port} can use the codec",
                file=sys.stderr,
                flush=True,
            )
        stop.wait()
    finally:
        server.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    print("forge codec-server: stopped", flush=True)
    return 0
