"""What every fault test checks after a fault, and the figures it records.

After a fault the cluster must converge, and then:

- every invariant holds over the store (``forge.core.invariants.violations``: no node
  over capacity, no GPU held twice, no replica bound twice, nothing on a lost or
  draining node, bound ⊆ desired);
- the store equals the workflow's state (the bindings hash the loop published vs
  the store's rows; never a query);
- nothing submitted is lost: every job the test submitted (with its latest
  scaling) is in the store and in the workflow, and all its replicas are bound.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import EventType, TimeoutType, WorkflowTaskFailedCause
from temporalio.api.history.v1 import HistoryEvent
from temporalio.api.workflowservice.v1 import ResetWorkflowExecutionRequest
from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.service import RPCError

from forge.client.client import ForgeClient
from forge.core.invariants import violations
from forge.core.models import Assignment, Job, Node, workload_id
from forge.stores import Store
from forge.wire import activity_contract as ac
from forge.wire import contract as c
from tests.e2e.procs import assert_store_is_the_workflows, eventually

__all__ = [
    "RunReport",
    "Settled",
    "all_assignments",
    "all_nodes",
    "desired_ids",
    "every_run",
    "history_figures",
    "record_figures",
    "reset_run",
    "retrying",
    "save_histories",
    "server_refusal",
    "settle",
    "store_violations",
    "stuck_on_nondeterminism",
]

T = TypeVar("T")

#: Client errors a fault may cause on the way to the server (the server or the
#: workflow's worker is away); the call is retried. Every call the tests retry is
#: idempotent (submit the same spec, scale to the same count, signal a node).
TRANSIENT = (RPCError, WorkflowUpdateRPCTimeoutOrCancelledError)

#: Workflow task failures that are part of normal operation: the server refused a
#: completion (e.g. a continue-as-new) because new events arrived meanwhile, and
#: the worker retries with them; a reset ends the old run's task. Any other failure
#: counts as ``workflow_task_failed``.
BENIGN_TASK_FAILURES = ("unhandled_command", "reset_workflow")

#: The marker of a nondeterminism error in a workflow task failure.
NDE = "[TMPRL1100]"


#: Update failures that are not the caller's fault (``ForgeClient`` reports them as
#: bad input): "UnprocessedUpdate", the worker that took the update's workflow task
#: never answered it (nothing entered history); "AcceptedUpdateCompletedWorkflow",
#: the run ended (a reset) before the accepted update completed. Retrying the
#: tests' idempotent calls is safe after either.
SERVER_REFUSALS = ("UnprocessedUpdate", "AcceptedUpdateCompletedWorkflow")


def server_refusal(err: BaseException) -> str | None:
    """Which of ``SERVER_REFUSALS`` caused ``err``, if any."""
    cause: BaseException | None = err
    while cause is not None:
        text = f"{getattr(cause, 'type', '')} {cause}"
        for kind in SERVER_REFUSALS:
            if kind in text:
                return kind
        cause = cause.__cause__ or getattr(cause, "cause", None)
    return None


def all_assignments(store: Store, cluster: str) -> list[Assignment]:
    return store.assignments(cluster, limit=1_000_000)


def all_nodes(store: Store, cluster: str) -> list[Node]:
    return store.nodes(cluster, limit=1_000_000)


def desired_ids(jobs: Mapping[str, Job]) -> set[str]:
    return {
        workload_id(j.id, g.name, i)
        for j in jobs.values()
        for g in j.groups
        for i in range(g.scaling.desired)
    }


async def store_violations(store: Store, cluster: str) -> list[str]:
    """Invariants 1-3 over what the store holds right now, mid-flight (a lost
    node may still hold replicas until the next pass, so not invariant 5)."""

    def read() -> list[str]:
        nodes, stored = snapshot(store, cluster)
        out = violations(nodes, stored, settled=False)
        ids = [a.workload_id for a in stored]
        if len(ids) != len(set(ids)):
            out.append("the store lists a replica twice")
        return out

    return await asyncio.to_thread(read)


def snapshot(store: Store, cluster: str) -> tuple[list[Node], list[Assignment]]:
    """Nodes and assignments as one persist left them. The two reads are separate
    queries, and a persist between them (a replica moved off a node removed in the
    same pass) would pair the old binding with the new node list: a violation the
    store never held. Every persist moves the fence, so a read the fence did not
    move across is consistent."""
    while True:
        before = store.fence(cluster)
        stored = all_assignments(store, cluster)
        nodes = all_nodes(store, cluster)
        if store.fence(cluster) == before:
            return nodes, stored


@dataclass
class Settled:
    seconds: float  # from the call until the cluster had converged
    bound: int
    status: c.StatusView


async def settle(
    fc: ForgeClient,
    store: Store,
    jobs: Mapping[str, Job],
    *,
    timeout: float = 90.0,
    what: str = "convergence",
) -> Settled:
    """Wait until the cluster has converged on ``jobs``, then check everything
    (see the module docstring). Fails with the reason if anything is off."""
    want = desired_ids(jobs)
    started = time.monotonic()
    deadline = started + timeout

    def converged(s: c.StatusView) -> bool:
        return (
            s.summary.jobs == len(jobs)
            and s.summary.desired == len(want)
            and s.summary.bound == len(want)
            and s.summary.pending == 0
        )

    while True:
        status = await eventually(
            fc.status, converged, timeout=max(deadline - time.monotonic(), 1.0), what=what
        )
        seconds = time.monotonic() - started
        # what the store holds, as one persist left it: a pass that ran after the
        # status above (a late failure report moving replicas) is not a fault, so
        # wait again if the snapshot is no longer converged
        nodes, assignments = await asyncio.to_thread(snapshot, store, fc.cluster)
        if {a.workload_id for a in assignments} == want or time.monotonic() > deadline:
            break

    # the store equals the workflow's state: the bindings hash the last pass
    # published (from the workflow's own state) matches the rows (no query: a query
    # during a takeover can wedge replay)
    await asyncio.to_thread(assert_store_is_the_workflows, store, fc.cluster)
    shown = {a.workload_id for a in assignments}  # the converged snapshot
    assert set(shown) == want, (
        f"bound != desired: missing {sorted(want - set(shown))[:5]}, "
        f"extra {sorted(set(shown) - want)[:5]}"
    )

    # invariants over the store, settled: bound ⊆ desired, nothing on lost nodes
    assert violations(nodes, assignments, desired=want, settled=True) == []

    # nothing submitted is lost: the store holds every job at its latest scaling
    stored_jobs = {j.id: j for j in await asyncio.to_thread(store.list_jobs, fc.cluster)}
    assert set(stored_jobs) == set(jobs), (
        f"jobs lost: {sorted(set(jobs) - set(stored_jobs))}, "
        f"unexpected: {sorted(set(stored_jobs) - set(jobs))}"
    )
    for jid, job in jobs.items():
        got = {g.name: g.scaling.desired for g in stored_jobs[jid].groups}
        assert got == {g.name: g.scaling.desired for g in job.groups}, f"{jid}: {got}"

    desc = await fc.handle().describe()
    assert desc.status == WorkflowExecutionStatus.RUNNING, desc.status
    return Settled(seconds=seconds, bound=len(want), status=status)


async def retrying(
    call: Callable[[], Awaitable[T]],
    *,
    counters: Counter[str] | None = None,
    timeout: float = 120.0,
) -> T:
    """Run ``call``, retrying transient client errors (see ``TRANSIENT``) until
    ``timeout``. The pause between tries is a backoff, not synchronisation."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await call()
        except Exception as err:
            refusal = server_refusal(err)
            # ForgeClient raises Forge's kinds, caused by the SDK's errors
            transient = isinstance(err, TRANSIENT) or isinstance(err.__cause__, TRANSIENT)
            if not (refusal or transient):
                raise
            if time.monotonic() >= deadline:
                raise
            if counters is not None:
                counters["client_retries"] += 1
                if refusal:
                    counters[f"update_failed.{refusal}"] += 1
            await asyncio.sleep(0.25)


