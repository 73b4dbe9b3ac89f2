"""The end-of-run leak check (:mod:`tests.leaks`) on a pytest run of its own: a test
that forgets its processes fails the run, which names each one and kills it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]

FORGETFUL = """
import os, subprocess, sys
from pathlib import Path


def test_starts_processes_and_stops_none():
    # a child of pytest, with the run's marker
    child = subprocess.Popen(["sleep", "300"])
    # out of pytest's tree: its parent exits at once (only the marker finds it)
    spawner = subprocess.run(
        [sys.executable, "-c",
         "import subprocess; print(subprocess.Popen(['sleep', '301'], "
         "start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).pid)"],
        capture_output=True, text=True, check=True,
    )
    orphan = int(spawner.stdout)
    # in the tree, with a cleaned environment (only the tree finds it)
    bare = subprocess.Popen(["sleep", "302"], env={"PATH": os.environ["PATH"]})
    Path(os.environ["PIDS_FILE"]).write_text(f"{child.pid} {orphan} {bare.pid}")
"""

TIDY = """
import subprocess


def test_stops_what_it_starts():
    proc = subprocess.Popen(["sleep", "300"])
    proc.kill()
    proc.wait()
"""


def _run(tmp_path: Path, name: str, source: str) -> subprocess.CompletedProcess[str]:
    test = tmp_path / f"test_{name}.py"
    test.write_text(source)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PIDS_FILE": str(tmp_path / "pids")}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.leaks", "-p", "no:cacheprovider",
         "-q", "-W", "ignore", str(test)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_run_that_leaves_processes_fails_names_them_and_kills_them(tmp_path: Path) -> None:
    done = _run(tmp_path, "forgetful", FORGETFUL)
    out = done.stdout + done.stderr
    pids = [int(p) for p in (tmp_path / "pids").read_text().split()]
    assert done.returncode == 1, out  # the test itself passed
    assert "1 passed" in out, out
    assert "3 process(es) the test run started outlived it" in out, out
    for pid, seconds in zip(pids, ("300", "301", "302"), strict=True):
        assert f"leaked pid {pid}: sleep {seconds}" in out, out
    deadline = time.monotonic() + 10  # the orphan is reaped by init, not by us
    while any(map(_alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid in pids if _alive(pid)], out


def test_a_run_that_stops_its_processes_passes(tmp_path: Path) -> None:
    done = _run(tmp_path, "tidy", TIDY)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "leaked" not in out, out
