"""Security: credentials come only from the environment or files and are never
logged; task env values stay out of logs, the Web UI's details and every query;
TLS to Temporal (server-verified and mutual) and to PostgreSQL works, and a TLS
setting that cannot be honoured fails clearly instead of falling back to plain
text.

The TLS tests run the real client through a TLS-terminating proxy in front of the
time-skipping test server (the dev server has no TLS option), with a throwaway CA,
server and client certificates made by ``openssl``.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import os
import shutil
import ssl
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import psycopg
import pytest
import pytest_asyncio
import structlog
from google.protobuf.message import Message
from psycopg import conninfo as pg_conninfo
from psycopg import sql
from temporalio.api.common.v1 import Payload
from temporalio.api.history.v1 import HistoryEvent
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.api.workflowservice.v1 import GetSystemInfoRequest
from temporalio.client import Client
from temporalio.service import TLSConfig
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer

from forge import cli
from forge.cli.root import forge as forge_command
from forge.client.client import ForgeClient
from forge.core.models import Job
from forge.logs import REDACTED, configure, redact
from forge.settings import Settings, SettingsError
from forge.stores import SqliteStore, Store
from forge.stores.postgres import PostgresStore, parse_postgres_url
from forge.wire import contract as c
from forge.wire.codec import ZlibCodec, data_converter
from forge.wire.encryption import ENCRYPTED, KEY_ID, CodecKeyError, format_key, new_key
from tests.builders import job_with_env
from tests.e2e.procs import WorkerProc, eventually
from tests.workflow.harness import cluster, default_options, node
from workflows.cluster import ClusterWorkflow

SECRET = f"sk-{uuid.uuid4().hex}"  # an API key / a task env value
PG_URL = os.environ.get("FORGE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")


# ===================================================================== credentials


def test_settings_take_credentials_from_the_environment_and_never_show_them() -> None:
    env = {
        "FORGE_TEMPORAL_API_KEY": SECRET,
        "FORGE_TEMPORAL_TLS_CERT": "/run/secrets/client.pem",
        "FORGE_TEMPORAL_TLS_KEY": "/run/secrets/client.key",
        "FORGE_TEMPORAL_TLS_CA": "/run/secrets/ca.pem",
        "FORGE_TEMPORAL_TLS_SERVER_NAME": "temporal.internal",
    }
    s = Settings.from_env(env)
    assert s.api_key == SECRET
    assert (s.tls_cert, s.tls_key, s.tls_ca) == (
        "/run/secrets/client.pem",
        "/run/secrets/client.key",
        "/run/secrets/ca.pem",
    )
    assert s.tls_server_name == "temporal.internal"
    # paths are kept, never the key material; the API key is not in repr or str
    assert SECRET not in repr(s) and SECRET not in str(s)
    assert SECRET not in repr(s.override(address="other:7233"))
    assert Settings.from_env({}).api_key == ""  # nothing else supplies one


def test_no_command_line_flag_takes_a_credential() -> None:
    """Flags show up in `ps` and shell history: no flag may take a credential as its value."""

    def options(command: click.Command) -> Iterator[str]:
        for param in command.params:
            if isinstance(param, click.Option) and param.is_flag:
                continue  # a switch carries no value, so no secret (--no-password)
            yield from param.opts
        if isinstance(command, click.Group):
            for sub in command.commands.values():
                yield from options(sub)

    flags = set(options(forge_command))
    assert "--address" in flags and "--store" in flags  # the walk reached subcommands
    words = ("key", "password", "token", "secret", "cert", "credential")
    assert not [f for f in flags if any(w in f for w in words)]


def test_settings_require_the_client_key_with_the_client_certificate() -> None:
    with pytest.raises(SettingsError, match="FORGE_TEMPORAL_TLS_CERT and FORGE_TEMPORAL_TLS_KEY"):
        Settings.from_env({"FORGE_TEMPORAL_TLS_CERT": "/x.pem"})
    with pytest.raises(SettingsError, match="FORGE_TEMPORAL_TLS_CERT and FORGE_TEMPORAL_TLS_KEY"):
        Settings.from_env({"FORGE_TEMPORAL_TLS_KEY": "/x.key"})


def test_the_cli_never_prints_the_api_key(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FORGE_TEMPORAL_API_KEY", SECRET)
    code = cli.main(["status", "--address", "127.0.0.1:1", "--connect-timeout", "3"])
    out, err = capsys.readouterr()
    assert code == 1 and "cannot connect" in err
    assert SECRET not in out + err


# ====================================================================== redaction


@pytest.mark.parametrize(
    ("event", "hidden"),
    [
        ({"api_key": SECRET}, SECRET),
        ({"FORGE_TEMPORAL_API_KEY": SECRET}, SECRET),
        ({"db_password": SECRET}, SECRET),
        ({"token": SECRET}, SECRET),
        ({"client_secret": SECRET}, SECRET),
        ({"tls_private_key": SECRET}, SECRET),
        ({"env": {"DB_PASSWORD": SECRET}}, SECRET),
        # nested: a job or task logged whole
        ({"job": {"groups": [{"tasks": [{"env": {"PLAIN": SECRET}}]}]}}, SECRET),
        ({"tasks": ({"name": "t", "env": {"X": SECRET}},)}, SECRET),
        ({"settings": {"api_key": SECRET, "address": "h:7233"}}, SECRET),
        ({"settings": {"codec_keys": f"k1:{SECRET}", "codec_token": SECRET}}, SECRET),
        # in strings: store URLs with a password
        ({"store": f"postgresql://forge:{SECRET}@db:5432/forge"}, SECRET),
        ({"store": f"db:5432/forge?sslmode=require&password={SECRET}"}, SECRET),
        ({"event": f"cannot open postgresql://u:{SECRET}@h/db"}, SECRET),
        ({"url": f"https://h/?token={SECRET}&x=1"}, SECRET),
    ],
)
def test_redaction_hides_secrets_at_any_depth(event: dict[str, Any], hidden: str) -> None:
    out = redact(None, "info", dict(event))
    assert hidden not in json.dumps(out, default=str)
    assert REDACTED in json.dumps(out, default=str)


def test_redaction_leaves_ordinary_values_alone() -> None:
    event = {"event": "worker running", "address": "localhost:7233", "task_queue": "forge"}
    assert redact(None, "info", dict(event)) == event
    # a URL without credentials, and '=' in text, are kept as they are
    ok = {"store": "postgresql://forge@db:5432/forge?sslmode=require", "note": "a=b"}
    assert redact(None, "info", dict(ok)) == ok


def test_a_logged_job_model_shows_no_env_value() -> None:
    job = Job.model_validate(
        {
            "name": "db",
            "groups": [
                {
                    "name": "main",
                    "tasks": [
                        {
                            "name": "t",
                            "env": {"DB_URL": f"postgresql://u:{SECRET}@h/db", "X": SECRET},
                            "resources": {"cpu": 1, "memory": 1},
                        }
                    ],
                }
            ],
        }
    )
    out = redact(None, "info", {"event": "submitted", "job": job})
    text = json.dumps(out)
    assert SECRET not in text and '"env": "***"' in text
    assert '"name": "db"' in text  # the rest of the job is still there


@pytest.fixture
def structlog_output() -> Iterator[io.StringIO]:
    """forge.logs.configure("json"), writing to a buffer; reset afterwards."""
    buf = io.StringIO()
    configure("json")
    structlog.configure(
        logger_factory=structlog.PrintLoggerFactory(file=buf), cache_logger_on_first_use=False
    )
    try:
        yield buf
    finally:
        structlog.reset_defaults()


def test_configured_json_logs_redact_before_rendering(structlog_output: io.StringIO) -> None:
    log = structlog.get_logger("forge.test")
    log.info(
        "worker running",
        store=f"postgresql://forge:{SECRET}@db/forge",
        api_key=SECRET,
        task={"env": {"K": SECRET}},
    )
    line = json.loads(structlog_output.getvalue().splitlines()[-1])
    assert SECRET not in structlog_output.getvalue()
    assert line["store"] == "postgresql://forge:***@db/forge"
    assert line["api_key"] == REDACTED and line["task"] == {"env": REDACTED}


# =========================================================== env values in the UI


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def skipping_env(test_server_bin: str) -> AsyncIterator[WorkflowEnvironment]:
    env = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=test_server_bin, data_converter=data_converter()
    )
    try:
        yield env
    finally:
        await env.shutdown()


def secret_job(name: str, cpu: int) -> Job:
    return job_with_env(name, {"DB_PASSWORD": SECRET, "PLAIN_LOOKING": SECRET}, cpu)


async def forge_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = await asyncio.to_thread(cli.main, list(argv))
    out, err = capsys.readouterr()
    return code, out + err


async def test_task_env_values_appear_in_no_query_detail_log_or_cli_output(
    skipping_env: WorkflowEnvironment,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    caplog.set_level(logging.DEBUG)
    db = tmp_path / "forge.db"
    monkeypatch.setenv("FORGE_STORE", f"sqlite:///{db}")  # what the CLI reads status from
    async with cluster(skipping_env.client, store=SqliteStore(db)) as (fc, store):
        seen: list[str] = [store.loop_status(fc.cluster) or ""]
        await fc.register_nodes([node("n1", cpu=4000)])
        await fc.submit_job(secret_job("db", cpu=500))  # bound
        await fc.submit_job(secret_job("huge", cpu=64000))  # pending, with reasons
        handle = fc.handle()
        seen.append(store.loop_status(fc.cluster) or "")  # the published status
        status = await fc.status()
        assert status.summary.bound == 1 and status.summary.pending == 1
        seen.append(status.model_dump_json())
        seen.extend(a.model_dump_json() for a in await fc.assignments())
        for wid in ("db/main/0", "huge/main/0", "nope/main/0"):
            seen.append((await fc.explain(wid)).model_dump_json())
        # the Web UI's "current details" (set by the workflow) and static details
        meta = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
        assert "Forge cluster" in meta.current_details and "pending" in meta.current_details
        seen.append(meta.current_details)
        desc = await handle.describe()
        seen.extend([await desc.static_summary() or "", await desc.static_details() or ""])
        seen.append(str(desc.memo) + str(desc.typed_search_attributes))
        # the CLI, against the same cluster
        target = [
            "--address",
            skipping_env.client.service_client.config.target_host,
            "--task-queue",
            fc.task_queue,
            "--cluster",
            fc.cluster,
        ]
        for argv in (["status", "--json"], ["status", "-a"], ["explain", "huge/main/0"]):
            code, output = await forge_cli(capsys, *argv, *target)
            assert code == 0, output
            seen.append(output)
    seen.extend(r.getMessage() for r in caplog.records)
    out, err = capsys.readouterr()
    seen.extend([out, err])
    leaks = [s[:200] for s in seen if SECRET in s]
    assert not leaks
    assert any("huge/main/0" in s for s in seen)  # the views were not empty


async def test_task_env_values_are_not_readable_from_history(
    skipping_env: WorkflowEnvironment,
) -> None:
    """With a codec key, a job's env values are in the raw history only as
    ciphertext: fetched without the codec and inflated wherever zlib applies (all
    one can do without the key), no payload shows them; through the codec with the
    key they are there, and the history still replays."""
    target = skipping_env.client.service_client.config.target_host
    keys_text = format_key("sec-1", new_key())
    settings = Settings(address=target, codec_keys=keys_text)  # the path every client takes
    client = await settings.connect()
    async with cluster(client) as (fc, _):
        await fc.register_nodes([node("n1", cpu=4000)])
        res = await fc.submit_job(secret_job("db", cpu=500))  # stored, planned, persisted
        assert res.bound == 1
        await fc.handle().signal(
            c.SIGNAL_REGISTER_NODE,
            {"nodes": [{"id": "n2", "cpu": 1, "memory": 1, "labels": {"k": SECRET}}]},
        )
        await eventually(fc.status, lambda s: s.summary.nodes == 2, what="n2 registered")
        history = await fc.handle().fetch_history()  # the raw events: no codec applied
    payloads: list[Payload] = []
    for event in history.events:
        if _uncoded(event):
            continue
        _payloads_in(event, payloads)
    assert len(payloads) > 5
    plain = [
        (e.event_type, p.data[:80])
        for e in history.events
        if not _uncoded(e)
        for p in _collect(e)
        if p.metadata["encoding"] != ENCRYPTED
    ]
    assert all(p.metadata["encoding"] == ENCRYPTED for p in payloads), plain
    assert {p.metadata[KEY_ID] for p in payloads} == {b"sec-1"}
    raw = b"".join(e.SerializeToString() for e in history.events)
    assert SECRET.encode() not in raw
    inflated = await ZlibCodec().decode(payloads)  # passes ciphertext through
    assert not [p for p in inflated if SECRET.encode() in p.SerializeToString()]
    # a reader without the key is told which key it lacks
    with pytest.raises(CodecKeyError, match="'sec-1'"):
        await data_converter().decode(payloads)
    # with the key: the values are there (the update input, the persisted spec)
    codec = data_converter(settings.encryption_keys()).payload_codec
    assert codec is not None
    texts = [p.data.decode(errors="replace") for p in await codec.decode(payloads)]
    assert sum(SECRET in t for t in texts) >= 2
    # and the encrypted history replays with today's code through the same converter
    replayer = Replayer(
        workflows=[ClusterWorkflow], data_converter=data_converter(settings.encryption_keys())
    )
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None, result.replay_failure


async def test_the_cli_uses_the_configured_keys_and_names_a_missing_one(
    skipping_env: WorkflowEnvironment,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """`forge job run` against workers that encrypt: with FORGE_CODEC_KEYS it works;
    without it the answer cannot be read, and it says which key to set (exit 2)."""
    target = skipping_env.client.service_client.config.target_host
    keys_text = format_key("cli-1", new_key())
    client = await Settings(address=target, codec_keys=keys_text).connect()
    job = tmp_path / "job.yaml"
    job.write_text(
        "name: web\ngroups:\n- name: g\n  tasks:\n  - name: t\n"
        f"    env: {{TOKEN: {SECRET}}}\n    resources: {{cpu: 100, memory: 64}}\n"
    )
    async with cluster(client) as (fc, _):
        await fc.register_nodes([node("n1", cpu=4000)])
        argv = ["job", "run", str(job), "--address", target, "--task-queue", fc.task_queue]
        argv += ["--cluster", fc.cluster]
        monkeypatch.delenv("FORGE_CODEC_KEYS", raising=False)
        monkeypatch.delenv("FORGE_CODEC_KEY_FILE", raising=False)
        code, output = await forge_cli(capsys, *argv)
        assert code == 2, output
        assert "codec key 'cli-1'" in output and "FORGE_CODEC_KEYS" in output
        assert "Traceback" not in output and SECRET not in output
        monkeypatch.setenv("FORGE_CODEC_KEYS", keys_text)
        code, output = await forge_cli(capsys, *argv)
        assert code == 0, output
        assert (await fc.status()).summary.bound == 1


def _uncoded(event: HistoryEvent) -> bool:
    """Events whose payloads no codec touches, holding no user data: a
    ``workflow.patched`` marker (the patch id, written by the SDK core) and the
    search attribute upsert the SDK makes for it (TemporalChangeVersion: the server
    indexes search attributes)."""
    return event.HasField("marker_recorded_event_attributes") or event.HasField(
        "upsert_workflow_search_attributes_event_attributes"
    )


def _collect(message: Message) -> list[Payload]:
    out: list[Payload] = []
    _payloads_in(message, out)
    return out


def _payloads_in(message: Message, out: list[Payload]) -> None:
    """Every Payload anywhere inside a protobuf message."""
    if isinstance(message, Payload):
        out.append(message)
        return
    for field, value in message.ListFields():
        if field.message_type is None:
            continue
        if isinstance(value, Message):
            _payloads_in(value, out)
            continue
        for item in value.values() if hasattr(value, "values") else value:  # map / list
            if isinstance(item, Message):
                _payloads_in(item, out)


# ============================================================= the worker's logs


@pytest.fixture
def pg_schema() -> Iterator[str]:
    """A schema of this test on the local PostgreSQL (dropped afterwards)."""
    try:
        admin = psycopg.connect(PG_URL, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as err:
        pytest.fail(f"PostgreSQL at {PG_URL} is unreachable: {err}", pytrace=False)
    schema = f"forge_sec_{uuid.uuid4().hex[:10]}"
    try:
        yield schema
    finally:
        with admin:
            admin.execute(
                sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
            )


def _with_password(url: str, password: str, schema: str, query: str = "") -> str:
    """``url`` with ``password`` in its user info and ``?schema=`` (and ``query``)."""
    info = pg_conninfo.conninfo_to_dict(url)
    user = info.get("user", "postgres")
    host, port, db = info.get("host", "127.0.0.1"), info.get("port", "5432"), info.get("dbname")
    return f"postgresql://{user}:{password}@{host}:{port}/{db}?schema={schema}{query}"


async def test_the_worker_logs_neither_store_passwords_nor_task_env_values(
    skipping_env: WorkflowEnvironment, tmp_path: Path, pg_schema: str
) -> None:
    """A real `python worker.py` with a PostgreSQL store URL carrying a password
    twice (user info and ``?password=``; the local server trusts, so any password
    works) runs a job whose env holds a secret: its log has none of them."""
    pw1, pw2 = f"pw1-{uuid.uuid4().hex}", f"pw2-{uuid.uuid4().hex}"
    store = _with_password(PG_URL, pw1, pg_schema, f"&sslmode=disable&password={pw2}")
    queue = f"sec-{uuid.uuid4().hex[:8]}"
    address = skipping_env.client.service_client.config.target_host
    worker = WorkerProc(address, queue, store, tmp_path / "worker.log")
    fc = ForgeClient(
        skipping_env.client,
        cluster=f"sec{uuid.uuid4().hex[:6]}",
        task_queue=queue,
        options=default_options(),
        search_attributes=False,
    )
    try:
        await eventually(
            lambda: asyncio.sleep(0, worker.output()),
            lambda text: "worker running" in text,
            timeout=30,
            what="worker start",
        )
        await fc.register_nodes([node("n1", cpu=4000)])
        res = await fc.submit_job(secret_job("db", cpu=500))
        assert res.bound == 1
        # a malformed signal carrying the secret (dropped), an unknown node (ignored)
        await fc.handle().signal(
            c.SIGNAL_REGISTER_NODE, {"nodes": [{"id": "bad-node", "cpu": SECRET, "memory": 1}]}
        )
        await fc.remove_node(SECRET)
        await fc.register_nodes([node("n2")])
        await eventually(fc.status, lambda s: s.summary.nodes == 2, what="n2 registered")
    finally:
        with contextlib.suppress(Exception):
            await fc.handle().terminate("test finished")
        worker.stop()
    log = worker.log_path.read_text(errors="replace")
    running = [json.loads(line) for line in log.splitlines() if '"worker running"' in line]
    assert running, log[-2000:]
    assert running[0]["store"].startswith(f"127.0.0.1:5432/test?schema={pg_schema}")
    assert "password=***" in running[0]["store"]
    for secret in (pw1, pw2):
        assert secret not in log, "a store password reached the worker's log"
    # the dropped node is logged (a warning naming the node and the field, not the
    # value); no env value is logged anywhere
    assert "register_node: node dropped: bad-node: cpu:" in log, log[-3000:]
    assert SECRET not in log


def test_a_worker_with_an_api_key_never_logs_it(tmp_path: Path) -> None:
    """The API key implies TLS; against nothing listening the worker fails to
    connect (exit 1) and says so, without the key."""
    worker = WorkerProc(
        "127.0.0.1:1",
        "q",
        "memory://",
        tmp_path / "worker.log",
        FORGE_TEMPORAL_API_KEY=SECRET,
    )
    try:
        worker.proc.wait(timeout=60)
    finally:
        code = worker.stop()
    log = worker.log_path.read_text(errors="replace")
    assert code == 1 and "cannot connect to Temporal" in log
    assert SECRET not in log


# ================================================================ TLS to Temporal


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path  # a CA that signed nothing here


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _make_ca(d: Path, name: str) -> None:
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
        "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2",
        "-subj", f"/CN={name}", "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d,
    )  # fmt: skip


def _make_leaf(d: Path, name: str, usage: str) -> None:
    (d / f"{name}.ext").write_text(
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n"
        f"keyUsage=critical,digitalSignature\nextendedKeyUsage={usage}\n"
    )
    _openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=d,
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext",
        cwd=d,
    )  # fmt: skip


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    if shutil.which("openssl") is None:
        if os.environ.get("FORGE_SKIP_TLS") == "1":
            pytest.skip("openssl is not installed and FORGE_SKIP_TLS=1")
        pytest.fail(
            "openssl is not installed: no certificates to test TLS with. `make test` installs "
            "it (scripts/ensure-tools.sh); set FORGE_SKIP_TLS=1 to skip these tests on purpose.",
            pytrace=False,
        )
    d = tmp_path_factory.mktemp("pki")
    _make_ca(d, "ca")
    _make_ca(d, "other")
    _make_leaf(d, "server", "serverAuth")
    _make_leaf(d, "client", "clientAuth")
    return Pki(
        ca=d / "ca.pem",
        server_cert=d / "server.pem",
        server_key=d / "server.key",
        client_cert=d / "client.pem",
        client_key=d / "client.key",
        other_ca=d / "other.pem",
    )


def test_tls_config_carries_the_files_bytes(tmp_path: Path) -> None:
    files = {}
    for name in ("ca", "cert", "key"):
        files[name] = tmp_path / f"{name}.pem"
        files[name].write_bytes(
            f"-----BEGIN X-----\n{name}{uuid.uuid4().hex}\n-----END X-----\n".encode()
        )
    s = Settings.from_env(
        {
            "FORGE_TEMPORAL_TLS_CA": str(files["ca"]),
            "FORGE_TEMPORAL_TLS_CERT": str(files["cert"]),
            "FORGE_TEMPORAL_TLS_KEY": str(files["key"]),
            "FORGE_TEMPORAL_TLS_SERVER_NAME": "temporal.internal",
        }
    )
    tls = s.tls_config()
    assert isinstance(tls, TLSConfig)
    assert tls.server_root_ca_cert == files["ca"].read_bytes()
    assert tls.client_cert == files["cert"].read_bytes()
    assert tls.client_private_key == files["key"].read_bytes()
    assert tls.domain == "temporal.internal"
    # the key's bytes are read for the connection only, never kept on the settings
    assert files["key"].read_text() not in repr(s)
    # plain text unless something asks for TLS; FORGE_TEMPORAL_TLS=1 alone: system roots
    assert Settings.from_env({}).tls_config() is False
    assert Settings.from_env({"FORGE_TEMPORAL_TLS": "1"}).tls_config() is True
    assert Settings.from_env({"FORGE_TEMPORAL_API_KEY": SECRET}).tls_config() is True


@pytest.mark.parametrize("var", ["FORGE_TEMPORAL_TLS_CA", "FORGE_TEMPORAL_TLS_CERT"])
@pytest.mark.parametrize("problem", ["missing", "directory"])  # (root reads a chmod-0 file)
def test_an_unusable_tls_file_is_an_error_naming_the_variable(
    tmp_path: Path, var: str, problem: str
) -> None:
    path = tmp_path / "f.pem"
    if problem == "directory":
        path.mkdir()
    env = {var: str(path)}
    if var == "FORGE_TEMPORAL_TLS_CERT":
        key = tmp_path / "k.pem"
        key.write_text("k")
        env["FORGE_TEMPORAL_TLS_KEY"] = str(key)
    with pytest.raises(SettingsError, match=f"{var}: cannot read {path}"):
        Settings.from_env(env).tls_config()


def test_the_cli_exits_2_naming_an_unreadable_tls_file(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("FORGE_TEMPORAL_TLS_CA", str(tmp_path / "nope.pem"))
    code = cli.main(["status", "--address", "127.0.0.1:1"])
    _, err = capsys.readouterr()
    assert code == 2
    assert f"FORGE_TEMPORAL_TLS_CA: cannot read {tmp_path / 'nope.pem'}" in err


@dataclass
class TlsProxy:
    address: str
    handshakes_failed: int = 0


@contextlib.asynccontextmanager
async def tls_proxy(target: str, pki: Pki, *, client_certs: bool) -> AsyncIterator[TlsProxy]:
    """A TLS endpoint (ALPN h2) that forwards plain bytes to ``target``."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(pki.server_cert, pki.server_key)
    ctx.set_alpn_protocols(["h2"])
    if client_certs:
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_verify_locations(pki.ca)
    host, _, port = target.rpartition(":")
    proxy = TlsProxy(address="")
    tasks: set[asyncio.Task[None]] = set()

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, ssl.SSLError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(host, int(port))
        both = [
            asyncio.create_task(pipe(reader, up_writer)),
            asyncio.create_task(pipe(up_reader, writer)),
        ]
        tasks.update(both)
        await asyncio.gather(*both)

    loop = asyncio.get_running_loop()
    previous = loop.get_exception_handler()

    def quiet(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if isinstance(context.get("exception"), ssl.SSLError | ConnectionError):
            proxy.handshakes_failed += 1  # a client the proxy refused: expected here
            return
        loop.default_exception_handler(context)

    loop.set_exception_handler(quiet)
    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=ctx)
    proxy.address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        yield proxy
    finally:
        server.close()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        loop.set_exception_handler(previous)