async def stuck_on_nondeterminism(client: Client, workflow_id: str) -> dict[str, Any] | None:
    """If the workflow's current run is stuck on a workflow task that fails with a
    nondeterminism error, return ``{"run_id", "message", "reset_to"}``: the failure
    and the event id to reset to, the run's first workflow task completion. (The
    task that recorded what replay disagrees with may lie far before the one that
    fails, and the error does not always say which; re-executing the whole run is
    safe because the store, not the history, holds the state.) None if not stuck."""
    desc = await client.get_workflow_handle(workflow_id).describe()
    pending = desc.raw_description.pending_workflow_task
    if desc.status != WorkflowExecutionStatus.RUNNING or pending.attempt < 2:
        return None
    failed: Any = None
    completed: list[int] = []
    handle = client.get_workflow_handle(workflow_id, run_id=desc.run_id)
    async for ev in handle.fetch_history_events():
        if ev.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
            failed = ev
        elif ev.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            completed.append(ev.event_id)
            failed = None
    if failed is None:
        return None
    message = failed.workflow_task_failed_event_attributes.failure.message
    if NDE not in message or not completed:
        return None
    return {"run_id": desc.run_id, "message": message, "reset_to": completed[0]}


async def reset_run(client: Client, workflow_id: str, run_id: str, event_id: int) -> str:
    """``temporal workflow reset``: a new run re-executes from the workflow task that
    completed at ``event_id`` (signals and updates after it are reapplied)."""
    resp = await client.workflow_service.reset_workflow_execution(
        ResetWorkflowExecutionRequest(
            namespace=client.namespace,
            workflow_execution=WorkflowExecution(workflow_id=workflow_id, run_id=run_id),
            reason="fault test: recover from a nondeterminism error",
            workflow_task_finish_event_id=event_id,
            request_id=str(uuid.uuid4()),
        )
    )
    return str(resp.run_id)


