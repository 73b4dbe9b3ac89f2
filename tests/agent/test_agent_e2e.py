"""Real agents: three ``forge agent`` processes running real commands against a dev
server, a ``worker.py`` process and a SQLite store.

One cluster serves the whole module (starting the worker and the agents is most of
the cost); the tests run in file order and each sets the state it needs first (the
web job's replica count), so each still says one thing on its own: 30 replicas
answer on their ports; ``forge status`` shows each node's usage and ports; a task
killed with SIGKILL is restarted by the reschedule policy; a drained node's
processes stop and run elsewhere; scaling down ends the processes; a priority-90 job
on a cluster full of priority-20 processes runs by preemption, its victims stopped
after their grace and pending, nothing over capacity at any poll; a CPU-burning
autoscaled group grows within two autoscale periods; rolling updates (a checked group
rolls with 5 of 6 answering and a crashing version is reverted; a group without a
check reverts a crashing version to the one that completed, not the one before; a
canary of one waits for ``forge job promote``; a ``kill -9`` of the worker mid-rollout
resumes its wave and runs no replica twice); and last, a ``kill -9`` of an agent moves its replicas
within the heartbeat TTL + 5 s.

What runs is found from the outside, as an operator would: the task processes by
their environment (``FORGE_WORKLOAD_ID``, see ``task_processes``), their ports from
the agents' running reports, their answers with urllib.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pytest
import pytest_asyncio

from forge.core.models import Assignment, Job
from forge.core.rollout import UpdatePolicy
from forge.wire import contract as c
from tests.agent.cluster import (
    AgentCluster,
    agent_cluster,
    each_answers_on_its_own,
    http_body,
    http_status,
)
from tests.agent.helpers import alive, task_environs, task_processes
from tests.e2e.procs import eventually

pytestmark = pytest.mark.slow

T = TypeVar("T")

CLUSTER = "agents-e2e"
TTL = 6.0  # heartbeats every 0.5 s: a loaded machine must not lose a node by mistake
#: Each agent offers 2 cores: 30 web replicas of 100m need two of the three.
AGENT_CPU = 2000
AUTOSCALE_EVERY = 3.0
SERVE = (
    "import http.server as h, os; "
    "h.test(h.SimpleHTTPRequestHandler, port=int(os.environ['FORGE_PORT_HTTP']), bind='127.0.0.1')"
)
BURN = "while True: pass"


class Cluster(AgentCluster):
    def bindings(self, job: str) -> list[Assignment]:
        return [a for a in self.store.assignments(CLUSTER, limit=100_000) if a.job == job]

    def running(self, job: str) -> list[Assignment]:
        return [a for a in self.bindings(job) if a.status == "running"]

    def processes(self, job: str) -> dict[str, set[int]]:
        """workload id -> pids of its live task processes, on any node."""
        out: dict[str, set[int]] = {}
        for pid, wid in task_processes({"FORGE_CLUSTER": CLUSTER}).items():
            if wid.startswith(f"{job}/"):
                out.setdefault(wid, set()).add(pid)
        return out

    def ports(self, job: str) -> dict[str, int]:
        return self.http_ports(self.bindings(job))


def _web(replicas: int) -> Job:
    return _job("web", SERVE, replicas, ports=["http"], stop_grace=2.0)


def _job(name: str, code: str, replicas: int, *, autoscale: Any = None, **task: Any) -> Job:
    return Job.model_validate(
        {
            "id": name,
            "name": name,
            "groups": [
                {
                    "name": "main",
                    "scaling": {"min": 0, "max": 50, "desired": replicas},
                    "reschedule": {"delay": 0.5, "delay_function": "constant", "attempts": 10},
                    "autoscale": autoscale,
                    "tasks": [
                        {
                            "name": "t",
                            "command": [sys.executable, "-c", code],
                            "resources": {"cpu": 100, "memory": 64},
                            **task,
                        }
                    ],
                }
            ],
        }
    )


async def _forge(cl: Cluster, *args: str) -> str:
    """Run the ``forge`` command against the cluster (in a thread: the loop stays free)."""
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "forge", *args],
        env={**os.environ, **cl.env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _now(fn: Callable[[], T]) -> Callable[[], Any]:
    async def probe() -> T:
        return fn()

    return probe


@pytest_asyncio.fixture(scope="module")
async def cluster(dev_env: Any, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Cluster]:
    flags = ("--cpu", str(AGENT_CPU), "--usage-every", "1")
    tmp = tmp_path_factory.mktemp("agents")
    async with agent_cluster(dev_env, tmp, CLUSTER, ttl=TTL, agent_flags=flags, make=Cluster) as cl:
        for node in ("a", "b", "c"):
            cl.start_agent(node)
        await eventually(cl.fc.status, lambda s: len(s.nodes) == 3, what="3 agents registered")
        yield cl


@pytest.fixture
def show_logs_on_failure(cluster: Cluster, request: pytest.FixtureRequest) -> Any:
    yield cluster
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        print(cluster.logs())


async def _web_running(cl: Cluster, n: int, timeout: float = 60.0) -> dict[str, int]:
    """Set the web job to ``n`` replicas and wait until each answers on its own port."""
    await cl.fc.submit_job(_web(n))
    await eventually(
        _now(lambda: cl.running("web")),
        lambda rows: len(rows) == n and len(cl.bindings("web")) == n,
        timeout=timeout,
        what=f"{n} web replicas running",
    )
    ports: dict[str, int] = await eventually(
        _now(lambda: cl.ports("web")),
        lambda p: each_answers_on_its_own(p, n),
        timeout=timeout,
        what=f"each of {n} web replicas answering on its port",
    )
    return ports


STUBBORN = (  # ignores SIGTERM: the agent must wait out its stop_grace, then SIGKILL
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(3600)"
)


def _cpu_by_node(cpu: dict[str, int]) -> dict[str, int]:
    """node -> the cpu requested by the live task processes of the jobs in ``cpu``."""
    out: dict[str, int] = {}
    for env in task_environs({"FORGE_CLUSTER": CLUSTER}).values():
        job = env["FORGE_WORKLOAD_ID"].split("/")[0]
        if job in cpu:
            out[env["FORGE_NODE"]] = out.get(env["FORGE_NODE"], 0) + cpu[job]
    return out


async def test_a_priority_90_job_on_a_full_cluster_preempts_and_never_runs_over_capacity(
    show_logs_on_failure,
) -> None:
    """First in the module: the three agents are empty (2 cores each)."""
    cl: Cluster = show_logs_on_failure
    try:
        await _preempt_on_a_full_cluster(cl)
    finally:
        for job in ("urgent", "filler"):  # the next tests start from an empty cluster
            with contextlib.suppress(Exception):  # (not submitted: nothing to stop)
                await cl.fc.stop_job(job)
        await eventually(
            _now(lambda: cl.processes("filler") or cl.processes("urgent")),
            lambda left: not left,
            timeout=30,
            what="filler and urgent stopped",
        )


async def _preempt_on_a_full_cluster(cl: Cluster) -> None:
    res = {"cpu": 1000, "memory": 64}
    filler = _job("filler", STUBBORN, 6, resources=res, stop_grace=2.0)
    await cl.fc.submit_job(filler.model_copy(update={"priority": 20}))
    await eventually(
        _now(lambda: cl.running("filler")),
        lambda rows: len(rows) == 6,
        timeout=60,
        what="six priority-20 replicas filling the three agents",
    )
    urgent = _job("urgent", STUBBORN, 1, resources={"cpu": 2000, "memory": 64})
    await cl.fc.submit_job(urgent.model_copy(update={"priority": 90}))
    cpu = {"filler": 1000, "urgent": 2000}
    deadline = time.monotonic() + 60
    while not cl.processes("urgent"):
        used = _cpu_by_node(cpu)
        assert all(v <= AGENT_CPU for v in used.values()), f"over capacity: {used}"
        assert time.monotonic() < deadline, "the priority-90 replica never ran"
        await asyncio.sleep(0.1)  # poll interval, not synchronisation
    for _ in range(20):  # and for a while after it started
        used = _cpu_by_node(cpu)
        assert all(v <= AGENT_CPU for v in used.values()), f"over capacity: {used}"
        await asyncio.sleep(0.1)
    [where] = [a.node for a in cl.bindings("urgent")]
    bound = {a.workload_id for a in cl.bindings("filler")}
    victims = sorted({f"filler/main/{i}" for i in range(6)} - bound)
    assert len(victims) == 2 and all(a.node != where for a in cl.bindings("filler"))
    for wid in victims:
        why = await cl.fc.explain(wid)
        assert why.state == "pending"
        assert any(r.startswith("preempted by urgent/main/0 ") for r in why.reasons), why.reasons
    assert not set(cl.processes("filler")) & set(victims)  # stopped after their grace


async def test_thirty_replicas_each_answer_on_their_own_port(show_logs_on_failure) -> None:
    cl: Cluster = show_logs_on_failure
    ports = await _web_running(cl, 30, timeout=90)
    assert len(set(ports.values())) == 30
    assert sorted(ports) == sorted(f"web/main/{i}" for i in range(30))
    procs = await eventually(
        _now(lambda: cl.processes("web")), lambda p: len(p) == 30, what="30 web processes"
    )
    assert all(len(pids) == 1 for pids in procs.values())  # one task, one process, no extras
    assert len({a.node for a in cl.bindings("web")}) >= 2  # more than one node's worth


async def test_forge_status_shows_what_each_node_uses_and_its_ports(show_logs_on_failure) -> None:
    cl: Cluster = show_logs_on_failure
    ports = await _web_running(cl, 30, timeout=90)
    usage = await eventually(
        cl.fc.node_usage,
        lambda u: sorted(p for n in u.values() for _, _, p in n.ports) == sorted(ports.values()),
        timeout=30,
        what="a usage report with its ports from each of the 30 replicas",
    )
    per_node = Counter(a.node for a in cl.bindings("web"))
    assert {n: u.reporting for n, u in usage.items()} == dict(per_node)
    assert all(u.memory > 0 for u in usage.values())  # python interpreters hold memory
    doc = json.loads(await _forge(cl, "status", "--json"))
    shown = {
        p["workload_id"]: p["port"]
        for n in doc["nodes"]
        for p in n.get("usage", {}).get("ports", [])
        if p["name"] == "http"
    }
    assert shown == ports
    text = await _forge(cl, "status")
    assert "CPU USED" in text and "PORTS" in text, text


async def test_a_task_killed_with_sigkill_is_restarted_by_the_reschedule_policy(
    show_logs_on_failure,
) -> None:
    cl: Cluster = show_logs_on_failure
    await _web_running(cl, 30, timeout=90)
    wid = "web/main/7"
    (old_pid,) = cl.processes("web")[wid]
    os.kill(old_pid, signal.SIGKILL)
    restarted = await eventually(
        _now(lambda: cl.processes("web").get(wid, set())),
        lambda pids: len(pids) == 1 and old_pid not in pids,
        timeout=30,
        what=f"{wid} running again in a new process",
    )
    port = await eventually(
        _now(lambda: cl.ports("web").get(wid)),
        lambda p: p is not None and http_status(p) == 200,
        timeout=30,
        what=f"the restarted {wid} answering",
    )
    reports = [r for r in cl.store.reports_since(CLUSTER, 0, 1_000_000) if r.workload_id == wid]
    transitions = [(r.status, r.message) for r in reports if r.cpu is None]
    assert ("failed", "task t was killed by SIGKILL") in transitions
    assert transitions[-1][0] == "running" and transitions[-1][1].endswith(f"http={port}")
    assert not alive(old_pid) and restarted != {old_pid}


async def test_a_drained_nodes_processes_stop_and_run_elsewhere(show_logs_on_failure) -> None:
    cl: Cluster = show_logs_on_failure
    await _web_running(cl, 30, timeout=90)
    held = [a.node for a in cl.bindings("web")]
    victim = max(sorted(set(held)), key=held.count)
    moving = {a.workload_id for a in cl.bindings("web") if a.node == victim}
    before = cl.processes("web")
    old = {pid for wid in moving for pid in before[wid]}
    assert await cl.fc.drain_node(victim) == len(moving)
    await eventually(
        _now(lambda: cl.running("web")),
        lambda rows: len(rows) == 30 and all(r.node != victim for r in rows),
        timeout=60,
        what=f"the replicas of drained node {victim} running elsewhere",
    )
    await eventually(
        _now(lambda: [p for p in old if alive(p)]),
        lambda left: not left,
        timeout=30,
        what=f"the processes on {victim} stopped",
    )
    ports = await eventually(
        _now(lambda: cl.ports("web")),
        lambda p: all(http_status(p[w]) == 200 for w in moving if w in p) and moving <= set(p),
        timeout=30,
        what="the moved replicas answering",
    )
    assert all(pid not in old for wid in moving for pid in cl.processes("web")[wid])
    assert len({ports[w] for w in moving}) == len(moving)


async def test_scaling_down_ends_the_processes(show_logs_on_failure) -> None:
    cl: Cluster = show_logs_on_failure
    await _web_running(cl, 30, timeout=90)
    before = cl.processes("web")
    assert len(before) == 30
    await cl.fc.scale("web", "main", 5)
    keep = {f"web/main/{i}" for i in range(5)}
    gone = {pid for wid, pids in before.items() if wid not in keep for pid in pids}
    await eventually(
        _now(lambda: [p for p in gone if alive(p)]),
        lambda left: not left,
        timeout=30,
        what="the 25 scaled-away processes ended",
    )
    now = cl.processes("web")
    assert set(now) == keep and all(now[w] == before[w] for w in keep)  # the 5 untouched
    assert {a.workload_id for a in cl.bindings("web")} == keep


async def test_a_cpu_burning_autoscaled_group_grows_within_two_periods(
    show_logs_on_failure,
) -> None:
    cl: Cluster = show_logs_on_failure
    policy = {
        "policy": "threshold",
        "scale_up": 0.8,
        "scale_down": 0.1,
        "step": 1,
        "cooldown": 120.0,  # one step only: the test needs growth, not a machine on fire
        "interval": AUTOSCALE_EVERY,
    }
    try:
        await cl.fc.submit_job(_job("burn", BURN, 1, autoscale=policy))
        await eventually(
            _now(lambda: cl.store.group_usage(CLUSTER, 0).get("burn/main")),
            lambda u: u is not None,
            timeout=30,
            what="a usage report of the burning replica",
        )
        measured = time.monotonic()
        await eventually(
            _now(lambda: cl.bindings("burn")),
            lambda rows: len(rows) == 2,
            timeout=2 * AUTOSCALE_EVERY + 1.0,  # + a pass on a busy machine
            what="the burn group grown to 2 replicas",
        )
        grew_in = time.monotonic() - measured
        assert cl.store.group_usage(CLUSTER, 0)["burn/main"][0] > 0.8
        await eventually(
            _now(lambda: cl.processes("burn")),
            lambda p: len(p) == 2,
            timeout=30,
            what="2 burning processes",
        )
        print(f"burn grew {grew_in:.1f} s after its first usage report")
    finally:
        await cl.fc.stop_job("burn")
    await eventually(
        _now(lambda: cl.processes("burn")), lambda p: not p, timeout=30, what="burn stopped"
    )


ROLL_UPDATE = {
    "max_parallel": 1,
    "min_healthy_time": 0.5,
    "healthy_deadline": 30.0,
    "auto_revert": True,
}
ROLL_CHECK = {"http": {"port": "http", "path": "/"}, "interval": 0.2, "timeout": 1.0}


def _roll(
    env: str, code: str = SERVE, *, job: str = "roll", update: dict[str, Any] | None = None
) -> Job:
    """A 6-replica HTTP group with a health check; ``env`` is its ``V`` (the change)."""
    spec = _job(job, code, 6, ports=["http"], stop_grace=2.0, env={"V": env}, check=ROLL_CHECK)
    policy = UpdatePolicy(**(ROLL_UPDATE if update is None else update))
    g = spec.groups[0].model_copy(update={"update": policy})
    return spec.model_copy(update={"groups": (g,)})


@dataclass
class Watch:
    """Polls one job's group every 0.2 s: how many replicas answer HTTP, and the
    versions bound; each poll's counts are kept. With ``processes`` it also records
    every task process seen: pid -> (workload id, its ``V``)."""

    cl: Cluster
    job: str = "roll"
    processes: dict[int, tuple[str, str]] | None = None
    seq: int = 0
    ports: dict[tuple[str, str], int] = field(default_factory=dict)  # (wid, node) -> port
    answering: list[int] = field(default_factory=list)
    versions: list[Counter[str]] = field(default_factory=list)

    def poll(self) -> None:
        for r in self.cl.store.reports_since(CLUSTER, self.seq, limit=100_000):
            self.seq = r.seq
            if r.workload_id.startswith(f"{self.job}/") and "ports http=" in r.message:
                self.ports[(r.workload_id, r.node)] = int(r.message.rsplit("=", 1)[1])
        if self.processes is not None:
            for pid, env in task_environs({"FORGE_CLUSTER": CLUSTER}).items():
                if env["FORGE_WORKLOAD_ID"].startswith(f"{self.job}/"):
                    self.processes[pid] = (env["FORGE_WORKLOAD_ID"], env.get("V", ""))
        bound = self.cl.bindings(self.job)
        urls = [self.ports.get((a.workload_id, a.node)) for a in bound]
        self.answering.append(sum(1 for p in urls if p is not None and http_status(p) == 200))
        self.versions.append(Counter(a.version for a in bound))

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await asyncio.to_thread(self.poll)
            await asyncio.sleep(0.2)  # the poll interval, not synchronisation

    async def last(self) -> tuple[Counter[str], int] | None:
        """The latest poll: versions bound, replicas answering (None before one)."""
        if not self.versions or not self.answering:
            return None
        return self.versions[-1], self.answering[-1]

    def clear(self) -> None:
        self.answering.clear()
        self.versions.clear()


def all_on(version: str) -> Callable[[tuple[Counter[str], int] | None], bool]:
    """The watched group's 6 replicas are bound to ``version`` and all answer."""
    return lambda got: got == (Counter({version: 6}), 6)


