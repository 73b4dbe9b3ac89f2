"""forge.agent.shim: the shell a task runs under keeps its exit status on disk (for
an agent that adopts it after a kill -9) and ends as the task ended (for the agent
that started it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from forge.agent.shim import exit_path, is_shim, read_exit, shimmed, unstartable


def _run(tmp_path: Path, code: str, stop: bool = False) -> tuple[int, int | None]:
    """The shim's own status as its parent sees it, and the status it kept."""
    kept = exit_path(tmp_path / "t.log")
    proc = subprocess.Popen(
        shimmed([sys.executable, "-c", code], kept),
        start_new_session=True,
        stdout=subprocess.PIPE,
    )
    if stop:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        os.killpg(proc.pid, signal.SIGTERM)  # as the agent stops a replica
    return proc.wait(timeout=30), read_exit(kept)


@pytest.mark.parametrize(("status", "want"), [(0, 0), (3, 3), (42, 42)])
def test_an_exit_status_is_kept_and_passed_on(tmp_path: Path, status: int, want: int) -> None:
    assert _run(tmp_path, f"raise SystemExit({status})") == (want, want)


def test_a_task_killed_by_a_signal_is_read_as_killed_by_it(tmp_path: Path) -> None:
    code = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    assert _run(tmp_path, code) == (-signal.SIGKILL, -signal.SIGKILL)


def test_the_stop_signal_reaches_the_task_and_the_shim_outlives_it(tmp_path: Path) -> None:
    """SIGTERM to the group: a task that dies of it is "killed by SIGTERM"; one that
    handles it and exits 0 (a graceful stop) exited 0, and the shim kept that."""
    dies = "import time; print('ready', flush=True); time.sleep(60)"
    assert _run(tmp_path, dies, stop=True) == (-signal.SIGTERM, -signal.SIGTERM)
    graceful = (
        "import signal, sys, time; "
        "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0)); "
        "print('ready', flush=True); time.sleep(60)"
    )
    assert _run(tmp_path, graceful, stop=True) == (0, 0)


def test_the_status_outlives_the_parent_that_started_it(tmp_path: Path) -> None:
    """The agent's case: whoever started the shim is gone when the task ends."""
    kept = exit_path(tmp_path / "t.log")
    gate = tmp_path / "gate"
    code = (
        "import os, time; "
        f"[time.sleep(0.02) for _ in iter(lambda: os.path.exists({str(gate)!r}), True)]; "
        "raise SystemExit(7)"
    )
    starter = (
        "import subprocess, sys; "
        f"p = subprocess.Popen({shimmed([sys.executable, '-c', code], kept)!r}, "
        "start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); "
        "print(p.pid, flush=True)"
    )
    try:
        out = subprocess.run([sys.executable, "-c", starter], capture_output=True, text=True)
        assert out.returncode == 0 and int(out.stdout)  # its parent is gone: an orphan now
        assert read_exit(kept) is None  # still running
        gate.touch()
        deadline = time.monotonic() + 30
        while read_exit(kept) is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert read_exit(kept) == 7
    finally:
        gate.touch()  # never leave the orphan waiting
    assert not (tmp_path / "t.exit.tmp").exists()


def test_reading_a_missing_or_torn_status_knows_nothing(tmp_path: Path) -> None:
    assert read_exit(tmp_path / "none.exit") is None
    (tmp_path / "torn.exit").write_text("")
    assert read_exit(tmp_path / "torn.exit") is None
    (tmp_path / "sig.exit").write_text("143\n")
    assert read_exit(tmp_path / "sig.exit") == -signal.SIGTERM


def test_a_command_that_cannot_run_is_named_before_the_shim_starts(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin"}
    assert unstartable("sh", env, tmp_path) is None
    assert unstartable("no-such-forge-command", env, tmp_path) == "No such file or directory"
    assert unstartable("/no/such/forge-command", env, tmp_path) == "No such file or directory"
    script = tmp_path / "run.sh"
    script.write_text("#!/bin/sh\n")
    assert unstartable("./run.sh", env, tmp_path) == "Permission denied"  # not executable
    script.chmod(0o755)
    assert unstartable("./run.sh", env, tmp_path) is None  # relative to the task's cwd
    assert unstartable(str(tmp_path), env, tmp_path) == "Permission denied"  # a directory
    assert is_shim(shimmed(["true"], tmp_path / "x.exit"))
    assert not is_shim(["/bin/sh", "-c", "true"])
