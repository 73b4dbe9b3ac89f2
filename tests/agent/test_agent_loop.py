"""The agent's loop against an in-memory store, with real processes."""

from __future__ import annotations

import json
import os
import signal
import urllib.request
from pathlib import Path

import psutil
import pytest

from forge.agent.agent import Agent
from forge.agent.config import ADDRESS_LABEL, AgentConfig
from forge.agent.server import LogServer
from forge.core.models import Assignment, Node
from forge.stores import Delta, Fence, MemoryStore
from tests.agent.helpers import (
    PY,
    SLEEP,
    Binder,
    alive,
    command_job,
    local_node,
    task_environs,
    until,
)


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore()


def _agent(store: MemoryStore, data_dir: Path, registered: list[Node] | None = None) -> Agent:
    config = AgentConfig(
        node=local_node(), data_dir=data_dir, poll=0.05, heartbeat_every=0.2, usage_every=0.2
    )
    sink = registered if registered is not None else []
    return Agent(config, store, sink.append)


def _reports(store: MemoryStore, wid: str) -> list[tuple[str, str]]:
    """The replica's status transitions (usage samples left out)."""
    found = store.reports_since("default", 0)
    return [(r.status, r.message) for r in found if r.workload_id == wid and r.cpu is None]


def _pids(agent: Agent, wid: str) -> list[int]:
    """The replica's task processes: each its shim's child (forge.agent.shim)."""
    shims = [t.pid for t in agent.supervisor.replicas[wid].tasks]
    until(lambda: all(_children(pid) or not alive(pid) for pid in shims))  # forked, or ended
    return [child for pid in shims for child in _children(pid)]


def _children(pid: int) -> list[int]:
    try:
        return [c.pid for c in psutil.Process(pid).children()]
    except psutil.NoSuchProcess:
        return []


def test_registers_heartbeats_and_runs_a_bound_replica_with_ports(store, tmp_path) -> None:
    registered: list[Node] = []
    agent = _agent(store, tmp_path, registered)
    code = (
        "import os; print(os.environ['FORGE_WORKLOAD_ID'], os.environ['FORGE_PORT_HTTP'], "
        "flush=True); import time; time.sleep(600)"
    )
    wid = Binder(store).bind(command_job("web", [PY, "-c", code], ports=["http"]), 0, "n1")
    agent.step()
    assert [n.id for n in registered] == ["n1"]  # not in the store yet: signalled
    until(lambda: ("running", _reports(store, wid)[0][1]) if _reports(store, wid) else None)
    port = agent.supervisor.replicas[wid].ports["http"]
    log = tmp_path / "logs" / "web" / "main" / "0" / "t.log"
    until(lambda: log.exists() and log.read_text().strip() == f"{wid} {port}", step=agent.step)
    assert _reports(store, wid)[0] == ("running", f"started ports http={port}")
    agent.shutdown(stop_tasks=True)


def test_a_missing_command_fails_the_replica_with_the_os_error(store, tmp_path) -> None:
    agent = _agent(store, tmp_path)
    binder = Binder(store)
    ok = binder.bind(command_job("ok", SLEEP), 0, "n1")
    bad = binder.bind(command_job("bad", ["/no/such/forge-command"]), 0, "n1")
    agent.step()
    assert _reports(store, bad) == [
        ("failed", "task t: cannot start '/no/such/forge-command': No such file or directory")
    ]
    assert [s for s, _ in _reports(store, ok)] == ["running"]
    for _ in range(5):
        agent.step()  # failed stays failed: no restart without a new binding
    assert len(_reports(store, bad)) == 1
    agent.shutdown(stop_tasks=True)


def test_an_end_is_reported_with_its_exit_status_when_the_task_gave_one(store, tmp_path) -> None:
    """What ``fail_on_exit`` decides by: the status of the task whose end ended the
    replica (minus the signal when one killed it); none for a failed start."""
    agent = _agent(store, tmp_path)
    binder = Binder(store)
    ends = {
        binder.bind(command_job("e42", [PY, "-c", "raise SystemExit(42)"]), 0, "n1"): 42,
        binder.bind(command_job("e0", [PY, "-c", "pass"]), 0, "n1"): 0,
        binder.bind(command_job("nope", ["/no/such/forge-command"]), 0, "n1"): None,
    }
    killed = binder.bind(command_job("k", SLEEP), 0, "n1")
    agent.step()
    os.kill(_pids(agent, killed)[0], signal.SIGKILL)
    ends[killed] = -signal.SIGKILL

    def ended() -> dict[str, int | None] | None:
        got = {
            r.workload_id: r.exit_code
            for r in store.reports_since("default", 0)
            if r.status != "running"
        }
        return got if len(got) == len(ends) else None

    assert until(ended, step=agent.step) == ends
    agent.shutdown(stop_tasks=True)


