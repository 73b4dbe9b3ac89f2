"""Real processes for end-to-end tests: `python worker.py` subprocesses, and how
every test process is started and stopped.

A process a test starts leads a session (and so a process group) of its own, and
is stopped with :func:`stop_process`: SIGTERM, a bounded wait, then SIGKILL to the
whole group, whatever the leader did: a worker blocked in its shutdown (its server
already gone) or a child the leader left behind cannot outlive the test.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from forge.stores.base import Store, state_digest
from forge.wire.contract import LoopStatus

ROOT = Path(__file__).resolve().parents[2]
T = TypeVar("T")

#: How long a process gets between SIGTERM and SIGKILL.
STOP_TIMEOUT = 15.0


def _exited(pid: int) -> bool:
    """Whether the child ``pid`` has exited, without reaping it: while it is a
    zombie its pid (and so its process group's id) cannot be reused."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is not None
    except ChildProcessError:
        return True  # already reaped


def stop_process(proc: subprocess.Popen[Any], timeout: float = STOP_TIMEOUT) -> int:
    """Stop a child for good: SIGTERM, wait up to ``timeout`` for it to exit, then
    SIGKILL its process group when it leads one (as :func:`start_process` makes it)
    and itself, and reap it. Returns its exit code (negative: the signal)."""
    try:
        leads = os.getpgid(proc.pid) == proc.pid != os.getpgrp()
    except ProcessLookupError:
        leads = False
    if proc.returncode is None and not _exited(proc.pid):
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        deadline = time.monotonic() + timeout
        while not _exited(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)  # poll interval while it shuts down
    if leads:  # what is left of its group: its own children, or itself if blocked
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    if not _exited(proc.pid):
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    return proc.wait(timeout=timeout)


def start_process(argv: list[str], log: Path, **popen: Any) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a session of its own, its output appended to ``log``."""
    with log.open("ab") as out:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            **popen,
        )


class WorkerProc:
    """One `worker.py` process; its log goes to a file the test can show on failure."""

    def __init__(self, address: str, task_queue: str, store: str, log: Path, **env: str) -> None:
        self.log_path = log
        full = {
            **os.environ,
            "FORGE_TEMPORAL_ADDRESS": address,
            "FORGE_TASK_QUEUE": task_queue,
            "FORGE_STORE": store,
            "FORGE_LOG_FORMAT": "json",
            **env,
        }
        self.proc = start_process(
            [sys.executable, str(ROOT / "worker.py")], log, cwd=ROOT, env=full
        )

    def kill9(self) -> None:
        """The crash: SIGKILL to the worker alone (it starts no process of its own)."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> int:
        """SIGTERM, then SIGKILL to its group after STOP_TIMEOUT (see stop_process)."""
        return stop_process(self.proc)

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]


async def eventually(
    probe: Callable[[], Awaitable[T]],
    pred: Callable[[T], bool],
    *,
    timeout: float = 60.0,
    what: str = "condition",
) -> T:
    """Poll ``probe`` until ``pred`` holds; fail with the last value after ``timeout``."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        try:
            last = await probe()
            if pred(last):
                return last
        except Exception as err:  # the workflow may be between workers
            last = err  # type: ignore[assignment]
        await asyncio.sleep(0.1)
    raise AssertionError(f"{what} not reached in {timeout}s; last: {last!r}"[:2000])


def assert_store_is_the_workflows(store: Store, cluster: str) -> LoopStatus:
    """Invariant 6 without asking the workflow: the bindings hash the last pass
    published (computed by the workflow from its own state) equals the hash of
    the rows the store holds, and so do the counts."""
    while True:  # the status and the rows as one persist left them (see below)
        before = store.fence(cluster)
        raw = store.loop_status(cluster)
        rows = store.assignments(cluster, limit=10_000_000)
        if store.fence(cluster) == before:
            break  # no persist in between: both reads saw the same pass
    assert raw is not None, "the loop published no status"
    doc = LoopStatus.model_validate_json(raw)
    assert doc.summary.bound == len(rows), "the published count differs from the store's"
    assert doc.state_digest == state_digest(rows), "the store differs from the workflow's state"
    return doc