def _phase(doc: c.LoopStatus, group: str) -> str | None:
    """The published phase of ``group``'s rollout (None: no rollout)."""
    return next((r.phase for r in doc.rollouts if r.group == group), None)


async def _rollout_done(cl: Cluster, group: str) -> None:
    """Done once the last new replica has been healthy min_healthy_time (the store
    says the new version as soon as it is bound, before its agent has replaced the
    process)."""
    await eventually(
        cl.fc.published,
        lambda d: d is not None and all(r.group != group for r in d.rollouts),
        what=f"the rollout of {group} done",
    )


async def test_a_checked_group_rolls_with_five_of_six_answering_and_reverts_a_crashing_version(
    show_logs_on_failure,
) -> None:
    cl: Cluster = show_logs_on_failure
    v1, v2 = _roll("1"), _roll("2")
    await cl.fc.submit_job(v1)
    watch = Watch(cl)
    settled = watch.last
    ver1, ver2 = v1.groups[0].version, v2.groups[0].version
    stop = asyncio.Event()
    poller = asyncio.create_task(watch.run(stop))
    try:
        await eventually(settled, all_on(ver1), timeout=60, what="6 replicas of v1 answering")
        before = {pid for pids in cl.processes("roll").values() for pid in pids}
        watch.clear()
        await cl.fc.submit_job(v2)
        await eventually(settled, all_on(ver2), timeout=90, what="6 replicas of v2")
        await _rollout_done(cl, "roll/main")
        assert min(watch.answering) >= 5, watch.answering
        assert len(watch.answering) > 10  # polled through the whole rollout
        assert all(sum(v.values()) == 6 for v in watch.versions)
        # every replica was replaced: its binding on the new version, a new process
        assert [a.version for a in cl.bindings("roll")] == [ver2] * 6
        after = {pid for pids in cl.processes("roll").values() for pid in pids}
        assert len(after) == 6 and not before & after
        # a version whose command exits at once: stopped after its first wave, and
        # the group goes back to v2 (auto_revert), all 6 healthy
        bad = _roll("3", code="raise SystemExit(3)")
        ver3 = bad.groups[0].version
        watch.clear()
        await cl.fc.submit_job(bad)
        await eventually(
            _now(lambda: [v.version for v in cl.store.group_versions(CLUSTER, "roll")]),
            lambda got: got[-2:] == [ver3, ver2],
            timeout=60,
            what="the previous version submitted again",
        )
        await eventually(settled, all_on(ver2), timeout=60, what="6 replicas back on v2")
        assert max(v[ver3] for v in watch.versions) <= 1, watch.versions  # one wave only
        assert min(watch.answering) >= 5, watch.answering
    finally:
        stop.set()
        await poller
    await cl.fc.stop_job("roll")
    await eventually(
        _now(lambda: cl.processes("roll")), lambda p: not p, timeout=30, what="roll stopped"
    )


