"""Real processes for end-to-end tests: `python worker.py` subprocesses."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

from forge.stores.base import Store, state_digest
from forge.wire.contract import LoopStatus

ROOT = Path(__file__).resolve().parents[2]
T = TypeVar("T")


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
        self._log = log.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "worker.py")],
            cwd=ROOT,
            env=full,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode

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
