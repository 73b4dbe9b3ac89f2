"""Stopping a child is bounded and leaves nothing behind, for the tests' helper
(:func:`tests.e2e.procs.stop_process`) and for ``forge dev``'s
(:func:`forge.services.processes.stop_child`): a child that ignores SIGTERM, and the
process it started, are SIGKILLed as a group after the timeout."""

from __future__ import annotations

import time
from pathlib import Path

import psutil
import pytest

from forge.services import processes
from tests.e2e.procs import start_process, stop_process

#: ignores SIGTERM (and so does its child), writes its child's pid, waits forever
STUBBORN = "trap '' TERM; sleep 300 & echo $! > {pidfile}; wait"


def _pid_in(path: Path, timeout: float = 10.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = path.read_text().strip() if path.exists() else ""
        if text:
            return int(text)
        time.sleep(0.02)
    raise AssertionError(f"no pid in {path} after {timeout} s")


def _gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.02)
    return False


def test_stop_process_kills_a_child_deaf_to_sigterm_and_its_own_child(tmp_path: Path) -> None:
    pidfile = tmp_path / "grandchild"
    proc = start_process(["sh", "-c", STUBBORN.format(pidfile=pidfile)], tmp_path / "log")
    grandchild = _pid_in(pidfile)
    started = time.monotonic()
    assert stop_process(proc, timeout=0.5) == -9
    assert time.monotonic() - started < 5
    assert _gone(grandchild)


async def test_forge_devs_stop_child_kills_the_childs_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(processes, "STOP_TIMEOUT", 0.5)
    pidfile = tmp_path / "grandchild"
    argv = ["sh", "-c", STUBBORN.format(pidfile=pidfile)]
    child = await processes.spawn("stubborn", argv, tmp_path / "log", None)
    grandchild = _pid_in(pidfile)
    await processes.stop_child(child)
    assert child.proc.returncode == -9
    assert _gone(grandchild)