def test_a_task_that_failed_decides_though_a_sibling_exited_0_first(store, tmp_path) -> None:
    """Both tasks end before the agent looks: the replica failed (with the failing
    task's status), whatever the order of the tasks in the spec."""
    agent = _agent(store, tmp_path)
    base = command_job("two", [PY, "-c", "pass"])
    g = base.groups[0]
    bad = g.tasks[0].model_copy(update={"name": "u", "command": (PY, "-c", "raise SystemExit(3)")})
    job = base.model_copy(update={"groups": (g.model_copy(update={"tasks": (*g.tasks, bad)}),)})
    wid = Binder(store).bind(job, 0, "n1")
    agent.step()  # starts both
    pids = [t.pid for t in agent.supervisor.replicas[wid].tasks]  # their shims
    until(lambda: not any(alive(pid) for pid in pids))  # both ended, unseen yet
    ended = lambda: _reports(store, wid) and _reports(store, wid)[-1][0] != "running"  # noqa: E731
    until(ended, step=agent.step)
    last = [r for r in store.reports_since("default", 0) if r.workload_id == wid][-1]
    assert (last.status, last.message, last.exit_code) == (
        "failed",
        "task u exited with status 3",
        3,
    )
    agent.shutdown(stop_tasks=True)


def test_a_killed_task_is_reported_failed_and_restarted_only_by_a_new_binding(
    store, tmp_path
) -> None:
    agent = _agent(store, tmp_path)
    binder = Binder(store)
    job = command_job("svc", SLEEP)
    wid = binder.bind(job, 0, "n1")
    agent.step()
    first = _pids(agent, wid)[0]
    os.kill(first, signal.SIGKILL)
    until(lambda: len(_reports(store, wid)) == 2, step=agent.step)
    assert _reports(store, wid)[1] == ("failed", "task t was killed by SIGKILL")
    binder.apply(release=[wid])  # what the loop does with a failed replica
    until(lambda: wid not in agent.supervisor.replicas, step=agent.step)
    binder.bind(job, 0, "n1")  # and its reschedule policy binds it again
    until(lambda: wid in agent.supervisor.replicas, step=agent.step)
    assert _pids(agent, wid)[0] != first
    assert [s for s, _ in _reports(store, wid)] == ["running", "failed", "running"]
    agent.shutdown(stop_tasks=True)


def test_a_released_binding_gets_sigterm_then_sigkill_after_its_grace(store, tmp_path) -> None:
    agent = _agent(store, tmp_path)
    binder = Binder(store)
    stubborn = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('ready', flush=True); time.sleep(600)"
    )
    wid = binder.bind(command_job("stub", [PY, "-c", stubborn], stop_grace=0.5), 0, "n1")
    agent.step()
    pid = _pids(agent, wid)[0]
    log = tmp_path / "logs" / "stub" / "main" / "0" / "t.log"
    until(lambda: log.exists() and "ready" in log.read_text())
    binder.apply(release=[wid])
    agent.step()
    assert _exists(pid), "SIGTERM is ignored: still there within the grace"
    until(lambda: wid not in agent.supervisor.replicas, timeout=5, step=agent.step)
    assert not _exists(pid)
    assert [s for s, _ in _reports(store, wid)] == ["running"]  # a release is not a failure


def test_a_replica_bound_in_a_stopping_ones_place_starts_only_once_it_has_stopped(
    store, tmp_path
) -> None:
    """A preemption's delta: the victim released and the preemptor bound at once. The
    victim keeps its stop_grace; the preemptor, which fits only in the victim's room,
    starts after the victim's process is gone: never both over the node's capacity."""
    agent = _agent(store, tmp_path)  # a node of 4 cores
    binder = Binder(store)
    stubborn = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('ready', flush=True); time.sleep(600)"
    )
    low = binder.bind(command_job("low", [PY, "-c", stubborn], cpu=3000, stop_grace=1.0), 0, "n1")
    small = binder.bind(command_job("small", SLEEP, cpu=500), 0, "n1")
    agent.step()
    victim = _pids(agent, low)[0]
    log = tmp_path / "logs" / "low" / "main" / "0" / "t.log"
    until(lambda: log.exists() and "ready" in log.read_text())
    high = command_job("high", SLEEP, cpu=3000)
    store.put_job("default", high)
    binder.apply(release=[low])
    binder.bind(high, 0, "n1")  # (the next delta: a poll between them sees the same)
    agent.step()
    assert _exists(victim) and high.id + "/main/0" not in agent.supervisor.replicas

    def step_checked() -> None:
        agent.step()
        running = high.id + "/main/0" in agent.supervisor.replicas
        assert not (running and _exists(victim)), "the preemptor ran beside its victim"

    until(lambda: "high/main/0" in agent.supervisor.replicas, timeout=10, step=step_checked)
    assert not _exists(victim)
    assert small in agent.supervisor.replicas  # what stays bound is never held back
    assert [s for s, _ in _reports(store, "high/main/0")] == ["running"]
    agent.shutdown(stop_tasks=True)


