"""``forge codec-server``: Temporal's remote codec protocol over Forge's payload codec,
spoken over real HTTP (an in-process server on a free port, and the command itself)."""

from __future__ import annotations

import asyncio
import base64
import json
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format
from temporalio.api.common.v1 import Payload, Payloads
from temporalio.converter import DataConverter

from forge.services.codec_server import MAX_BODY, MAX_DECODED, CodecServer, CodecServerConfig
from forge.wire import contract as c
from forge.wire.codec import ENCODING, ENCRYPTED, data_converter
from forge.wire.encryption import CodecKeys, format_key, new_key

FORGE = str(Path(sys.executable).parent / "forge")
UI = "http://localhost:8233"


def request(
    url: str,
    body: bytes | None = None,
    *,
    method: str = "POST",
    headers: dict[str, str] | None = None,
    **more: str,
) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url, data=body, method=method, headers={**(headers or {}), **more})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def as_json(payloads: list[Payload]) -> bytes:
    return json_format.MessageToJson(Payloads(payloads=payloads)).encode()


def from_json(body: bytes) -> list[Payload]:
    message = Payloads()
    json_format.Parse(body, message)
    return list(message.payloads)


def status_view(nodes: int) -> c.StatusView:
    """A real query result of Forge's contract, big enough to be compressed."""
    return c.StatusView(
        summary=c.Summary(
            desired=3, bound=2, pending=1, nodes=nodes, jobs=1, passes=7, generation=1,
            last_pass_at=12.5, last_pass="placed 2",
        ),
        nodes=[
            c.NodeView(
                id=f"node-{i}", state="ready", cpu=c.ResourceView(capacity=4000, allocated=500),
                memory=c.ResourceView(capacity=8192, allocated=256),
                gpus=c.GpuView(total=0, allocated=0), replicas=1,
            )
            for i in range(nodes)
        ],
        pending=[],
    )  # fmt: skip


def forge_encode(value: Any) -> list[Payload]:
    return asyncio.run(data_converter().encode([value]))


@pytest.fixture
def server() -> Iterator[CodecServer]:
    with CodecServer(CodecServerConfig(port=0, origins=frozenset({UI}))) as s:
        yield s


@pytest.fixture
def locked() -> Iterator[CodecServer]:
    config = CodecServerConfig(port=0, origins=frozenset({UI}), token="s3cret-token")
    with CodecServer(config) as s:
        yield s


# ------------------------------------------------------------------------ protocol


def test_decode_makes_a_forge_payload_readable_by_the_default_converter(
    server: CodecServer,
) -> None:
    view = status_view(nodes=20)
    encoded = forge_encode(view)
    assert encoded[0].metadata["encoding"] == ENCODING  # what the UI sees without a codec
    with pytest.raises(Exception, match="binary/zlib"):
        asyncio.run(DataConverter.default.decode(encoded))

    status, headers, body = request(
        f"{server.url}/decode", as_json(encoded), headers={"Content-Type": "application/json"}
    )
    assert status == 200 and headers["Content-Type"] == "application/json"
    wire = json.loads(body)["payloads"][0]
    assert base64.b64decode(wire["metadata"]["encoding"]) == b"json/plain"  # proto3 JSON
    [plain] = asyncio.run(DataConverter.default.decode(from_json(body)))
    assert plain == view.model_dump(mode="json")


def test_encode_compresses_what_decode_restores_and_leaves_small_payloads_alone(
    server: CodecServer,
) -> None:
    big, small = forge_encode(status_view(nodes=30))[0], forge_encode("tiny")[0]
    plain = asyncio.run(data_converter().payload_codec.decode([big]))  # type: ignore[union-attr]

    status, _, body = request(f"{server.url}/encode", as_json([plain[0], small]))
    assert status == 200
    encoded = from_json(body)
    assert encoded[0].metadata["encoding"] == ENCODING
    assert len(encoded[0].data) < len(plain[0].data) / 3
    assert encoded[1] == small

    status, _, body = request(f"{server.url}/decode", as_json(encoded))
    assert status == 200 and from_json(body) == [plain[0], small]


def test_only_the_last_path_segment_names_the_endpoint(server: CodecServer) -> None:
    payload = as_json(forge_encode(status_view(nodes=10)))
    for path in ("/decode", "/default/decode", "/any/depth/decode/", "/decode?x=1"):
        status, _, body = request(server.url + path, payload, headers={"X-Namespace": "default"})
        assert status == 200, path
        assert "binary/zlib" not in str(from_json(body)[0].metadata)
    assert request(f"{server.url}/decoder", payload)[0] == 404
    assert request(f"{server.url}/decode", method="GET")[0] == 405
    status, _, body = request(f"{server.url}/health", method="GET")
    assert status == 200 and json.loads(body) == {"status": "ok"}


