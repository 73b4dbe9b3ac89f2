"""The store goes away for a while; the loop waits it out and loses nothing.

(a) SQLite: the test holds an exclusive lock on the worker's database file
    (``BEGIN EXCLUSIVE``) for several seconds while jobs are submitted, scaled and
    nodes lost. Writers wait on SQLite's busy timeout (30 s), kept alive by the
    store activities' side-thread heartbeat (the heartbeat timeout is 2 s); once the
    lock goes, everything is written within moments, not after a timeout.
(b) PostgreSQL: the server is stopped (``pg_ctlcluster ... stop``, which also kills
    the worker's pooled connections) and started again a few seconds later. Store
    activities fail and are retried; the pool discards the dead connections.

In both: submissions are accepted during the outage (they are durable in the
workflow's history), the workflow stays running with no failed workflow task, and
afterwards the cluster converges with every invariant holding and the store equal
to the workflow's state.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sqlite3
import subprocess
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from temporalio.api.enums.v1 import PendingActivityState
from temporalio.client import WorkflowExecutionStatus, WorkflowUpdateStage
from temporalio.testing import WorkflowEnvironment

from forge.client.client import ForgeClient
from forge.core.models import Job
from forge.core.reconcile import ReconcileOptions
from forge.stores import Store, open_store
from forge.wire import contract as c
from tests.e2e.procs import eventually
from tests.faults.checks import history_figures, record_figures, settle, store_violations
from tests.faults.conftest import PG_BASE
from tests.workflow.harness import job, node

pytestmark = pytest.mark.slow

OUTAGE = 6.0  # seconds the store is unavailable (the fault's length, not a wait for state)


def _client(env: WorkflowEnvironment, queue: str, name: str) -> ForgeClient:
    return ForgeClient(
        env.client,
        cluster=name,
        task_queue=queue,
        options=c.ClusterOptions(
            watch_poll=0.2, reconcile=ReconcileOptions(max_placements=20, backoff_cap=2.0)
        ),
        search_attributes=False,
    )


async def _pending_activity(fc: ForgeClient, name: str) -> dict[str, Any]:
    """The workflow's pending activity of type ``name``: its attempt, state, last
    failure and how long ago it last heartbeat (None if it never did)."""
    desc = await fc.handle().describe()
    for pa in desc.raw_description.pending_activities:
        if pa.activity_type.name == name:
            beat = pa.last_heartbeat_time
            return {
                "attempt": pa.attempt,
                "state": PendingActivityState.Name(pa.state),
                "failure": pa.last_failure.message,
                "heartbeat_age_s": (
                    round(time.time() - beat.seconds - beat.nanos / 1e9, 2)
                    if beat.seconds
                    else None
                ),
            }
    raise LookupError(f"no pending {name}")


def _holder(store: Store, cluster: str) -> str:
    """A node that holds replicas (the first by id), per the store."""
    return sorted({a.node for a in store.assignments(cluster, limit=1_000_000)})[0]


async def _outage(
    fc: ForgeClient,
    store: Store,
    jobs: dict[str, Job],
    *,
    still_down: Callable[[], Awaitable[bool]],
    readable: bool,
    victim: str,
) -> dict[str, Any]:
    """What the test does while the store is unavailable; returns figures.

    Submits a batch (must be accepted at once: durable in history), waits until the
    pass that writes it is stuck on the store, then scales a job of that batch (the
    update must be accepted although the job is neither queued nor loaded yet), loses
    a node that holds replicas (``victim``, read from the store before the outage),
    and checks the loop still answers (describe: its summary memo). When the
    store stays ``readable`` (SQLite in WAL mode under a write lock) it also checks
    that nothing was written meanwhile."""
    out: dict[str, Any] = {}
    fence_before = await asyncio.to_thread(store.fence, fc.cluster) if readable else None
    batch = [job(f"late{i}", replicas=5, cpu=500, memory=512) for i in range(3)]
    t0 = time.monotonic()
    await fc.submit_jobs(batch, wait=False)
    out["submit_accepted_s"] = round(time.monotonic() - t0, 3)
    jobs.update({j.id: j for j in batch})
    pending = await eventually(
        lambda: _pending_activity(fc, "forge.write_jobs"),
        lambda p: True,
        timeout=10,
        what="the job write stuck on the store",
    )
    out["write_stuck"] = pending
    # accepted now, completes after the pass that plans it (after the outage)
    scale = await fc.handle().start_update(
        c.UPDATE_SCALE,
        c.ScaleGroup(job_id="late0", group="main", count=8),
        wait_for_stage=WorkflowUpdateStage.ACCEPTED,
        result_type=c.JobResult,
    )
    jobs["late0"] = jobs["late0"].with_desired("main", 8)
    await fc.node_lost(victim)
    out["node_lost"] = victim
    summary = await fc.summary()  # the loop is alive and published, store or not
    out["bound_during_outage"] = summary.bound
    assert (await fc.handle().describe()).status == WorkflowExecutionStatus.RUNNING
    assert await still_down(), "the outage ended before the test's traffic was done"
    if readable:
        assert await asyncio.to_thread(store.fence, fc.cluster) == fence_before, "written?"
    out["scale_update"] = scale
    return out


async def _setup(fc: ForgeClient, store: Store) -> dict[str, Job]:
    await fc.register_nodes([node(f"n{i}", cpu=8000, memory=16384) for i in range(6)])
    jobs = {j.id: j for j in (job("web", replicas=12, cpu=500), job("api", replicas=6, cpu=1000))}
    await fc.submit_jobs(list(jobs.values()), wait=True)
    await settle(fc, store, jobs, what="initial convergence")
    return jobs


async def test_sqlite_file_locked_for_seconds(
    dev_env: WorkflowEnvironment, spawn_worker: Any, tmp_path: Path
) -> None:
    db = tmp_path / "forge.db"
    spawn_worker(f"sqlite:///{db}")
    fc = _client(dev_env, spawn_worker.task_queue, "sqlite-locked")
    store = open_store(f"sqlite:///{db}")
    fc.store = store  # reads go to the store, never a query
    try:
        jobs = await _setup(fc, store)
        victim = _holder(store, fc.cluster)
        locker = sqlite3.connect(db, isolation_level=None, timeout=5)
        locker.execute("BEGIN EXCLUSIVE")
        locked_at = time.monotonic()
        try:
            blocked = await asyncio.to_thread(_write_blocked, db)
            assert blocked, "another connection could still write: the lock is not held"

            async def locked() -> bool:
                return locker.in_transaction

            during = await _outage(fc, store, jobs, still_down=locked, readable=True, victim=victim)
            # Keep the fault for its planned length (a fault's duration, not a wait for
            # state), then check the writer is still waiting, not failed or retried.
            await asyncio.sleep(max(0.0, OUTAGE - (time.monotonic() - locked_at)))
            stuck = await _pending_activity(fc, "forge.write_jobs")
            assert stuck["attempt"] == 1, f"the blocked write was retried: {stuck}"
            # blocked in SQLite's busy wait, yet alive: its side thread heartbeats
            assert stuck["state"] == "PENDING_ACTIVITY_STATE_STARTED", stuck
            age = stuck["heartbeat_age_s"]
            assert age is not None and age < 2.0, f"no recent heartbeat: {stuck}"
            during["write_blocked"] = stuck
        finally:
            locker.execute("COMMIT")
            released_at = time.monotonic()
            locked_for = released_at - locked_at
            locker.close()
        scaled = await asyncio.wait_for(during.pop("scale_update").result(), 60)
        assert scaled.desired == 8
        res = await settle(fc, store, jobs, timeout=60, what="convergence after the lock")
        converged_s = time.monotonic() - released_at
        lost = next(n for n in res.status.nodes if n.id == during["node_lost"])
        assert lost.state == "lost" and lost.replicas == 0
        hist = await history_figures(dev_env.client, fc.workflow_id)
        assert hist.get("workflow_task_failed", 0) == 0, hist
        # waited on the lock, kept alive by heartbeats: no attempt timed out
        assert hist.get("activity_retries.write_jobs", 0) == 0, hist
        assert hist.get("activity_retries.persist", 0) == 0, hist
        assert await store_violations(store, fc.cluster) == []
        record_figures(
            "store_outage_sqlite_lock",
            {
                "locked_s": round(locked_for, 2),
                "converged_after_release_s": round(converged_s, 2),
                "settle_s": round(res.seconds, 2),
                "bound_at_end": res.bound,
                "lost": 0,
                **during,
                **hist,
            },
        )
    finally:
        store.close()
        with contextlib.suppress(Exception):
            await fc.handle().terminate("fault test finished")


async def test_a_reschedule_that_falls_due_during_a_slow_persist_still_fires(
    dev_env: WorkflowEnvironment, spawn_worker: Any, tmp_path: Path
) -> None:
    """A failed replica waits out its reschedule delay on a timer. When the pass that
    set the delay takes longer than the delay to persist (a locked or slow store, a
    worker killed mid-persist), the deadline is already past when the loop picks
    its next wake-up: it must run a pass at once, not sleep until the next resync."""
    db = tmp_path / "forge.db"
    spawn_worker(f"sqlite:///{db}")
    fc = _client(dev_env, spawn_worker.task_queue, "slow-persist")
    store = open_store(f"sqlite:///{db}")
    fc.store = store  # reads go to the store, never a query
    delay = 1.0
    try:
        await fc.register_nodes([node("a"), node("b")])
        flaky = job("flaky", replicas=2, reschedule={"delay": delay, "unlimited": True})
        jobs = {flaky.id: flaky}
        await fc.submit_job(flaky, wait=True)
        await settle(fc, store, jobs, what="initial convergence")
        locker = sqlite3.connect(db, isolation_level=None, timeout=5)
        locker.execute("BEGIN EXCLUSIVE")
        try:
            report = asyncio.create_task(fc.report_failed(["flaky/main/0"]))
            await eventually(
                lambda: _pending_activity(fc, "forge.persist"),
                lambda p: True,
                timeout=10,
                what="the pass that reschedules stuck in its persist",
            )
            await asyncio.sleep(3 * delay)  # the store stays slow past the deadline
        finally:
            locker.execute("COMMIT")
            locker.close()
        released = time.monotonic()
        assert await asyncio.wait_for(report, 30) == 1
        res = await settle(fc, store, jobs, timeout=15, what="the rescheduled replica placed")
        record_figures(
            "reschedule_due_during_slow_persist",
            {"delay_s": delay, "placed_after_release_s": round(time.monotonic() - released, 2),
             "bound_at_end": res.bound},
        )  # fmt: skip
    finally:
        store.close()
        with contextlib.suppress(Exception):
            await fc.handle().terminate("fault test finished")


def _write_blocked(db: Path) -> bool:
    """True if a second connection cannot take the write lock right now."""
    probe = sqlite3.connect(db, isolation_level=None, timeout=0.2)
    try:
        probe.execute("BEGIN IMMEDIATE")
        probe.execute("ROLLBACK")
        return False
    except sqlite3.OperationalError as err:
        return "locked" in str(err) or "busy" in str(err)
    finally:
        probe.close()


# -- PostgreSQL ----------------------------------------------------------------------


def _pg_cluster() -> tuple[str, str]:
    if shutil.which("pg_ctlcluster") is None or not os.path.isdir("/etc/postgresql"):
        if os.environ.get("FORGE_SKIP_POSTGRES") == "1":
            pytest.skip("pg_ctlcluster unavailable and FORGE_SKIP_POSTGRES=1")
        pytest.fail(
            "this test stops and starts the local PostgreSQL with pg_ctlcluster, which is "
            "not installed here (set FORGE_SKIP_POSTGRES=1 to skip it deliberately)",
            pytrace=False,
        )
    version = sorted(os.listdir("/etc/postgresql"))[-1]
    return version, "main"


def _pg_ctl(action: str) -> None:
    version, name = _pg_cluster()
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", version, name, action],
        check=True,
        timeout=120,
        capture_output=True,
    )


def _pg_accepts() -> bool:
    try:
        psycopg.connect(PG_BASE, autocommit=True, connect_timeout=2).close()
        return True
    except psycopg.OperationalError:
        return False


async def _pg_up(timeout: float = 60.0) -> float:
    """Start the server if it is down; wait until it accepts connections."""
    started = time.monotonic()
    if not await asyncio.to_thread(_pg_accepts):
        await asyncio.to_thread(_pg_ctl, "start")

    async def probe() -> bool:
        return await asyncio.to_thread(_pg_accepts)

    await eventually(probe, bool, timeout=timeout, what="PostgreSQL accepting connections")
    return time.monotonic() - started


@pytest.mark.postgres
async def test_postgres_stopped_then_started(
    dev_env: WorkflowEnvironment, spawn_worker: Any, pg_url: str
) -> None:
    _pg_cluster()
    spawn_worker(pg_url)
    fc = _client(dev_env, spawn_worker.task_queue, "pg-outage")
    store = open_store(pg_url)
    fc.store = store  # reads go to the store, never a query
    counters: Counter[str] = Counter()
    try:
        jobs = await _setup(fc, store)
        victim = _holder(store, fc.cluster)
        await asyncio.to_thread(_pg_ctl, "stop")
        stopped_at = time.monotonic()
        try:
            assert not await asyncio.to_thread(_pg_accepts), "the server is still up"

            async def down() -> bool:
                return not await asyncio.to_thread(_pg_accepts)

            during = await _outage(fc, store, jobs, still_down=down, readable=False, victim=victim)
            await asyncio.sleep(max(0.0, OUTAGE - (time.monotonic() - stopped_at)))
            failing = await _pending_activity(fc, "forge.write_jobs")
            assert failing["attempt"] > 1, f"the write should fail and retry: {failing}"
            during["write_failing"] = failing
        finally:
            restart_s = await _pg_up()
            up_at = time.monotonic()
            down_for = up_at - stopped_at
        scaled = await asyncio.wait_for(during.pop("scale_update").result(), 60)
        assert scaled.desired == 8
        res = await settle(fc, store, jobs, timeout=60, what="convergence after the restart")
        converged_s = time.monotonic() - up_at
        lost = next(n for n in res.status.nodes if n.id == during["node_lost"])
        assert lost.state == "lost" and lost.replicas == 0
        hist = await history_figures(dev_env.client, fc.workflow_id)
        assert hist.get("workflow_task_failed", 0) == 0, hist
        assert hist.get("activity_retries", 0) > 0, hist
        assert await store_violations(store, fc.cluster) == []
        record_figures(
            "store_outage_postgres_restart",
            {
                "down_s": round(down_for, 2),
                "server_start_s": round(restart_s, 2),
                "converged_after_restart_s": round(converged_s, 2),
                "settle_s": round(res.seconds, 2),
                "bound_at_end": res.bound,
                "lost": 0,
                **during,
                **counters,
                **hist,
            },
        )
    finally:
        await _pg_up()  # other tests need it, whatever happened here
        store.close()
        with contextlib.suppress(Exception):
            await fc.handle().terminate("fault test finished")