def test_a_restarted_agent_adopts_its_processes_and_kills_what_it_no_longer_owns(
    store, tmp_path
) -> None:
    first = _agent(store, tmp_path)
    binder = Binder(store)
    keep = binder.bind(command_job("keep", SLEEP), 0, "n1")
    moved = binder.bind(command_job("moved", SLEEP), 0, "n1")
    first.step()
    keep_pid, moved_pid = _pids(first, keep)[0], _pids(first, moved)[0]
    del first  # the agent dies without stopping anything (kill -9)
    binder.apply(release=[moved])  # meanwhile its replica moved away
    second = _agent(store, tmp_path)
    until(lambda: moved not in second.supervisor.replicas, step=second.step)
    assert not _exists(moved_pid)
    assert _pids(second, keep) == [keep_pid]  # adopted, not started twice
    assert [s for s, _ in _reports(store, keep)] == ["running"]
    os.kill(keep_pid, signal.SIGKILL)
    until(lambda: len(_reports(store, keep)) == 2, step=second.step)
    assert _reports(store, keep)[1][0] == "failed"
    second.shutdown(stop_tasks=True)


def test_a_replica_over_its_memory_request_is_stopped_and_says_why(store, tmp_path) -> None:
    agent = _agent(store, tmp_path)
    hog = "b = bytearray(120 * 1024 * 1024); import time; time.sleep(600)"
    wid = Binder(store).bind(command_job("hog", [PY, "-c", hog], memory=64), 0, "n1")
    failed = until(
        lambda: [m for s, m in _reports(store, wid) if s != "running"], timeout=15, step=agent.step
    )
    assert len(failed) == 1 and _reports(store, wid)[-1][0] == "failed"
    message = failed[0]
    assert message.startswith("over its memory limit:") and "limit 64 MiB" in message


def test_usage_is_sampled_and_reported_for_the_autoscaler(store, tmp_path) -> None:
    agent = _agent(store, tmp_path)
    burn = "while True: pass"
    binder = Binder(store)
    wid = binder.bind(command_job("burn", [PY, "-c", burn], cpu=50), 0, "n1")
    binder.bind(command_job("idle", SLEEP), 0, "n1")

    def usage(group: str) -> float:
        return store.group_usage("default", 0).get(group, (0.0, 0.0))[0]

    # a busy loop on a 50m request: 20.0 with a core to itself, still > 0.5 with 1/40 of one
    # (the sleeper's first sample holds its interpreter's start-up; then it reads idle)
    until(
        lambda: (
            usage("burn/main") > 0.5
            and "idle/main" in store.group_usage("default", 0)
            and usage("idle/main") < 0.1
        ),
        timeout=20,
        step=agent.step,
    )
    server = LogServer("127.0.0.1:0", tmp_path, agent.views)
    server.start()
    try:
        with urllib.request.urlopen(f"http://{server.address}/v1/replicas") as resp:
            shown = json.loads(resp.read())
        assert shown[0]["workload_id"] == wid and shown[0]["state"] == "running"
    finally:
        server.close()
        agent.shutdown(stop_tasks=True)


def test_log_server_needs_the_token_when_it_has_one(store, tmp_path) -> None:
    folder = tmp_path / "logs" / "web" / "main" / "0"
    folder.mkdir(parents=True)
    (folder / "t.log").write_bytes(b"hello\n")
    server = LogServer("127.0.0.1:0", tmp_path, lambda: [], token="s3cret")
    server.start()
    try:
        url = f"http://{server.address}/v1/logs/web/main/0?offset=2"
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(url)
        assert err.value.code == 401
        req = urllib.request.Request(url, headers={"Authorization": "Bearer s3cret"})
        with urllib.request.urlopen(req) as resp:
            assert resp.read() == b"llo\n" and resp.headers["X-Forge-Offset"] == "6"
    finally:
        server.close()