def test_an_empty_payload_list_is_answered_with_an_empty_list(server: CodecServer) -> None:
    status, _, body = request(f"{server.url}/decode", b'{"payloads":[]}')
    assert status == 200 and json.loads(body) == {"payloads": []}


@pytest.mark.parametrize(
    "body",
    [b"not json", b'{"payloads": 3}', b'{"payloads": [{"data": 5}]}', b"[]"],
    ids=["not-json", "not-a-list", "data-not-a-string", "not-an-object"],
)
def test_a_body_that_is_not_payloads_json_is_a_400_that_says_so(
    server: CodecServer, body: bytes
) -> None:
    status, _, reply = request(f"{server.url}/decode", body)
    assert status == 400
    assert "not Payloads JSON" in json.loads(reply)["error"]


def test_a_payload_the_codec_cannot_decode_is_a_400(server: CodecServer) -> None:
    broken = Payload(metadata={"encoding": ENCODING}, data=b"not zlib at all")
    status, _, reply = request(f"{server.url}/decode", as_json([broken]))
    assert status == 400 and "cannot decode" in json.loads(reply)["error"]


def test_a_zlib_bomb_is_refused_without_inflating_it(server: CodecServer) -> None:
    inner = Payload(metadata={"encoding": b"binary/plain"}, data=b"\0" * (MAX_DECODED + 1024))
    bomb = Payload(metadata={"encoding": ENCODING}, data=zlib.compress(inner.SerializeToString()))
    assert len(bomb.data) < 200_000
    start = time.monotonic()
    status, _, reply = request(f"{server.url}/decode", as_json([bomb]))
    assert status == 400 and "inflates past" in json.loads(reply)["error"]
    assert time.monotonic() - start < 5


def test_a_body_over_the_limit_is_refused_before_it_is_read(server: CodecServer) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(
            b"POST /decode HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {MAX_BODY + 1}\r\n\r\n".encode()
        )
        reply = s.recv(4096).decode()
    assert reply.startswith("HTTP/1.1 413")


# ---------------------------------------------------------------------------- CORS


def test_the_preflight_lets_the_ui_send_its_headers(server: CodecServer) -> None:
    status, headers, _ = request(
        f"{server.url}/decode",
        method="OPTIONS",
        Origin=UI,
        headers={
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type,x-namespace,authorization",
        },
    )
    assert status == 204
    assert headers["Access-Control-Allow-Origin"] == UI
    allowed = {h.strip().lower() for h in headers["Access-Control-Allow-Headers"].split(",")}
    assert {"content-type", "x-namespace", "authorization"} <= allowed
    assert "POST" in headers["Access-Control-Allow-Methods"]


def test_other_origins_get_no_cors_grant(server: CodecServer) -> None:
    evil = "http://evil.example"
    status, headers, _ = request(f"{server.url}/decode", method="OPTIONS", Origin=evil)
    assert status == 403 and "Access-Control-Allow-Origin" not in headers
    status, headers, _ = request(f"{server.url}/decode", b'{"payloads":[]}', Origin=evil)
    assert "Access-Control-Allow-Origin" not in headers
    status, headers, _ = request(f"{server.url}/decode", b'{"payloads":[]}', Origin=UI)
    assert status == 200 and headers["Access-Control-Allow-Origin"] == UI


def test_a_star_origin_grants_any_origin() -> None:
    with CodecServer(CodecServerConfig(port=0, origins=frozenset({"*"}))) as s:
        _, headers, _ = request(f"{s.url}/decode", method="OPTIONS", Origin="http://a.example")
    assert headers["Access-Control-Allow-Origin"] == "http://a.example"


# ---------------------------------------------------------------------------- auth


def test_with_a_token_a_request_without_it_is_refused(locked: CodecServer) -> None:
    body = b'{"payloads":[]}'
    status, headers, reply = request(f"{locked.url}/decode", body, Origin=UI)
    assert status == 401 and "no Authorization header" in json.loads(reply)["error"]
    assert headers["WWW-Authenticate"].startswith("Bearer")
    assert headers["Access-Control-Allow-Origin"] == UI  # so the UI can show the 401
    status, _, _ = request(f"{locked.url}/decode", body, Authorization="Bearer wrong")
    assert status == 401
    status, _, _ = request(f"{locked.url}/encode", body, Authorization="s3cret-token-")
    assert status == 401