#: Answers its ``V`` over HTTP: what an operator checks after a revert.
ANSWER_V = """
import http.server as h, os
class Answer(h.BaseHTTPRequestHandler):
    def do_GET(self):
        body = os.environ["V"].encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
h.HTTPServer(("127.0.0.1", int(os.environ["FORGE_PORT_HTTP"])), Answer).serve_forever()
"""
#: The reported policy: no health check, so a replica is healthy once it has run
#: ``min_healthy_time``.
UNCHECKED_UPDATE = {"max_parallel": 1, "min_healthy_time": 2.0, "auto_revert": True}


def _answering(env: str, code: str = ANSWER_V) -> Job:
    """A 6-replica HTTP group without a health check that answers its ``V``."""
    spec = _job("answer", code, 6, ports=["http"], stop_grace=2.0, env={"V": env})
    g = spec.groups[0].model_copy(update={"update": UpdatePolicy(**UNCHECKED_UPDATE)})
    return spec.model_copy(update={"groups": (g,)})


async def test_a_group_without_a_check_reverts_a_crashing_version_to_the_one_that_completed(
    show_logs_on_failure,
) -> None:
    # v1, then v2 rolled until all six answer "2", then at once a v3 that exits 3:
    # the last stable version is v2 (its last wave settles before v3 rolls), so the
    # auto-revert ends with six replicas answering "2", never "1"
    cl: Cluster = show_logs_on_failure
    watch = Watch(cl, job="answer")
    seen: list[Counter[str | None]] = []

    def answers() -> Counter[str | None]:
        watch.poll()  # the ports the agents reported
        got = Counter(
            http_body(port) if port is not None else None
            for port in (watch.ports.get((a.workload_id, a.node)) for a in cl.bindings("answer"))
        )
        seen.append(got)
        return got

    v2 = _answering("2")
    ver2 = v2.groups[0].version
    await cl.fc.submit_job(_answering("1"))
    await eventually(_now(answers), lambda got: got == Counter({"1": 6}), timeout=60, what="v1")
    await cl.fc.submit_job(v2)
    await eventually(_now(answers), lambda got: got == Counter({"2": 6}), timeout=120, what="v2")
    seen.clear()
    bad = _answering("3", code="raise SystemExit(3)")
    await cl.fc.submit_job(bad)
    await eventually(
        _now(lambda: [v.version for v in cl.store.group_versions(CLUSTER, "answer")]),
        lambda got: got[-2:] == [bad.groups[0].version, ver2],
        timeout=60,
        what="v2 submitted again by the revert",
    )
    await eventually(
        _now(answers), lambda got: got == Counter({"2": 6}), timeout=60, what="6 answering 2"
    )
    assert [a.version for a in cl.bindings("answer")] == [ver2] * 6
    assert not any(got["1"] for got in seen), seen  # never back to v1
    await cl.fc.stop_job("answer")
    await eventually(
        _now(lambda: cl.processes("answer")), lambda p: not p, timeout=30, what="answer stopped"
    )


