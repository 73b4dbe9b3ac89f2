"""No process outlives the test run (a pytest plugin, registered by ``tests/conftest.py``).

Every process the suite starts (``worker.py``, ``temporal server start-dev``, the
time-skipping test server, ``forge dev`` and ``forge agent``, task processes,
Chromium and its helpers) must be gone when the session ends. Two ways find them,
since a daemonized or orphaned child leaves pytest's process tree:

- the marker: the session sets ``PYTEST_FORGE_RUN`` to a token of its own,
  appended to any token already there (a pytest run inside a test keeps its
  parent's), and every process started after that inherits it;
- the tree: after each test the live descendants of the pytest process are
  recorded (pid and start time, so a reused pid is not mistaken for one).

At the very end of the session (after the last fixture's teardown) the candidates
still alive get ``GRACE`` seconds to exit; the survivors and their process groups
are killed, each is printed with its pid and command line, and the run fails.

With pytest-xdist each worker checks what it started; the controller, which runs
no test, checks nothing (its workers carry its token and are still exiting).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from collections.abc import Generator, Iterable

import psutil
import pytest

#: The environment variable every process the suite starts inherits. Its name has
#: no ``FORGE_``/``TEMPORAL_`` prefix: some tests drop those from a child's
#: environment so that the caller's settings redirect nothing.
LEAK_MARK = "PYTEST_FORGE_RUN"
#: How long leftover processes get to exit on their own at the end of the session.
GRACE = 5.0
#: Long-lived services the suite restarts on purpose (the shared PostgreSQL server,
#: which ``pg_ctlcluster`` starts with a clean environment anyway).
SERVICES = frozenset({"postgres"})

_TOKEN = pytest.StashKey[str]()
_SEEN = pytest.StashKey[dict[int, float]]()
_LEAKED = pytest.StashKey[list[str]]()


def _is_controller(config: pytest.Config) -> bool:
    """The xdist controller: it distributes tests and runs none."""
    return config.pluginmanager.hasplugin("dsession") and not hasattr(config, "workerinput")


def pytest_configure(config: pytest.Config) -> None:
    inherited = os.environ.get(LEAK_MARK)
    if any(t.split("-")[0] == str(os.getpid()) for t in (inherited or "").split(":")):
        return  # a session inside a session of this process (pytester): the outer checks
    token = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
    config.stash[_TOKEN] = token
    config.stash[_SEEN] = {}
    os.environ[LEAK_MARK] = f"{inherited}:{token}" if inherited else token


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _record_descendants(seen: dict[int, float]) -> None:
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):
                seen.setdefault(child.pid, child.create_time())


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, None, None]:
    try:
        return (yield)
    finally:
        if _SEEN in item.config.stash:
            _record_descendants(item.config.stash[_SEEN])


def marked(token: str) -> list[psutil.Process]:
    """The live processes (other than this one) whose environment carries ``token``."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.pid == os.getpid():
                continue
            if token in proc.environ().get(LEAK_MARK, "").split(":") and _alive(proc):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def survivors(token: str, seen: dict[int, float]) -> list[psutil.Process]:
    """The processes of this run still alive: recorded descendants (same start
    time), descendants now, and those carrying the run's marker."""
    _record_descendants(seen)
    found: dict[int, psutil.Process] = {p.pid: p for p in marked(token)}
    for pid, started in seen.items():
        if pid in found:
            continue
        try:
            proc = psutil.Process(pid)
            if proc.create_time() == started and _alive(proc):
                found[pid] = proc
        except psutil.Error:
            continue
    out = []
    for proc in found.values():
        with contextlib.suppress(psutil.Error):
            if proc.name() not in SERVICES:
                out.append(proc)
    return sorted(out, key=lambda p: p.pid)


def _describe(proc: psutil.Process) -> str:
    try:
        cmd = " ".join(proc.cmdline()) or proc.name()
    except psutil.Error:
        cmd = "?"
    return f"pid {proc.pid}: {cmd[:300]}"


def kill_all(procs: Iterable[psutil.Process], timeout: float = 10.0) -> None:
    """SIGKILL each process and, when it leads a process group other than ours, the
    group; then wait (bounded) until they are gone."""
    procs = list(procs)
    ours = os.getpgrp()
    for proc in procs:
        with contextlib.suppress(OSError):
            group = os.getpgid(proc.pid)
            if group == proc.pid and group != ours:
                os.killpg(group, signal.SIGKILL)
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(procs, timeout=timeout)


def _wait_gone(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    while True:
        procs = [p for p in procs if _alive(p)]
        if not procs or time.monotonic() >= deadline:
            return procs
        time.sleep(0.1)  # poll interval while they exit


@pytest.hookimpl(trylast=True)  # after pytest's own teardown of the remaining fixtures
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    if _is_controller(config) or _TOKEN not in config.stash:
        return
    left = _wait_gone(survivors(config.stash[_TOKEN], config.stash[_SEEN]), GRACE)
    if not left:
        return
    leaked = [_describe(p) for p in left]
    kill_all(left)
    config.stash[_LEAKED] = leaked
    if session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None or getattr(reporter, "no_summary", False):  # no summary prints it
        print("\n".join(_message(leaked)))


def _message(leaked: list[str]) -> list[str]:
    return [
        f"{len(leaked)} process(es) the test run started outlived it (killed now; the run fails):",
        *(f"  leaked {line}" for line in leaked),
    ]


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    leaked = terminalreporter.config.stash.get(_LEAKED, [])
    if leaked:
        terminalreporter.section("leaked processes", sep="=", red=True, bold=True)
        for line in _message(leaked):
            terminalreporter.write_line(line)
