"""Activities: the only code of the loop that touches the store.

Each is a synchronous method (the drivers are blocking) run by the worker's thread
pool. Bad data is a non-retryable ``ApplicationError``: retrying it cannot help
and would only hide the problem; a store that is briefly unavailable raises an
ordinary exception and the workflow's retry policy tries again.
"""

from __future__ import annotations

import contextvars
import functools
import threading
import time
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

from temporalio import activity
from temporalio.exceptions import ApplicationError, CancelledError

from activities.pages import compact_specs, json_len, row_len, within_bytes
from forge.errors import Conflict
from forge.stores import ApplyResult, Fence, StaleFenceError, Store, StoreError
from forge.wire import errors
from forge.wire.activity_contract import (
    ACT_FENCE,
    ACT_GROUP_SPEC,
    ACT_INTAKE,
    ACT_JOB_CHANGES,
    ACT_METRICS,
    ACT_PERSIST,
    ACT_READ_REPORTS,
    ACT_SNAPSHOT_ASSIGNMENTS,
    ACT_SNAPSHOT_COMPLETIONS,
    ACT_SNAPSHOT_NODES,
    ACT_WATCH,
    ACT_WRITE_JOBS,
    AssignmentRows,
    ClusterRef,
    CompletionsPage,
    GroupSpecIn,
    GroupSpecOut,
    Intake,
    JobChangesIn,
    JobsPage,
    MetricsIn,
    MetricsOut,
    NodesPage,
    PageIn,
    PersistIn,
    ReportsIn,
    ReportsOut,
    WatchIn,
    WatchOut,
    WriteJobsIn,
    WriteJobsOut,
    row_from_assignment,
    to_delta,
)

__all__ = ["HEARTBEAT_EVERY", "StoreActivities", "heartbeating"]

P = ParamSpec("P")
R = TypeVar("R")

#: How often a running store activity tells the server it is alive. The workflow's
#: heartbeat timeout is a few times this, so a killed worker's activity is retried
#: elsewhere within seconds instead of after its whole start-to-close timeout.
HEARTBEAT_EVERY = 0.5