async def test_a_canary_of_one_waits_for_forge_job_promote(show_logs_on_failure) -> None:
    cl: Cluster = show_logs_on_failure
    update = {**ROLL_UPDATE, "canary": 1, "auto_revert": False}
    v1, v2 = _roll("1", job="canary", update=update), _roll("2", job="canary", update=update)
    ver1, ver2 = v1.groups[0].version, v2.groups[0].version
    watch = Watch(cl, job="canary")
    stop = asyncio.Event()
    poller = asyncio.create_task(watch.run(stop))
    try:
        await cl.fc.submit_job(v1)
        await eventually(watch.last, all_on(ver1), timeout=60, what="6 canary replicas of v1")
        watch.clear()
        await cl.fc.submit_job(v2)
        await eventually(
            cl.fc.published,
            lambda d: d is not None and _phase(d, "canary/main") == "awaiting-promotion",
            timeout=60,
            what="the rollout holding at its canary",
        )
        # held: one replica on the new version (healthy for min_healthy_time), five old
        assert Counter(a.version for a in cl.bindings("canary")) == Counter({ver1: 5, ver2: 1})
        status = await _forge(cl, "job", "status", "canary")
        assert "rollout: awaiting-promotion" in status, status
        assert "waiting for `forge job promote`" in status, status
        held = len(watch.versions)
        promoted = await _forge(cl, "job", "promote", "canary")
        assert "canary/main: promoted" in promoted
        await eventually(watch.last, all_on(ver2), timeout=90, what="6 canary replicas of v2")
        await _rollout_done(cl, "canary/main")
        before_promote = watch.versions[:held]
        assert max(v[ver2] for v in before_promote) == 1, before_promote  # the canary only
        assert min(watch.answering) >= 5, watch.answering
    finally:
        stop.set()
        await poller
    await cl.fc.stop_job("canary")
    await eventually(
        _now(lambda: cl.processes("canary")), lambda p: not p, timeout=30, what="canary stopped"
    )