def test_with_a_token_the_ui_form_and_the_cli_form_are_accepted(locked: CodecServer) -> None:
    body = b'{"payloads":[]}'
    assert request(f"{locked.url}/decode", body, Authorization="Bearer s3cret-token")[0] == 200
    assert request(f"{locked.url}/decode", body, Authorization="s3cret-token")[0] == 200
    # a preflight never carries credentials
    assert request(f"{locked.url}/decode", method="OPTIONS", Origin=UI)[0] == 204


# ---------------------------------------------------------------------- encryption


KEYS = CodecKeys.parse(format_key("cs-1", new_key()))


@pytest.fixture
def decrypting() -> Iterator[CodecServer]:
    """A codec server with the keys and a token: the one that reads history."""
    config = CodecServerConfig(port=0, origins=frozenset({UI}), token="s3cret-token")
    with CodecServer(config, keys=KEYS) as s:
        yield s


def test_with_keys_decode_turns_an_encrypted_payload_into_plain_json(
    decrypting: CodecServer,
) -> None:
    view = status_view(nodes=20)
    encrypted = asyncio.run(data_converter(KEYS).encode([view]))
    assert encrypted[0].metadata["encoding"] == ENCRYPTED
    status, _, body = request(
        f"{decrypting.url}/decode", as_json(encrypted), Authorization="Bearer s3cret-token"
    )
    assert status == 200, body
    [plain] = asyncio.run(DataConverter.default.decode(from_json(body)))
    assert plain == view.model_dump(mode="json")
    # and /encode encrypts what the UI or the CLI sends (a signal's input)
    [small] = asyncio.run(DataConverter.default.encode(["node-7"]))
    status, _, body = request(
        f"{decrypting.url}/encode", as_json([small]), Authorization="s3cret-token"
    )
    [sealed] = from_json(body)
    assert status == 200 and sealed.metadata["encoding"] == ENCRYPTED
    assert b"node-7" not in sealed.data


def test_with_keys_a_request_without_the_token_gets_no_plaintext(decrypting: CodecServer) -> None:
    secret = "sk-in-a-payload-0042"
    encrypted = asyncio.run(data_converter(KEYS).encode([{"env": {"K": secret}}]))
    given: list[dict[str, str]] = [
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": "s3cret-tokenX"},
    ]
    for headers in given:
        for action in ("decode", "encode"):
            url = f"{decrypting.url}/{action}"
            status, _, reply = request(url, as_json(encrypted), headers=headers)
            assert status == 401, (action, headers)
            assert secret not in reply.decode() and "payloads" not in json.loads(reply)


def test_without_the_key_a_decode_says_which_key_it_needs(server: CodecServer) -> None:
    encrypted = asyncio.run(data_converter(KEYS).encode([status_view(nodes=3)]))
    status, _, reply = request(f"{server.url}/decode", as_json(encrypted))
    assert status == 400
    error = json.loads(reply)["error"]
    assert "CodecKeyError" in error and "'cs-1'" in error and "FORGE_CODEC_KEY_FILE" in error


# ------------------------------------------------------------------------- command


def _start(argv: list[str], env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], str]:
    proc, line = _start_line(argv, env)
    return proc, line.split("listening on ", 1)[1].split()[0]