async def history_figures(client: Client, workflow_id: str) -> dict[str, Any]:
    """Figures from the workflow's histories (every run of the continue-as-new
    chain): passes persisted, bindings persisted, activity retries, workflow
    tasks timed out (a worker killed holding one) or failed (a bug).

    ``stalled_tasks`` details each workflow task that timed out after it was
    started: who started it (``pid@host``), when it was scheduled and started."""
    figures: Counter[str] = Counter()
    stalled: list[dict[str, Any]] = []
    run_id: str | None = (await client.get_workflow_handle(workflow_id).describe()).run_id
    while run_id:
        figures["runs"] += 1
        previous: str | None = None
        scheduled: dict[int, str] = {}
        wft: dict[int, Any] = {}  # workflow task event id -> its event
        handle = client.get_workflow_handle(workflow_id, run_id=run_id)
        async for ev in handle.fetch_history_events():
            t = ev.event_type
            if t == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
                attrs = ev.workflow_execution_started_event_attributes
                previous = attrs.continued_execution_run_id or None
            elif t == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                sa = ev.activity_task_scheduled_event_attributes
                name = sa.activity_type.name
                scheduled[ev.event_id] = name
                if name == ac.ACT_PERSIST:
                    (persist,) = await client.data_converter.decode(
                        sa.input.payloads, [ac.PersistIn]
                    )
                    figures["passes_persisted"] += 1
                    figures["bindings_persisted"] += len(persist.bind)
                    figures["releases_persisted"] += len(persist.release)
            elif t == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
                st = ev.activity_task_started_event_attributes
                if st.attempt > 1:
                    name = scheduled.get(st.scheduled_event_id, "?").removeprefix("forge.")
                    figures[f"activity_retries.{name}"] += st.attempt - 1
                    figures["activity_retries"] += st.attempt - 1
            elif t in (
                EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED,
                EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED,
            ):
                wft[ev.event_id] = ev
            elif t == EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT:
                to = ev.workflow_task_timed_out_event_attributes
                if to.timeout_type == TimeoutType.TIMEOUT_TYPE_START_TO_CLOSE:
                    figures["workflow_task_timeouts.start_to_close"] += 1
                    started = wft.get(to.started_event_id)
                    sched = wft.get(to.scheduled_event_id)
                    if started is not None and sched is not None:
                        stalled.append(
                            {
                                "identity": started.workflow_task_started_event_attributes.identity,
                                "scheduled_at": _epoch(sched.event_time),
                                "started_at": _epoch(started.event_time),
                                "timed_out_at": _epoch(ev.event_time),
                            }
                        )
                else:
                    figures["workflow_task_timeouts.schedule_to_start"] += 1
            elif t == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
                cause = WorkflowTaskFailedCause.Name(ev.workflow_task_failed_event_attributes.cause)
                cause = cause.removeprefix("WORKFLOW_TASK_FAILED_CAUSE_").lower()
                figures[f"workflow_task_failed.{cause}"] += 1
                if cause not in BENIGN_TASK_FAILURES:
                    figures["workflow_task_failed"] += 1
        run_id = previous
    out: dict[str, Any] = dict(figures)
    if stalled:
        out["stalled_tasks"] = stalled
    return out


