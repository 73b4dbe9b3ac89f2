"""The takeover that broke Forge's first promise (issue 35), made deterministic.

Worker A holds the cluster workflow in its cache and is killed with ``kill -9`` while
the loop sleeps on a backoff timer. At once the run is queried, as opening it in the
Web UI does (``__temporal_workflow_metadata``) and as an operator's ``temporal
workflow query --type status`` does, while no workflow task is pending: the server
hands the query to worker B, which never saw the run, as a legacy query task, and
Core runs the trailing events (the timer firing) through the workflow code as a live
activation with the previous task's clock (../shared/research/temporal-query-takeover/).
Then a user's ``forge job scale`` arrives, in a second activation of the next task.

Before intakes (workflows.patches.PASS_INTAKE) a replay ran both as one activation,
planned a pass with the scale the live run had planned without, and failed: the
persist digest disagreed, the watchdog reset the run, and the scale was lost. Now
each pass takes what its recorded intake saw, so: the scale lands in the store, no
workflow task fails on the worker that replays the run next (C, after B is killed
too), nothing is reset, and every run's history replays offline; the one exception,
as in test_kill_random, is a run showing the exact shape of the open Core defect of a
local activity's result taken a task late (checks.la_late), counted and printed (seen
once in three clean-clone runs, 2026-12-07; every scale still landed).
"""

from __future__ import annotations

import asyncio
import functools
import gzip
import time
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowHandle, WorkflowHistory
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer

from forge.client.client import ForgeClient
from forge.stores import SqliteStore
from forge.wire import contract as c
from forge.wire.codec import data_converter
from tests.e2e.procs import WorkerProc
from tests.faults.checks import every_run, retrying, settle
from tests.workflow.harness import job, node
from workflows import patches
from workflows.cluster import ClusterWorkflow

pytestmark = pytest.mark.slow

ROUNDS = 3
#: The loop reloads the jobs this often: a timer the loop sleeps on, firing soon.
RESYNC = 1.0


async def _running(w: WorkerProc, timeout: float = 30.0) -> WorkerProc:
    """Wait until the worker process logged that it polls (its log, not a sleep)."""
    deadline = time.monotonic() + timeout
    while '"worker running"' not in await asyncio.to_thread(w.log_path.read_text, "utf-8"):
        assert w.proc.poll() is None, f"worker exited:\n{w.output()}"
        assert time.monotonic() < deadline, f"worker not running:\n{w.output()}"
        await asyncio.sleep(0.05)
    return w


async def _read(handle: WorkflowHandle[Any, Any], query: str) -> int:
    """Query until answered; how many times the server refused it first.

    While a workflow task is outstanding (the killed worker's, until it times out) the
    server buffers a query for the next task and holds one at most by default
    (``history.MaxBufferedQueryCount``): a second query at that moment is refused with
    RESOURCE_EXHAUSTED "consistent query buffer is full", the server's back-pressure,
    which the Web UI meets as a failed panel and a user as a refresh. Only that refusal
    is retried; anything else fails the test."""
    refused = 0
    while True:
        try:
            await handle.query(query)
            return refused
        except RPCError as err:
            full = "consistent query buffer is full" in str(err)
            if err.status != RPCStatusCode.RESOURCE_EXHAUSTED or not full or refused > 50:
                raise
            refused += 1
            await asyncio.sleep(0.2)