def _start_line(
    argv: list[str], env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[str], str]:
    """The command started, and its first line (where it listens, auth, encryption)."""
    proc = subprocess.Popen(
        [FORGE, "codec-server", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()  # the first line says where it listens
    assert "listening on http://" in line, (line, proc.stderr.read() if proc.stderr else "")
    return proc, line


def test_the_command_serves_until_sigterm_with_a_token_from_a_file(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("from-a-file\n")
    proc, url = _start(["--port", "0", "--auth-file", str(token), "--allow-origin", UI])
    try:
        body = as_json(forge_encode(status_view(nodes=10)))
        assert request(f"{url}/decode", body)[0] == 401
        status, _, reply = request(f"{url}/decode", body, Authorization="Bearer from-a-file")
        assert status == 200 and "binary/zlib" not in str(from_json(reply))
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "stopped" in out and "Traceback" not in err
    assert "401" in err  # refusals are logged; successes are not
    assert "from-a-file" not in out + err


def test_the_command_takes_its_token_from_the_environment() -> None:
    import os

    env = {**os.environ, "FORGE_CODEC_TOKEN": "env-token"}
    proc, url = _start(["--port", "0"], env)
    try:
        assert request(f"{url}/decode", b'{"payloads":[]}')[0] == 401
        assert request(f"{url}/decode", b'{"payloads":[]}', Authorization="env-token")[0] == 200
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=20)
    assert proc.returncode == 0


def test_a_port_in_use_is_one_line_and_exit_1() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = subprocess.run(
            [FORGE, "codec-server", "--port", str(port)], capture_output=True, text=True, timeout=30
        )
    assert proc.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in proc.stderr and "--port" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (["--port", "70000"], "--port"),
        (["--port", "http"], "--port"),
        (["--allow-origin", "localhost:8233"], "--allow-origin"),
        (["--allow-origin", "http://localhost:8233/namespaces"], "--allow-origin"),
        (["--auth-file", "/nonexistent/token"], "--auth-file"),
    ],
)
def test_bad_flags_exit_2_naming_the_flag(argv: list[str], names: str, tmp_path: Path) -> None:
    proc = subprocess.run(
        [FORGE, "codec-server", *argv], capture_output=True, text=True, timeout=30
    )
    assert proc.returncode == 2, proc.stderr
    assert names in proc.stderr and "Traceback" not in proc.stderr


def test_an_empty_token_file_is_refused(tmp_path: Path) -> None:
    empty = tmp_path / "token"
    empty.write_text("  \n")
    proc = subprocess.run(
        [FORGE, "codec-server", "--auth-file", str(empty)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2 and "is empty" in proc.stderr


def test_requests_on_one_connection_are_not_held_back_by_delayed_acks(server: CodecServer) -> None:
    """The UI and the CLI send one request per payload over a kept-alive connection;
    with Nagle's algorithm on, each reply waited ~40 ms for the client's delayed ACK."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    body = as_json(forge_encode(status_view(nodes=5)))
    start = time.monotonic()
    for _ in range(20):
        conn.request("POST", "/decode", body, {"Content-Type": "application/json"})
        reply = conn.getresponse()
        assert reply.status == 200
        reply.read()
    conn.close()
    assert (time.monotonic() - start) / 20 < 0.025  # ~0.3 ms here; 44 ms with the bug


# ------------------------------------------------------- the command, with keys


def _keyed_env(tmp_path: Path, **more: str) -> dict[str, str]:
    import os

    path = tmp_path / "codec.key"
    path.write_text(format_key("cmd-1", new_key()) + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORGE_")}
    return {**env, "FORGE_CODEC_KEY_FILE": str(path), **more}


def test_an_encrypting_server_off_loopback_without_a_token_refuses_to_start(
    tmp_path: Path,
) -> None:
    proc = subprocess.run(
        [FORGE, "codec-server", "--host", "0.0.0.0", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=30,
        env=_keyed_env(tmp_path),
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "not loopback and there is no token" in proc.stderr and "--auth-file" in proc.stderr
    assert "cmd-1" in proc.stderr and "Traceback" not in proc.stderr
    assert "listening" not in proc.stdout


@pytest.mark.parametrize(
    ("argv", "more"),
    [
        (["--host", "0.0.0.0"], {"FORGE_CODEC_TOKEN": "env-token"}),  # a token: fine
        (["--host", "0.0.0.0", "--allow-no-auth"], {}),  # guarded elsewhere, said so
        ([], {}),  # loopback (forge dev): this machine's users only
    ],
    ids=["token", "allow-no-auth", "loopback"],
)
def test_an_encrypting_server_starts_with_a_token_on_loopback_or_when_told(
    tmp_path: Path, argv: list[str], more: dict[str, str]
) -> None:
    proc, line = _start_line(["--port", "0", *argv], _keyed_env(tmp_path, **more))
    url = line.split("listening on ", 1)[1].split()[0]
    try:
        assert request(f"{url}/health", method="GET")[0] == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert "encryption: keys cmd-1 (current cmd-1)" in line


def test_a_bad_key_file_exits_2_naming_the_variable(tmp_path: Path) -> None:
    env = _keyed_env(tmp_path)
    Path(env["FORGE_CODEC_KEY_FILE"]).write_text("cmd-1:not-base64!\n")
    proc = subprocess.run(
        [FORGE, "codec-server", "--port", "0"], capture_output=True, text=True, timeout=30, env=env
    )
    assert proc.returncode == 2
    assert "FORGE_CODEC_KEY_FILE" in proc.stderr and "not base64" in proc.stderr