def heartbeating(fn: Callable[P, R]) -> Callable[P, R]:
    """Heartbeat from a side thread while a blocking store call runs."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        if activity.in_activity() and activity.info().is_local:
            return fn(*args, **kwargs)  # a local activity has no heartbeat to send
        ctx = contextvars.copy_context()  # the activity context lives in a contextvar
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(HEARTBEAT_EVERY):
                ctx.run(activity.heartbeat)

        thread = threading.Thread(target=beat, name="forge-heartbeat", daemon=True)
        thread.start()
        try:
            return fn(*args, **kwargs)
        finally:
            stop.set()
            thread.join()

    return wrapper


class StoreActivities:
    """Binds the activities to one store (the worker opens it once)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        # One job write per cluster at a time in this worker: a local write that
        # timed out goes on in its thread (Python cannot stop it), and the ordinary
        # activity the workflow then runs with the same specs must not commit before
        # it, nor a later write of the same jobs (an older spec would win).
        self._writing: dict[str, threading.Lock] = {}

    def all(self) -> list[Callable[..., Any]]:
        return [
            self.fence,
            self.snapshot_nodes,
            self.snapshot_assignments,
            self.snapshot_completions,
            self.job_changes,
            self.write_jobs,
            self.persist,
            self.watch,
            self.read_reports,
            self.metrics,
            self.group_spec,
            self.intake,
        ]

    @activity.defn(name=ACT_INTAKE)
    async def intake(self, seen: Intake) -> Intake:
        """Hands back what the loop saw when it woke: run as a local activity, its
        result is recorded in history, and a replay takes it from there. Async: it
        never waits behind the store activities in the thread pool."""
        return seen

    @activity.defn(name=ACT_FENCE)
    @heartbeating
    def fence(self, ref: ClusterRef) -> list[int] | None:
        f = self.store.fence(ref.cluster)
        return None if f is None else [f.generation, f.pass_no]

    @activity.defn(name=ACT_SNAPSHOT_NODES)
    @heartbeating
    def snapshot_nodes(self, page: PageIn) -> NodesPage:
        nodes = self.store.nodes(page.cluster, page.after, page.limit)
        more = len(nodes) == page.limit
        keep = within_bytes(nodes, json_len)
        if keep < len(nodes):
            nodes, more = nodes[:keep], True
        return NodesPage(nodes=nodes, next_after=nodes[-1].id if more else None)

    @activity.defn(name=ACT_SNAPSHOT_ASSIGNMENTS)
    @heartbeating
    def snapshot_assignments(self, page: PageIn) -> AssignmentRows:
        found = self.store.assignment_rows(page.cluster, page.after, page.limit)
        more = len(found) == page.limit
        rows = [row_from_assignment(a) for a in found]
        keep = within_bytes(rows, row_len)
        if keep < len(rows):
            rows, more = rows[:keep], True
        return AssignmentRows(
            rows=rows, next_after=found[len(rows) - 1].workload_id if more else None
        )

    @activity.defn(name=ACT_SNAPSHOT_COMPLETIONS)
    @heartbeating
    def snapshot_completions(self, page: PageIn) -> CompletionsPage:
        done = self.store.completions(page.cluster, page.after, page.limit)
        more = len(done) == page.limit
        return CompletionsPage(done=done, next_after=done[-1] if more else None)

    @activity.defn(name=ACT_JOB_CHANGES)
    @heartbeating
    def job_changes(self, req: JobChangesIn) -> JobsPage:
        page = self.store.job_spec_changes(req.cluster, req.since, req.limit)
        out = compact_specs(page.rows, page.revision, page.more)
        if req.since == 0:  # a full load: a run started afresh gets the queues back
            return out.model_copy(update={"queues": self.store.queues(req.cluster) or None})
        return out

    @activity.defn(name=ACT_WRITE_JOBS)
    @heartbeating
    def write_jobs(self, req: WriteJobsIn) -> WriteJobsOut:
        lock = self._writing.setdefault(req.cluster, threading.Lock())  # (atomic)
        # The SDK cancels a timed-out local activity by raising in its thread: one
        # raised inside the store's transaction (after BEGIN, before its handler)
        # left the thread's SQLite connection holding the write lock for good. The
        # write finishes (or fails) first; a cancellation is raised after it.
        with activity.shield_thread_cancel_exception(), lock:
            return self._write_jobs(req)

    def _write_jobs(self, req: WriteJobsIn) -> WriteJobsOut:
        revision = self.store.put_jobs(req.cluster, req.put)
        missing = []
        for job_id in req.delete:
            rev = self.store.delete_job(req.cluster, job_id)
            if rev is None:
                missing.append(job_id)
            else:
                revision = max(revision, rev)
        return WriteJobsOut(revision=revision, missing=missing)

    @activity.defn(name=ACT_PERSIST)
    @heartbeating
    def persist(self, req: PersistIn) -> ApplyResult:
        try:
            delta = to_delta(req, validate=True)
        except ValueError as err:
            raise ApplicationError(f"invalid delta: {err}", non_retryable=True) from err
        started = time.perf_counter()
        try:
            result = self.store.apply_delta(req.cluster, Fence(req.generation, req.pass_no), delta)
            if req.plan_seconds is not None or req.work_seconds is not None:
                # into history: the next pass's budget, the run's replay time
                result = result.model_copy(
                    update={"plan_seconds": req.plan_seconds, "work_seconds": req.work_seconds}
                )
        except StaleFenceError as err:
            activity.metric_meter().create_counter(
                "forge_persist_refused", "persists refused by the fence"
            ).add(1)
            raise errors.encode(err) from err
        except StoreError as err:
            if self.store.fence(req.cluster) == Fence(req.generation, req.pass_no):
                # Another run applied this very fence with a different delta: a reset
                # run replays its predecessor's generation. As stale as an older
                # fence, so the workflow reloads and moves to a newer generation.
                raise errors.encode(err, Conflict) from err
            raise errors.encode(err) from err
        activity.metric_meter().create_histogram_float(
            "forge_persist_seconds", "time to apply one pass's delta to the store", "s"
        ).record(time.perf_counter() - started)
        return result

    @activity.defn(name=ACT_WATCH)
    def watch(self, req: WatchIn) -> WatchOut:
        """Long-poll the store like a Kubernetes watch: return as soon as jobs
        changed, a task report that changes a decision arrived (a replica started,
        failed, exited, changed its health verdict: the store numbers only those,
        ``forge.stores.base.next_state``) or a node's heartbeat expired, or after
        ``max_seconds``. Usage samples and heartbeats never end it: the metrics
        activity reads usage from the store when autoscaling is due. Polling
        happens here, outside history, so a steady cluster costs one activity per
        ``max_seconds`` instead of one per poll or per sample."""
        deadline = time.monotonic() + req.max_seconds
        while True:
            rev = self.store.revision(req.cluster)
            reports = self.store.reports_since(req.cluster, req.reports_seq, limit=1)
            expired = self.store.expired_nodes(req.cluster, time.time() - req.heartbeat_ttl)
            seq = reports[-1].seq if reports else req.reports_seq
            if rev != req.jobs_revision or reports or expired:
                reason = "jobs" if rev != req.jobs_revision else "reports" if reports else "expired"
                return WatchOut(jobs_revision=rev, reports_seq=seq, expired=expired, reason=reason)
            if time.monotonic() >= deadline:
                return WatchOut(jobs_revision=rev, reports_seq=seq, reason="timeout")
            activity.heartbeat()
            if activity.is_cancelled():
                raise CancelledError
            time.sleep(req.poll)

    @activity.defn(name=ACT_READ_REPORTS)
    @heartbeating
    def read_reports(self, req: ReportsIn) -> ReportsOut:
        reports = self.store.reports_since(req.cluster, req.seq, req.limit)
        reports = reports[: within_bytes(reports, json_len)]
        latest: dict[str, str] = {}
        nodes: dict[str, str] = {}
        health: dict[str, bool] = {}
        failures: dict[str, str] = {}
        codes: dict[str, int] = {}
        for r in reports:
            latest[r.workload_id] = r.status
            codes.pop(r.workload_id, None)
            if r.status == "failed":
                failures[r.workload_id] = r.message
                if r.exit_code is not None:
                    codes[r.workload_id] = r.exit_code
            else:
                failures.pop(r.workload_id, None)
            if r.healthy is not None:
                health[r.workload_id] = r.healthy
            elif r.status != "running":
                health.pop(r.workload_id, None)  # ended: its verdict is over
            if r.node:
                nodes[r.workload_id] = r.node
            else:
                nodes.pop(r.workload_id, None)
        last = reports[-1].seq if reports else req.seq
        return ReportsOut(
            statuses=sorted(latest.items()),
            last_seq=last,
            nodes=nodes,
            health=dict(sorted(health.items())),
            failures=dict(sorted(failures.items())),
            exit_codes=dict(sorted(codes.items())),
        )

    @activity.defn(name=ACT_METRICS)
    @heartbeating
    def metrics(self, req: MetricsIn) -> MetricsOut:
        usage = self.store.group_usage(req.cluster, time.time() - req.window)
        asked = [g for g in req.groups if g in usage]
        return MetricsOut(
            usage={g: (usage[g].cpu, usage[g].memory) for g in asked},
            gpu={g: gpu for g in asked if (gpu := usage[g].gpu) is not None},
        )

    @activity.defn(name=ACT_GROUP_SPEC)
    @heartbeating
    def group_spec(self, req: GroupSpecIn) -> GroupSpecOut:
        """The latest accepted spec of ``req.group`` at ``req.version``."""
        found = [
            v
            for v in self.store.group_versions(req.cluster, req.job_id)
            if v.group == req.group and v.version == req.version
        ]
        return GroupSpecOut(spec=found[-1].spec if found else None)