async def _system_info(settings: Settings) -> None:
    client: Client = await asyncio.wait_for(settings.connect(), 15)
    await client.workflow_service.get_system_info(GetSystemInfoRequest())


async def test_tls_to_temporal_verifies_the_server_and_presents_the_client_certificate(
    skipping_env: WorkflowEnvironment, pki: Pki
) -> None:
    target = skipping_env.client.service_client.config.target_host
    async with tls_proxy(target, pki, client_certs=True) as proxy:
        good = Settings(
            address=proxy.address,
            tls_ca=str(pki.ca),
            tls_cert=str(pki.client_cert),
            tls_key=str(pki.client_key),
            tls_server_name="localhost",
        )
        await _system_info(good)
        # a full round trip through the verified, mutual TLS connection
        client = await good.connect()
        async with cluster(skipping_env.client) as (plain_fc, _):
            fc = ForgeClient(
                client, cluster=plain_fc.cluster, task_queue=plain_fc.task_queue,
                options=plain_fc.options, search_attributes=False,
            )  # fmt: skip
            await fc.register_nodes([node("n1")])
            res = await fc.submit_job(secret_job("over-tls", cpu=100))
            assert res.bound == 1
            assert (await fc.status()).summary.bound == 1

        # no client certificate: the server (proxy) refuses the handshake
        no_cert = Settings(address=proxy.address, tls_ca=str(pki.ca), tls_server_name="localhost")
        with pytest.raises((RuntimeError, OSError, TimeoutError)):
            await _system_info(no_cert)
        # a CA that did not sign the server's certificate: the client refuses it
        wrong_ca = Settings(
            address=proxy.address,
            tls_ca=str(pki.other_ca),
            tls_cert=str(pki.client_cert),
            tls_key=str(pki.client_key),
            tls_server_name="localhost",
        )
        with pytest.raises((RuntimeError, OSError, TimeoutError)):
            await _system_info(wrong_ca)
        # a name the certificate does not carry: refused too
        wrong_name = Settings(
            address=proxy.address,
            tls_ca=str(pki.ca),
            tls_cert=str(pki.client_cert),
            tls_key=str(pki.client_key),
            tls_server_name="temporal.example.com",
        )
        with pytest.raises((RuntimeError, OSError, TimeoutError)):
            await _system_info(wrong_name)
        # plain text to a TLS endpoint does not work either
        with pytest.raises((RuntimeError, OSError, TimeoutError)):
            await _system_info(Settings(address=proxy.address))