def _exists(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_checked_task_reports_each_change_of_its_health_verdict(store, tmp_path) -> None:
    flag = tmp_path / "ok"
    check = {
        "command": [
            PY,
            "-c",
            f"import os, sys; sys.exit(0 if os.path.exists({str(flag)!r}) else 1)",
        ],
        "interval": 0.05,
        "timeout": 5.0,
    }
    agent = _agent(store, tmp_path)
    binder = Binder(store)
    wid = binder.bind(command_job("web", SLEEP, check=check), 0, "n1")
    plain = binder.bind(command_job("plain", SLEEP), 0, "n1")

    def verdicts() -> list[bool | None]:
        found = store.reports_since("default", 0)
        return [r.healthy for r in found if r.workload_id == wid and r.cpu is None]

    until(lambda: verdicts() == [None, False], step=agent.step)  # started, then failing
    flag.touch()
    until(lambda: verdicts() == [None, False, True], step=agent.step)
    for _ in range(5):
        agent.step()  # no change: nothing more to say
    assert verdicts() == [None, False, True]
    flag.unlink()
    until(lambda: verdicts() == [None, False, True, False], step=agent.step)
    assert all(
        r.healthy is None for r in store.reports_since("default", 0) if r.workload_id == plain
    )
    agent.shutdown(stop_tasks=True)


def test_a_replica_bound_again_on_another_version_is_restarted_on_it(store, tmp_path) -> None:
    agent = _agent(store, tmp_path)
    binder = Binder(store)
    job = command_job("web", SLEEP, env={"V": "1"})
    wid = binder.bind(job, 0, "n1")
    until(lambda: agent.supervisor.replicas.get(wid), step=agent.step)
    first = _pids(agent, wid)
    (a,) = store.assignments("default")
    new = command_job("web", SLEEP, env={"V": "2"})
    store.put_job("default", new)
    # the loop's persist: released and bound again in one delta, on the new version
    binder.apply(bind=[a.model_copy(update={"version": new.groups[0].version})], release=[wid])
    until(
        lambda: wid in agent.supervisor.replicas and _pids(agent, wid) not in ([], first),
        step=agent.step,
    )
    assert not any(alive(p) for p in first)
    assert [s for s, _ in _reports(store, wid)] == ["running", "running"]  # no exit reported
    agent.shutdown(stop_tasks=True)


def test_an_adopted_gang_member_is_restarted_when_its_peers_moved_while_the_agent_was_down(
    store, tmp_path
) -> None:
    """What a member was told is kept with its processes (the state file), so the
    agent that adopts it after a kill -9 sees that a peer moved meanwhile and tells
    it by a restart, as the agent that started it would have."""
    labelled = local_node().model_copy(update={"labels": {ADDRESS_LABEL: "10.0.0.1"}})
    config = AgentConfig(node=labelled, data_dir=tmp_path, poll=0.05, heartbeat_every=0.2)
    others = [
        Node(id=n, cpu=4000, memory=8192, labels={ADDRESS_LABEL: a})
        for n, a in (("n2", "10.0.0.2"), ("n3", "10.0.0.3"))
    ]
    store.apply_delta("default", Fence(1, 100), Delta(nodes_upsert=others))
    base = command_job("train", SLEEP, replicas=2)
    gang = base.model_copy(update={"groups": (base.groups[0].model_copy(update={"gang": True}),)})
    binder = Binder(store)
    binder.pass_no = 100
    me = binder.bind(gang, 0, "n1")
    peer = binder.bind(gang, 1, "n2")
    registered: list[Node] = []
    first = Agent(config, store, registered.append)
    until(lambda: _pids(first, me) if me in first.supervisor.replicas else [], step=first.step)
    first.step()  # its state saved, with what it was told
    told_pid = _pids(first, me)[0]
    # the agent dies without stopping anything (kill -9); meanwhile the peer moves to n3
    moved = Assignment(
        workload_id=peer, job="train", group="main", ordinal=1, node="n3", cpu=500, memory=256
    )
    binder.apply(release=[peer], bind=[moved])
    second = Agent(config, store, registered.append)

    def told_again() -> bool:
        return me in second.supervisor.replicas and _pids(second, me) not in ([], [told_pid])

    until(told_again, step=second.step)
    assert not _exists(told_pid)
    (now_pid,) = _pids(second, me)
    peers = task_environs({"FORGE_WORKLOAD_ID": me})[now_pid]["FORGE_PEERS"]
    assert "10.0.0.3" in peers and "10.0.0.2" not in peers  # told where the peer is now
    second.shutdown(stop_tasks=True)