async def save_histories(client: Client, workflow_id: str, folder: Path) -> list[Path]:
    """Write every run's history as JSON (replay them with ``temporalio.worker.Replayer``
    to reproduce a nondeterminism or a bug offline); returns the files."""
    await asyncio.to_thread(folder.mkdir, parents=True, exist_ok=True)
    out: list[Path] = []
    run_id: str | None = (await client.get_workflow_handle(workflow_id).describe()).run_id
    while run_id:
        history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
        path = folder / f"{workflow_id}-{run_id}.json"
        await asyncio.to_thread(path.write_text, history.to_json())
        out.append(path)
        first = history.events[0].workflow_execution_started_event_attributes
        run_id = first.continued_execution_run_id or None
    return out


def _epoch(ts: Any) -> float:
    return float(ts.seconds) + ts.nanos / 1e9


def record_figures(test: str, figures: Mapping[str, Any]) -> None:
    """Print a test's figures (visible with ``-s``) and, when ``FORGE_FAULT_REPORT``
    names a file, merge them into it as JSON (one key per test)."""
    print(f"\n[fault figures] {test}: {json.dumps(figures, sort_keys=True)}")
    path = os.environ.get("FORGE_FAULT_REPORT")
    if not path:
        return
    target = Path(path)
    data: dict[str, Any] = {}
    if target.exists():
        try:
            data = json.loads(target.read_text())
        except json.JSONDecodeError:
            data = {}
    data[test] = dict(figures)
    target.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


@dataclass
class RunReport:
    """One run of a cluster workflow (every run: continued, reset or current)."""

    run_id: str
    failures: list[tuple[str, str]]  # (cause, message) of each workflow task failure
    replays_offline: str | None  # None: the history replays cleanly offline; else the error
    #: The events around where replay failed (ids, types, names, workers), so a
    #: failure seen only in a CI log can still be read: the history files do not
    #: outlive the machine.
    outline: str = ""
    #: The failure is the open Core defect of a local activity's result taken one
    #: task late (RELIABILITY.md; :func:`la_late`), recognised by its exact shape.
    la_late: bool = False


_LA_MARKER = "core_local_activity"
_PATCH_MARKER = "core_patch"


def la_late(events: Sequence[HistoryEvent], message: str) -> bool:
    """Whether ``message`` (a replay's nondeterminism error) is the open defect of
    ``tests/faults/test_local_activity_late.py``, by its shape in history: a task
    whose last command is a local activity's marker, the next task scheduled at
    once, and the failure at the first command of that next task, which is an
    update's acceptance ("Activity machine does not handle ...
    WorkflowExecutionUpdateAccepted") or a patch marker ("Non-deprecated patch
    marker encountered"): live, the loop took the result there; a replay takes it
    at the marker, a task earlier. Anything else is not recognised."""
    kinds = [EventType.Name(ev.event_type).removeprefix("EVENT_TYPE_") for ev in events]
    accepted = re.search(
        r"Activity machine does not handle this event: HistoryEvent\(id: (\d+), "
        r"WorkflowExecutionUpdateAccepted\)",
        message,
    )
    patch = "Non-deprecated patch marker encountered" in message
    if not (accepted or patch):
        return False
    for i in range(1, len(events) - 1):
        marker = events[i].marker_recorded_event_attributes.marker_name
        if not (marker == _LA_MARKER and kinds[i + 1] == "WORKFLOW_TASK_SCHEDULED"):
            continue
        done = next(
            (j for j in range(i + 1, len(events)) if kinds[j] == "WORKFLOW_TASK_COMPLETED"), None
        )
        if done is None or done + 1 >= len(events):
            continue
        first = events[done + 1]
        if accepted and first.event_id == int(accepted.group(1)):
            return kinds[done + 1] == "WORKFLOW_EXECUTION_UPDATE_ACCEPTED"
        if patch and first.marker_recorded_event_attributes.marker_name == _PATCH_MARKER:
            return True
    return False