async def test_a_scale_sent_around_a_queried_takeover_lands_and_replays(
    dev_env: WorkflowEnvironment, spawn_worker: Any, tmp_path: Path
) -> None:
    db = tmp_path / "forge.db"
    store = SqliteStore(db)
    fc = ForgeClient(
        dev_env.client,
        cluster="takeover",
        task_queue=spawn_worker.task_queue,
        options=c.ClusterOptions(resync_seconds=RESYNC),
        search_attributes=False,
        store=store,
    )
    url = f"sqlite:///{db}"
    current = await _running(spawn_worker(url))
    await fc.start()
    await fc.register_nodes([node("n1", cpu=8000, memory=16384)])
    web = job("web", replicas=1, cpu=500, memory=256)
    await fc.submit_job(web, wait=True)
    # the reads on a connection of their own, as the Web UI's: the suite's shared
    # client is as old as the suite, the server recycles old connections, and a query
    # held across the takeover was once cancelled with one ("connection closed")
    reader = await Client.connect(
        dev_env.client.service_client.config.target_host, data_converter=data_converter()
    )
    handle = reader.get_workflow_handle(fc.workflow_id)
    jobs = {"web": web}
    for round_ in range(1, ROUNDS + 1):
        nxt = await _running(spawn_worker(url))
        current.kill9()  # the loop sleeps on its resync timer
        reads = [
            asyncio.create_task(_read(handle, "__temporal_workflow_metadata")),
            asyncio.create_task(_read(handle, c.QUERY_STATUS)),
        ]
        await asyncio.sleep(RESYNC + 1.0)  # the timer fires meanwhile
        jobs["web"] = jobs["web"].with_desired("main", round_ + 1)
        want = round_ + 1
        result = await retrying(functools.partial(fc.scale, "web", "main", want), timeout=60)
        assert result.desired == want
        for read in reads:  # answered (by the worker that took over)
            await asyncio.wait_for(read, 60)
        await settle(fc, store, jobs, timeout=60)
        stored = {j.id: j.groups[0].scaling.desired for j in store.list_jobs(fc.cluster)}
        assert stored["web"] == round_ + 1, f"round {round_}: the scale was lost: {stored}"
        current = nxt
    # one more takeover: a cold worker replays everything the rounds recorded
    last = await _running(spawn_worker(url))
    current.kill9()
    await retrying(lambda: fc.scale("web", "main", 1), timeout=60)
    jobs["web"] = jobs["web"].with_desired("main", 1)
    await settle(fc, store, jobs, timeout=60)
    last.stop()
    runs = await every_run(dev_env.client, fc.workflow_id, tmp_path / "histories")
    # As test_kill_random: the one open Core defect of a local activity's result taken
    # a task late (RELIABILITY.md; test_local_activity_late.py), recognised only by its
    # exact shape in history (checks.la_late), is counted and shown, not failed on (every
    # scale above still had to land). Any other failure fails the test.
    late = [r.run_id for r in runs if r.la_late]
    if late:
        print(f"known upstream defect (local activity taken late) in runs {late}")
    assert [r.failures for r in runs if not r.la_late] == [[] for r in runs if not r.la_late], runs
    assert [r.replays_offline for r in runs] == [None for _ in runs], runs
    assert len(runs) == 1, "a reset or continue-as-new: the watchdog must not have acted"


#: The held-out run of issue 35 (1,000 nodes / 10,000 jobs, three kill -9 takeovers
#: with status queries and a scale after each), recorded before intakes.
HELD_OUT = Path(__file__).parent / "histories" / "takeover-divergence-1k.json.gz"


async def test_the_held_out_history_is_the_defect_this_file_reproduces() -> None:
    """Its replay fails exactly as its second takeover's worker did: at the persist
    of the pass after the first takeover's scale (pass 10, events 185-204: the timer
    fired, the task timed out, the next task brought the update). Its live run split
    that task in two activations (a query's trailing events, then the update), which
    history does not record, so no code can replay it to the same plan: what fixes it
    is recording each pass's intake, which the test above shows on the same shape."""
    history = WorkflowHistory.from_json(
        "forge-cluster-default", gzip.decompress(HELD_OUT.read_bytes()).decode()
    )
    replayer = Replayer(workflows=[ClusterWorkflow], data_converter=data_converter())
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is not None
    assert "pass 10: store applied digest 8f395a47c4607da1232d4624d66a5a6a" in str(
        result.replay_failure
    )
    markers = {
        ev.marker_recorded_event_attributes.details["patch-data"].payloads[0].data
        for ev in history.events
        if ev.marker_recorded_event_attributes.marker_name == "core_patch"
    }
    assert not any(patches.PASS_INTAKE.encode() in m for m in markers), "recorded before it"
