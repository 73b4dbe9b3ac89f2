"""The agent's parts on their own: reporter order, log rotation, the state file."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import psutil

from forge.agent.logfiles import read_from, rotate_if_needed
from forge.agent.reporter import Reporter
from forge.agent.state import ProcessRecord, StateFile, alive
from forge.agent.supervisor import DYNAMIC_PORTS, free_port
from forge.core.taskenv import MASTER_PORTS
from forge.stores.base import TaskReport


def _r(wid: str, status: str = "running", cpu: float | None = None, at: float = 0.0) -> TaskReport:
    return TaskReport(workload_id=wid, status=status, cpu=cpu, at=at)


def test_reports_queue_in_order_through_an_outage_and_are_sent_once() -> None:
    sent: list[TaskReport] = []
    down = [True]

    def send(batch: list[TaskReport]) -> None:
        if down[0]:
            raise ConnectionError("store down")
        sent.extend(batch)

    rep = Reporter(send)
    rep.transition(_r("a/g/0", "running", at=1))
    rep.transition(_r("a/g/0", "failed", at=2))
    rep.transition(_r("a/g/1", "running", at=3))
    assert isinstance(rep.flush(), ConnectionError)
    assert len(rep) == 3 and sent == []
    down[0] = False
    assert rep.flush() is None
    assert [(r.workload_id, r.status, r.at) for r in sent] == [
        ("a/g/0", "running", 1),
        ("a/g/0", "failed", 2),
        ("a/g/1", "running", 3),
    ]
    assert rep.flush() is None and len(sent) == 3  # nothing sent twice


def test_usage_samples_coalesce_but_never_overtake_a_transition() -> None:
    rep = Reporter(lambda batch: None)
    rep.usage(_r("a/g/0", cpu=0.1, at=1))
    rep.usage(_r("a/g/0", cpu=0.2, at=2))  # replaces the unsent 0.1
    rep.transition(_r("a/g/0", "failed", at=3))
    rep.usage(_r("a/g/0", cpu=0.3, at=4))  # after the transition: kept behind it
    queued = [(q.report.status, q.report.cpu) for q in rep._queue]
    assert queued == [("running", 0.2), ("failed", None), ("running", 0.3)]


def test_log_rotation_keeps_the_size_bounded_and_readers_restart(tmp_path: Path) -> None:
    log = tmp_path / "t.log"
    log.write_bytes(b"x" * 150)
    _, offset = read_from(log, 0)
    assert offset == 150
    assert rotate_if_needed(log, max_bytes=100, keep=2)
    assert log.stat().st_size == 0 and (tmp_path / "t.log.1").stat().st_size == 150
    log.write_bytes(b"y" * 120)
    assert rotate_if_needed(log, max_bytes=100, keep=2)
    assert (tmp_path / "t.log.2").read_bytes() == b"x" * 150
    assert (tmp_path / "t.log.1").read_bytes() == b"y" * 120
    log.write_bytes(b"z" * 110)
    assert rotate_if_needed(log, max_bytes=100, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.log", "t.log.1", "t.log.2"]
    assert not rotate_if_needed(log, max_bytes=100, keep=2)
    with log.open("ab") as fh:
        fh.write(b"new\n")
    data, nxt = read_from(log, offset)  # the old offset is past the end: from the start
    assert data == b"new\n" and nxt == 4


def test_state_file_identifies_a_process_by_pid_and_start_time(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        started = psutil.Process(proc.pid).create_time()
        state = StateFile(tmp_path / "state.json")
        rec = ProcessRecord("a/g/0", "t", proc.pid, started, {"http": 8080}, "n1")
        state.save([rec])
        assert state.load() == [rec]
        assert alive(rec.pid, rec.started)
        assert not alive(rec.pid, rec.started - 100)  # same pid, another process
    finally:
        proc.kill()
        proc.wait()
    assert not alive(rec.pid, rec.started)


def test_a_torn_state_file_is_read_as_empty(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_text('{"version": 1, "processes": [{"workload_id"')
    assert StateFile(path).load() == []


def test_task_ports_avoid_the_kernels_ephemeral_range_ports_in_use_and_each_other() -> None:
    """Two agents on one host once got the same just-closed bind(0) port (CI): the second
    task failed to bind. Ports come from the dynamic range, skip what is bound or handed out."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("", 0))
        held.listen()
        busy = int(held.getsockname()[1])
        taken: set[int] = set()
        got = [free_port(taken) for _ in range(500)]
    assert len(set(got)) == 500 and set(got) == taken
    assert all(p in DYNAMIC_PORTS for p in got)
    assert busy not in got
    # a gang's MASTER_PORT (derived, the same for every member) is never another task's
    assert not set(got) & set(MASTER_PORTS)


def test_a_port_bound_by_someone_else_is_never_handed_out(monkeypatch) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("", 0))
        other = int(probe.getsockname()[1])
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("", 0))
        busy = int(held.getsockname()[1])
        picks = iter([busy, busy, other])
        monkeypatch.setattr("forge.agent.supervisor.random.choice", lambda _r: next(picks))
        assert free_port(set()) == other