def outline(events: Sequence[HistoryEvent], around: int, radius: int = 40) -> str:
    """One line per event within ``radius`` of event ``around``: id, time, type and
    what names it (timer, activity, marker, signal, update, worker identity)."""
    lines = []
    for ev in events:
        if abs(ev.event_id - around) > radius:
            continue
        kind = EventType.Name(ev.event_type).removeprefix("EVENT_TYPE_")
        which = ev.WhichOneof("attributes")
        attrs: Any = getattr(ev, which) if which else None
        name = ""
        for field in ("timer_id", "marker_name", "signal_name", "identity"):
            value = getattr(attrs, field, "")
            if value:
                name += f" {field}={value}"
        if hasattr(attrs, "activity_type"):
            name += f" activity={attrs.activity_type.name}"
        if hasattr(attrs, "accepted_request"):
            name += f" update={attrs.accepted_request.input.name}"
        lines.append(f"{ev.event_id} {ev.event_time.ToJsonString()[11:23]} {kind}{name}")
    return "\n".join(lines)


def _ended_by_watchdog_reset(events: Sequence[HistoryEvent]) -> bool:
    """Did a reset asked by the watchdog end this run (its reason is the watchdog's)?"""
    last = events[-1] if events else None
    return (
        last is not None
        and last.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED
        and last.workflow_execution_terminated_event_attributes.reason.startswith("forge watchdog:")
    )


async def every_run(client: Client, workflow_id: str, folder: Path) -> list[RunReport]:
    """Save every run of ``workflow_id`` (the reset ones too, which a walk along the
    continue-as-new chain misses) and replay each offline with the current code.

    A run that failed on nondeterminism *online* but replays cleanly *offline* had its
    commands changed by something outside its history: that is our bug (state kept
    outside the workflow, a clock, a worker-local condition), not the SDK's."""
    from temporalio.worker import Replayer

    from forge.wire.codec import data_converter
    from workflows.cluster import ClusterWorkflow

    await asyncio.to_thread(folder.mkdir, parents=True, exist_ok=True)
    replayer = Replayer(workflows=[ClusterWorkflow], data_converter=data_converter())
    out: list[RunReport] = []
    async for wf in client.list_workflows(f"WorkflowId = '{workflow_id}'"):
        handle = client.get_workflow_handle(workflow_id, run_id=wf.run_id)
        history = await handle.fetch_history()
        await asyncio.to_thread(
            (folder / f"{workflow_id}-{wf.run_id}.json").write_text, history.to_json()
        )
        failures = []
        for ev in history.events:
            if ev.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
                attrs = ev.workflow_task_failed_event_attributes
                cause = WorkflowTaskFailedCause.Name(attrs.cause)
                cause = cause.removeprefix("WORKFLOW_TASK_FAILED_CAUSE_").lower()
                if attrs.failure.application_failure_info.type == "DivergenceError":
                    cause = "divergence"  # the workflow's own determinism check
                if cause not in BENIGN_TASK_FAILURES:
                    failures.append((cause, attrs.failure.message[:300]))
        if _ended_by_watchdog_reset(history.events):
            # the reset terminates the old run and fails the task in flight there with
            # FORCE_CLOSE_COMMAND: the reset's mark (as reset_workflow), not a failure
            failures = [f for f in failures if f[0] != "force_close_command"]
        result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
        error = None if result.replay_failure is None else str(result.replay_failure)[:300]
        shown, late = "", False
        if error is not None or failures:
            message = str(result.replay_failure) if error is not None else failures[0][1]
            where = re.search(r"HistoryEvent\(id: (\d+)", message)
            shown = outline(history.events, int(where.group(1)) if where else 0)
            late = la_late(history.events, message) and all(
                la_late(history.events, m) for _, m in failures
            )
        out.append(
            RunReport(
                run_id=wf.run_id,
                failures=failures,
                replays_offline=error,
                outline=shown,
                la_late=late,
            )
        )
    return out