async def test_kill_9_of_the_worker_mid_rollout_resumes_its_wave_and_runs_no_replica_twice(
    show_logs_on_failure,
) -> None:
    cl: Cluster = show_logs_on_failure
    # waves of 2, each healthy 3 s before the next: long enough to kill inside one
    update = {"max_parallel": 2, "min_healthy_time": 3.0, "healthy_deadline": 60.0}
    v1, v2 = _roll("1", job="takeover", update=update), _roll("2", job="takeover", update=update)
    ver1, ver2 = v1.groups[0].version, v2.groups[0].version
    seen: dict[int, tuple[str, str]] = {}
    watch = Watch(cl, job="takeover", processes=seen)
    stop = asyncio.Event()
    poller = asyncio.create_task(watch.run(stop))
    try:
        await cl.fc.submit_job(v1)
        await eventually(watch.last, all_on(ver1), timeout=60, what="6 takeover replicas of v1")
        watch.clear()
        await cl.fc.submit_job(v2)
        # the second wave bound: the first wave's replicas run v2 and were healthy
        bound_at_kill = await eventually(
            _now(lambda: Counter(a.version for a in cl.bindings("takeover"))[ver2]),
            lambda n: n in (3, 4),
            timeout=60,
            what="the rollout in its second wave",
        )
        cl.worker.kill9()
        at_kill = len(watch.versions)
        first_wave = {pid for pid, (_, v) in seen.items() if v == "2" and alive(pid)}
        cl.new_worker()
        await eventually(watch.last, all_on(ver2), timeout=120, what="6 takeover replicas of v2")
        await _rollout_done(cl, "takeover/main")
    finally:
        stop.set()
        await poller
    # the rollout went on from its wave: the new version never lost a replica...
    on_new = [v[ver2] for v in watch.versions]
    assert on_new == sorted(on_new), on_new
    assert min(on_new[at_kill:]) >= bound_at_kill and on_new[-1] == 6, (at_kill, on_new)
    # ...the replicas it had started before the kill still run, the same processes...
    assert len(first_wave) >= 2, seen
    assert all(alive(pid) for pid in first_wave), (first_wave, seen)
    # ...and no replica ran twice: each was started once on the old version and
    # once on the new, never again
    starts = Counter(seen.values())
    assert sorted(starts) == sorted((f"takeover/main/{i}", v) for i in range(6) for v in "12")
    assert set(starts.values()) == {1}, starts
    assert min(watch.answering) >= 6 - update["max_parallel"], watch.answering
    await cl.fc.stop_job("takeover")
    await eventually(
        _now(lambda: cl.processes("takeover")), lambda p: not p, timeout=30, what="takeover stopped"
    )


async def test_kill_9_of_an_agent_moves_its_replicas_within_the_ttl(show_logs_on_failure) -> None:
    cl: Cluster = show_logs_on_failure
    await _web_running(cl, 5)
    held = [a.node for a in cl.bindings("web")]
    victim = max(sorted(set(held)), key=held.count)  # the agent holding the most replicas
    cl.agents[victim].send_signal(signal.SIGKILL)
    cl.agents[victim].wait()
    killed = time.monotonic()
    await eventually(
        _now(lambda: cl.running("web")),
        lambda rows: len(rows) == 5 and all(r.node != victim for r in rows),
        timeout=TTL + 5 + 10,  # + the time a pass and a start take on a loaded machine
        what="replicas of the killed agent running elsewhere",
    )
    took = time.monotonic() - killed
    ports = await eventually(
        _now(lambda: cl.ports("web")),
        lambda p: each_answers_on_its_own(p, 5),
        timeout=30,
        what="the moved replicas answering",
    )
    assert sorted(ports) == [f"web/main/{i}" for i in range(5)]
    print(f"replicas moved {took:.1f} s after the kill -9 (TTL {TTL} s)")