async def test_tls_never_falls_back_to_plain_text(skipping_env: WorkflowEnvironment) -> None:
    """Asked for TLS, against a server that speaks only plain text: an error, not a
    plain-text connection."""
    address = skipping_env.client.service_client.config.target_host
    await _system_info(Settings(address=address))  # the server is up, in plain text
    with pytest.raises((RuntimeError, OSError, TimeoutError)):
        await _system_info(Settings(address=address, tls=True))


# ============================================================= TLS to PostgreSQL


def test_the_store_url_passes_tls_parameters_to_libpq() -> None:
    url = (
        "postgresql://forge:pw@db.internal:5432/forge?sslmode=verify-full"
        "&sslrootcert=/run/secrets/ca.pem&sslcert=/run/secrets/c.pem"
        "&sslkey=/run/secrets/c.key&schema=forge_a"
    )
    conninfo, schema = parse_postgres_url(url)
    info = pg_conninfo.conninfo_to_dict(conninfo)
    assert schema == "forge_a"
    assert info["sslmode"] == "verify-full"
    assert info["sslrootcert"] == "/run/secrets/ca.pem"
    assert (info["sslcert"], info["sslkey"]) == ("/run/secrets/c.pem", "/run/secrets/c.key")
    assert "search_path=forge_a" in str(info["options"])


def test_sslmode_disable_with_a_schema_works_against_the_local_server(pg_schema: str) -> None:
    store: Store = PostgresStore(f"{PG_URL}?sslmode=disable&schema={pg_schema}")
    try:
        store.put_job("c", secret_job("db", cpu=1))
        assert [j.id for j in store.list_jobs("c")] == ["db"]
    finally:
        store.close()


@pytest.mark.parametrize("mode", ["require", "verify-ca", "verify-full"])
def test_a_required_tls_store_refuses_a_server_without_tls(
    capsys: pytest.CaptureFixture[str], pg_schema: str, mode: str
) -> None:
    """The local server has no TLS: asked for it, the store fails to open, with a
    clear reason, instead of connecting in plain text (and the CLI exits 1 with the
    password masked)."""
    password = f"pw-{uuid.uuid4().hex}"
    url = _with_password(PG_URL, password, pg_schema, f"&sslmode={mode}&password={password}")
    with pytest.raises(psycopg.OperationalError, match="SSL"):
        PostgresStore(url)
    code = cli.main(["job", "list", "--store", url])
    out, err = capsys.readouterr()
    assert code == 1, err
    assert "SSL" in err and "Traceback" not in err
    assert password not in out + err and "password=***" in err and ":***@" in err
