"""ClusterWorkflow: one long-running workflow per cluster runs the reconcile loop.

Deterministic orchestration only: every decision comes from ``forge``'s pure
functions, every byte of I/O from an activity. A pass:

1. take what arrived: node signals (queued in arrival order), the watch
   activity's news (job revision moved, task reports, expired heartbeats);
2. load job changes since the last revision (paged), task reports (batched) and,
   for autoscaled groups that are due, metrics;
3. plan with :func:`forge.core.reconcile.reconcile`;
4. persist the plan's delta, fenced by (generation, pass), and check the digest
   the store returns against our own: a replay that planned differently from the
   original run (a determinism bug) stops here instead of diverging silently;
5. wait on a condition whose timeout is the earliest deadline (backoff expiry,
   autoscale tick, resync): no fixed ticker, so an idle cluster is quiet.

State is restored in ``@workflow.init``. The large parts (nodes, jobs, bindings)
live in the store, which every pass updates before a continue-as-new, so a new
run reloads them in pages and the continue-as-new payload stays small.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter
from collections.abc import Sequence
from datetime import timedelta
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.common import RawValue, RetryPolicy, SearchAttributeKey
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    import pydantic

    from forge.core.autoscale import AutoscaleState, GroupMetrics, decide, next_due
    from forge.core.models import (
        MAX_BATCH_BYTES,
        AssignmentStatus,
        Job,
        Node,
        NodeState,
        workload_id,
    )
    from forge.core.placement import Binding
    from forge.core.reconcile import (
        DEFAULT_MAX_WORK,
        Carry,
        FailureHistory,
        PendingEntry,
        Plan,
        reconcile,
    )
    from forge.stores.base import STATE_MOD, ApplyResult, JobPage, binding_hash, rows_digest
    from forge.wire import activity_contract as ac
    from forge.wire import contract as c
    from forge.wire import views

__all__ = ["ClusterWorkflow"]

STORE_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=200),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=10),
    maximum_attempts=0,  # the store coming back is the only way forward
    non_retryable_error_types=["StaleFence", "StoreError", "InvalidInput"],
)
STORE_TIMEOUT = timedelta(seconds=60)
# A worker killed mid-activity is noticed after this long (not after the whole
# start-to-close timeout), which is what bounds crash recovery.
STORE_HEARTBEAT = timedelta(seconds=2)

SA_CLUSTER = SearchAttributeKey.for_keyword(c.SA_CLUSTER)
SA_PENDING = SearchAttributeKey.for_int(c.SA_PENDING)
SA_BOUND = SearchAttributeKey.for_int(c.SA_BOUND)
SA_NODES = SearchAttributeKey.for_int(c.SA_NODES)

#: workflow.patched ids. A behaviour change to code a pass runs is guarded by one,
#: so a history recorded before it replays with the old behaviour.
PATCH_WORK_BUDGET = "work-budget-1"
#: Node JSON one pass persists at most (a burst of registrations between two passes
#: is spread over several persists, each far below Temporal's 2 MiB payload limit).
NODE_BYTES = 512 * 1024
#: Each pass that changes something publishes a status to the store (with its delta)
#: and a summary memo, for readers that must not query.
PATCH_PUBLISH = "publish-status-1"
#: A dropped signal (bad payload, unknown name) is counted and published by a pass.
PATCH_DROPPED_SIGNALS = "dropped-signals-1"
#: ApplicationError type of an update refused for its input (never retried).
INVALID_INPUT = "InvalidInput"

PENDING_SHOWN = views.PENDING_SHOWN  # pending replicas a status lists (the rest are counted)
#: ApplicationError type of an update refused while the run is due to continue as
#: new: nothing reached history, and the client retries it (forge.client.client matches it).
BUSY = "Busy"


class DivergenceError(RuntimeError):
    """The store applied a different delta than this code planned: the workflow
    code changed without ``workflow.patched``. Failing the workflow task (not the
    workflow) keeps the history intact until the code is fixed."""


@workflow.defn(name=c.WORKFLOW_TYPE)
class ClusterWorkflow:
    @workflow.init
    def __init__(self, inp: c.ClusterInput) -> None:
        cp = inp.checkpoint
        self.cluster = inp.cluster
        self.opts = inp.options
        self.runs = cp.runs + 1 if cp else 1
        self.generation = cp.generation + 1 if cp else 1
        self.pass_no = 0
        self.passes = 0
        self.nodes: dict[str, Node] = {}
        self.jobs: dict[str, Job] = {}
        self.jobs_revision = 0
        self.known_revision = 0
        self.job_queue: dict[str, Job | None] = {}
        # Taken off the queue and being written/loaded: handlers still see them.
        self.job_writing: dict[str, Job | None] = {}
        self.ticket = 0
        self.written_ticket = 0
        self.planned_ticket = 0
        self.bindings: dict[str, Binding] = {}
        self.pending: dict[str, PendingEntry] = dict(cp.pending) if cp else {}
        self.deferred = 0  # replicas a budgeted pass left for the next, not listed
        self.failures: dict[str, FailureHistory] = dict(cp.failures) if cp else {}
        self.autoscale: dict[str, AutoscaleState] = dict(cp.autoscale) if cp else {}
        self.autoscale_evaluated: dict[str, float] = dict(cp.autoscale_evaluated) if cp else {}
        self.reports_seq = cp.reports_seq if cp else 0
        self.known_reports_seq = self.reports_seq
        self.last_resync = cp.last_resync if cp else 0.0
        self.ready = False
        self.dirty = True
        self.capacity_changed = cp is None
        self.inbox: list[tuple[str, Any]] = []
        self.failed: dict[str, None] = {}
        self.watch: workflow.ActivityHandle[ac.WatchOut] | None = None
        self.last_pass = "not yet run"
        self.last_pass_at: float | None = None
        self.search_attrs: tuple[int, int, int] | None = None
        self._status_updates: dict[str, str] = {}
        # Replicas examined by this run's passes: a worker that takes the workflow
        # over replays every pass, so the run ends before replay gets slow.
        self.replay_cost = 0
        self.longest_plan = 0.0  # seconds; a metric only
        self.published = ""  # the last status published (without per-pass fields)
        self.signals_dropped = cp.signals_dropped if cp else 0
        self.last_dropped = cp.last_dropped if cp else ""
        self.state_sum = 0  # forge.stores.base.binding_hash summed over self.bindings
        # the last pass's allocations and indexes (forge.core.reconcile.Carry): the next
        # pass re-checks only what changed; None after a (re)load
        self.carry: Carry | None = None
        self.updates = 0  # accepted in this run
        self.queued_bytes = 0  # job JSON queued by handlers since the queue was empty

    # -- the loop -----------------------------------------------------------------------
    @workflow.run
    async def run(self, inp: c.ClusterInput) -> None:
        await self._bootstrap()
        self.ready = True
        while True:
            if self.dirty or self.inbox or self.job_queue or self._watch_done():
                await self._pass()
                continue
            if self._continue_as_new_now():
                await self._cancel_watch()
                if not (self.dirty or self.inbox):
                    workflow.continue_as_new(
                        c.ClusterInput(
                            cluster=self.cluster, options=self.opts, checkpoint=self._checkpoint()
                        )
                    )
            self._ensure_watch()
            now = workflow.now().timestamp()
            wake, why = self._next_wake(now)
            if wake is not None and wake <= now:
                self.dirty = True
                continue
            try:
                await workflow.wait_condition(
                    lambda: (
                        self.dirty
                        or bool(self.inbox)
                        or self._watch_done()
                        or self._continue_as_new_now()
                    ),
                    timeout=None if wake is None else wake - now,
                    timeout_summary=why,
                )
            except TimeoutError:
                self.dirty = True

    async def _bootstrap(self) -> None:
        """Load the persisted state: the fence, nodes, bindings and jobs (paged)."""
        fence = await self._act(
            ac.ACT_FENCE, ac.ClusterRef(cluster=self.cluster), list, summary="load fence"
        )
        stored_gen = fence[0] if fence else 0
        self.generation = max(self.generation, stored_gen + 1)
        self.pass_no = 0
        nodes: dict[str, Node] = {}
        after = ""
        while True:
            page: ac.NodesPage = await self._act(
                ac.ACT_SNAPSHOT_NODES,
                ac.PageIn(cluster=self.cluster, after=after, limit=self.opts.snapshot_page),
                ac.NodesPage,
                summary="load nodes",
            )
            for n in page.nodes:
                nodes[n.id] = n
            if page.next_after is None:
                break
            after = page.next_after
        carry: Carry | None = None
        if workflow.patched(PATCH_WORK_BUDGET):
            # jobs first, so that each page of bindings is checked and held as it
            # arrives: no activation of a new run walks every binding
            self.nodes = nodes
            self.jobs = {}
            self.jobs_revision = 0
            await self._load_jobs()
            carry = Carry.start(self.jobs, nodes)
        bindings: dict[str, Binding] = {}
        state_sum = 0  # summed page by page: no activation walks every binding
        after = ""
        while True:
            rows: ac.AssignmentRows = await self._act(
                ac.ACT_SNAPSHOT_ASSIGNMENTS,
                ac.PageIn(cluster=self.cluster, after=after, limit=self.opts.snapshot_page),
                ac.AssignmentRows,
                summary="load bindings",
            )
            for row in rows.rows:
                job, group, ordinal, node, gpu_ids, cpu, mem, status = row[:8]
                b = Binding(
                    job,
                    group,
                    ordinal,
                    node,
                    tuple(gpu_ids),
                    cpu,
                    mem,
                    AssignmentStatus(status),
                    gpu_milli=row[8] if len(row) > 8 else 0,
                )
                if carry is not None:
                    carry.absorb(workload_id(job, group, ordinal), b)
                else:
                    bindings[workload_id(job, group, ordinal)] = b
                state_sum += _hash(b)
            if rows.next_after is None:
                break
            after = rows.next_after
        self.nodes = nodes
        self.state_sum = state_sum % STATE_MOD
        self.carry = carry
        if carry is not None:
            self.bindings = carry.bindings
        else:  # before the patch: the first pass checks every binding
            self.bindings = bindings
            self.jobs = {}
            self.jobs_revision = 0
            await self._load_jobs()
        self.last_resync = workflow.now().timestamp()
        self._details()

    async def _pass(self) -> None:
        self.dirty = False
        now = workflow.now().timestamp()
        nodes_upsert: dict[str, Node] = {}
        nodes_remove: dict[str, None] = {}

        if self._watch_done():
            assert self.watch is not None
            try:
                news = self.watch.result()
            except ActivityError as err:  # it retries forever; only a cancel gets here
                workflow.logger.warning("store watch ended: %s", err)
                news = ac.WatchOut(jobs_revision=0, reports_seq=0)
            self.watch = None
            self.known_revision = max(self.known_revision, news.jobs_revision)
            self.known_reports_seq = max(self.known_reports_seq, news.reports_seq)
            for node_id in news.expired:
                self.inbox.append(("lost", node_id))

        # node changes, in arrival order; with the work budget, at most
        # NODE_BYTES of node JSON per pass (one persist input), the rest next pass
        inbox, self.inbox = self.inbox, []
        chunked = workflow.patched(PATCH_WORK_BUDGET)
        size = 0
        for k, (op, arg) in enumerate(inbox):
            if chunked and op == "register":
                size += len(arg.model_dump_json())
                if size > NODE_BYTES and k:
                    self.inbox = inbox[k:] + self.inbox
                    self.dirty = True
                    break
            self._apply_node_op(op, arg, nodes_upsert, nodes_remove)

        # jobs, reports, metrics
        if now - self.last_resync >= self.opts.resync_seconds:
            self.jobs_revision = 0  # a full reload (swapped in when complete)
            self.last_resync = now
        written = self.written_ticket
        if self.job_queue:
            await self._write_jobs()
            written = self.written_ticket
        if self.known_revision > self.jobs_revision or not self.jobs_revision:
            await self._load_jobs()
        self.job_writing = {}  # now in self.jobs
        if self.known_reports_seq > self.reports_seq:
            await self._load_reports()
        await self._autoscale(now)

        # plan
        failed = [w for w in self.failed if w in self.bindings]
        status_changed = [w for w, b in self._status_updates.items() if w in self.bindings]
        options = self.opts.reconcile
        bounded = workflow.patched(PATCH_WORK_BUDGET)
        if bounded and not options.max_work:
            # a pass plans at most this much and defers the rest to the next pass,
            # and re-checks only what changed (the carry), so no activation runs
            # near the SDK's 2 s deadlock limit, however big the cluster
            options = options.model_copy(update={"max_work": DEFAULT_MAX_WORK})
        with workflow.unsafe.sandbox_unrestricted():  # a metric only, never a decision
            started = time.perf_counter()
        plan = reconcile(
            jobs=self.jobs,
            nodes=self.nodes,
            bindings=self.bindings,
            pending=self.pending,
            failures=self.failures,
            failed=failed,
            capacity_changed=self.capacity_changed,
            now=now,
            options=options,
            carry=self.carry if bounded else None,
        )
        with workflow.unsafe.sandbox_unrestricted():
            elapsed = time.perf_counter() - started

        # persist what changed
        released = {w for w, _ in plan.released}
        binds = list(plan.placed)
        placed = {b.workload_id for b in plan.placed}
        binds.extend(
            plan.bindings[w]
            for w in status_changed
            if w in plan.bindings and w not in released and w not in placed
        )
        persist = ac.PersistIn(
            cluster=self.cluster,
            generation=self.generation,
            pass_no=self.pass_no + 1,
            bind=[_row(b) for b in binds],
            release=sorted(released),
            nodes_upsert=list(nodes_upsert.values()),
            nodes_remove=list(nodes_remove),
        )
        published: tuple[str, c.Summary] | None = None
        if workflow.patched(PATCH_PUBLISH):
            published = self._publication(plan, now)
            if published[0] != self.published:
                persist = persist.model_copy(update={"status": _status_json(published)})
        if (
            persist.bind
            or persist.release
            or persist.nodes_upsert
            or persist.nodes_remove
            or persist.status is not None
        ):
            self.pass_no += 1
            if not await self._persist(persist, plan):
                return  # state was reloaded from the store; plan again
            if persist.status is not None and published is not None:
                self.published = published[0]
                # the summary for describe() (no store needed); small, never compressed
                workflow.upsert_memo({c.MEMO_SUMMARY: published[1].model_dump(mode="json")})

        # commit
        self.state_sum = self._state_after(plan)
        self.bindings = plan.bindings
        self.carry = plan.carry if bounded else None
        self.pending = plan.pending
        self.deferred = plan.deferred
        self.failures = plan.failures
        self.failed = {}
        self._status_updates = {}
        self.capacity_changed = False
        self.planned_ticket = written
        self.passes += 1
        # what a worker taking the run over replays: the passes' work
        self.replay_cost += plan.work if bounded else plan.desired + len(plan.released)
        self.last_pass_at = now
        self.last_pass = _pass_text(self.passes, plan)
        if plan.deferred:
            self.dirty = True
        self._record(plan, elapsed)
        self._details()

    async def _persist(self, persist: ac.PersistIn, plan: Plan) -> bool:
        expected = rows_digest(
            persist.bind,
            persist.release,
            persist.nodes_upsert,
            persist.nodes_remove,
            status=persist.status,
        )
        summary = (
            f"persist pass {persist.pass_no}: +{len(plan.placed)} "
            f"-{len(plan.released)} nodes {len(persist.nodes_upsert) + len(persist.nodes_remove)}"
        )
        try:
            result: ApplyResult = await self._act(
                ac.ACT_PERSIST, persist, ApplyResult, summary=summary
            )
        except ActivityError as err:
            cause = err.cause
            if isinstance(cause, ApplicationError) and cause.type == "StaleFence":
                # Another run persisted a newer pass (a reset, a second starter):
                # our view is stale. Reload from the store and plan again.
                workflow.logger.warning("stale fence; reloading state from the store")
                await self._bootstrap()
                self.dirty = True
                return False
            raise
        if result.digest != expected:
            raise DivergenceError(
                f"pass {persist.pass_no}: store applied digest {result.digest}, this code "
                f"planned {expected}; workflow code changed without workflow.patched?"
            )
        return True

    # -- inputs -------------------------------------------------------------------------
    def _apply_node_op(
        self, op: str, arg: Any, upsert: dict[str, Node], remove: dict[str, None]
    ) -> None:
        if op == "register":
            node: Node = arg
            old = self.nodes.get(node.id)
            if old is not None and old == node:
                node = old  # the same object: the next pass has nothing to re-check here
            self.nodes[node.id] = node
            remove.pop(node.id, None)
            upsert[node.id] = node
            if old is None or old != node:
                self.capacity_changed = True
            return
        node_id: str = arg
        existing = self.nodes.get(node_id)
        if existing is None:
            workflow.logger.info("ignoring %s for unknown node %s", op, node_id)
            return
        if op == "remove":
            del self.nodes[node_id]
            upsert.pop(node_id, None)
            remove[node_id] = None
            return
        state = NodeState.LOST if op == "lost" else NodeState.DRAINING
        if existing.state is state or existing.state is NodeState.LOST:
            return
        changed = existing.model_copy(update={"state": state})
        self.nodes[node_id] = changed
        upsert[node_id] = changed

    async def _write_jobs(self) -> None:
        queue, self.job_queue = self.job_queue, {}
        self.job_writing = {**self.job_writing, **queue}
        ticket = self.ticket
        out: ac.WriteJobsOut = await self._act(
            ac.ACT_WRITE_JOBS,
            ac.WriteJobsIn(
                cluster=self.cluster,
                put=[j for j in queue.values() if j is not None],
                delete=[i for i, j in queue.items() if j is None],
            ),
            ac.WriteJobsOut,
            summary=f"store {len(queue)} job changes",
        )
        self.known_revision = max(self.known_revision, out.revision)
        self.written_ticket = ticket

    async def _load_jobs(self) -> None:
        # A full load (from revision 0) fills a fresh map and swaps it in at the
        # end, so the jobs never vanish from the handlers' view while pages arrive.
        jobs = self.jobs if self.jobs_revision else {}
        while True:
            page: JobPage = await self._act(
                ac.ACT_JOB_CHANGES,
                ac.JobChangesIn(
                    cluster=self.cluster, since=self.jobs_revision, limit=self.opts.job_page
                ),
                JobPage,
                summary=f"load jobs since revision {self.jobs_revision}",
            )
            for ch in page.changes:
                if ch.job is None:
                    jobs.pop(ch.job_id, None)
                else:
                    old = jobs.get(ch.job_id)
                    if old is not None and old != ch.job:
                        # a changed request may fit where the old one did not:
                        # backed-off replicas get another try now
                        self.capacity_changed = True
                    # an unchanged job keeps its object (a full reload too): a pass
                    # re-checks only the jobs whose object changed (reconcile.Carry)
                    same = old if old is not None else self.jobs.get(ch.job_id)
                    jobs[ch.job_id] = same if same is not None and same == ch.job else ch.job
            self.jobs_revision = max(self.jobs_revision, page.revision)
            if not page.more:
                break
        self.jobs = jobs
        self.known_revision = max(self.known_revision, self.jobs_revision)

    async def _load_reports(self) -> None:
        while self.known_reports_seq > self.reports_seq:
            out: ac.ReportsOut = await self._act(
                ac.ACT_READ_REPORTS,
                ac.ReportsIn(
                    cluster=self.cluster, seq=self.reports_seq, limit=self.opts.report_page
                ),
                ac.ReportsOut,
                summary=f"read task reports after {self.reports_seq}",
            )
            for wid, status in out.statuses:
                b = self.bindings.get(wid)
                if b is None or out.nodes.get(wid, b.node) != b.node:
                    continue  # not bound, or about a binding that has moved since
                if status in ("failed", "exited"):
                    self.failed[wid] = None
                elif status == "running" and b.status is AssignmentStatus.PENDING:
                    b.status = AssignmentStatus.RUNNING
                    self._status_updates = {**self._status_updates, wid: status}
            if out.last_seq <= self.reports_seq:
                break
            self.reports_seq = out.last_seq

    async def _autoscale(self, now: float) -> None:
        due: list[tuple[Job, str]] = []
        for job in sorted(self.jobs.values(), key=lambda j: j.id):
            for g in job.groups:
                if g.autoscale is None:
                    continue
                key = f"{job.id}/{g.name}"
                state = self.autoscale.get(key, AutoscaleState())
                if next_due(g.autoscale, state, self.autoscale_evaluated.get(key), now) <= now:
                    due.append((job, g.name))
        if not due:
            return
        out: ac.MetricsOut = await self._act(
            ac.ACT_METRICS,
            ac.MetricsIn(cluster=self.cluster, groups=[f"{j.id}/{g}" for j, g in due]),
            ac.MetricsOut,
            summary=f"metrics for {len(due)} groups",
        )
        for job, gname in due:
            key = f"{job.id}/{gname}"
            group = job.group(gname)
            assert group is not None and group.autoscale is not None
            usage = out.usage.get(key)
            metrics = GroupMetrics(cpu=usage[0], memory=usage[1]) if usage else None
            state = self.autoscale.get(key, AutoscaleState())
            d = decide(group.autoscale, group.scaling, metrics, state, now)
            self.autoscale[key] = d.state
            self.autoscale_evaluated[key] = now
            if d.changed:
                workflow.logger.info("autoscale %s: %s", key, d.reason)
                new_job = self.jobs[job.id].with_desired(gname, d.desired)
                self._queue_job(job.id, new_job)
                self.jobs[job.id] = new_job

    # -- watch --------------------------------------------------------------------------
    def _watch_done(self) -> bool:
        return self.watch is not None and self.watch.done()

    def _ensure_watch(self) -> None:
        if self.watch is not None or not self.opts.watch:
            return
        self.watch = workflow.start_activity(
            ac.ACT_WATCH,
            ac.WatchIn(
                cluster=self.cluster,
                jobs_revision=max(self.jobs_revision, self.known_revision),
                reports_seq=max(self.reports_seq, self.known_reports_seq),
                heartbeat_ttl=self.opts.heartbeat_ttl,
                max_seconds=self.opts.watch_seconds,
                poll=self.opts.watch_poll,
            ),
            result_type=ac.WatchOut,
            start_to_close_timeout=timedelta(seconds=self.opts.watch_seconds + 60),
            heartbeat_timeout=timedelta(seconds=max(5.0, self.opts.watch_poll * 10)),
            retry_policy=STORE_RETRY,
            cancellation_type=workflow.ActivityCancellationType.ABANDON,
            summary="watch store: jobs, task reports, heartbeats",
        )

    async def _cancel_watch(self) -> None:
        if self.watch is not None and not self.watch.done():
            self.watch.cancel()
            with contextlib.suppress(ActivityError, asyncio.CancelledError):
                await self.watch
        self.watch = None

    # -- continue-as-new ---------------------------------------------------------------
    def _continue_as_new_now(self) -> bool:
        # Handlers first: an update waiting for a pass must see it before we go.
        return self._continue_as_new_due() and workflow.all_handlers_finished()

    def _continue_as_new_due(self) -> bool:
        info = workflow.info()
        if info.is_continue_as_new_suggested():
            return True
        if info.get_current_history_length() >= self.opts.max_history_events:
            return True
        if info.get_current_history_size() >= self.opts.max_history_bytes:
            return True
        if self.replay_cost >= self.opts.max_replay_cost:
            return True
        if self.updates >= self.opts.max_updates_per_run:
            return True  # the server refuses updates past 2,000 per run
        limit = self.opts.max_passes_per_run
        return bool(limit and self.passes >= limit)

    def _checkpoint(self) -> c.Checkpoint:
        pending = self.pending
        backoff = [w for w, e in pending.items() if e.kind == "backoff"]
        if len(backoff) > self.opts.carry_backoff_limit:
            # Too many to carry: they are retried at once by the next run instead.
            pending = {w: e for w, e in pending.items() if e.kind != "backoff"}
        return c.Checkpoint(
            generation=self.generation,
            pending=pending,
            failures=self.failures,
            autoscale=self.autoscale,
            autoscale_evaluated=self.autoscale_evaluated,
            reports_seq=self.reports_seq,
            last_resync=self.last_resync,
            runs=self.runs,
            signals_dropped=self.signals_dropped,
            last_dropped=self.last_dropped,
        )

    def _next_wake(self, now: float) -> tuple[float | None, str]:
        wake: float | None = None
        why = ""
        # A deadline that passed while the last pass persisted (a slow store) is
        # still a deadline: it makes the loop run a pass at once, not sleep on.
        for e in self.pending.values():
            if e.kind != "deferred" and (wake is None or e.not_before < wake):
                wake, why = e.not_before, f"{e.kind} expiry"
        for job in self.jobs.values():
            for g in job.groups:
                if g.autoscale is None:
                    continue
                key = f"{job.id}/{g.name}"
                t = next_due(
                    g.autoscale,
                    self.autoscale.get(key, AutoscaleState()),
                    self.autoscale_evaluated.get(key),
                    now,
                )
                if wake is None or t < wake:
                    wake, why = t, "autoscale tick"
        resync = self.last_resync + self.opts.resync_seconds
        if wake is None or resync < wake:
            wake, why = resync, "job resync"
        return wake, why

    # -- signals ------------------------------------------------------------------------
    # Signals cannot be refused, so the handlers take their payload raw (``*args``:
    # the SDK then decodes it without a type) and validate it here, dropping what
    # does not match the contract with a warning. A typed handler would raise on a
    # null payload, on no payload or on two (the SDK passes those through), and an
    # exception in a handler fails the workflow task: the workflow would be stuck
    # retrying it for ever.
    @workflow.signal(name=c.SIGNAL_REGISTER_NODE)
    def register_node(self, *args: Any) -> None:
        req = self._signal(c.SIGNAL_REGISTER_NODE, c.RegisterNodes, args)
        for node in req.nodes if req is not None else ():
            self.inbox.append(("register", node))

    @workflow.signal(name=c.SIGNAL_REMOVE_NODE)
    def remove_node(self, *args: Any) -> None:
        req = self._signal(c.SIGNAL_REMOVE_NODE, c.NodeRef, args)
        if req is not None:
            self.inbox.append(("remove", req.node_id))

    @workflow.signal(name=c.SIGNAL_NODE_LOST)
    def node_lost(self, *args: Any) -> None:
        req = self._signal(c.SIGNAL_NODE_LOST, c.NodeRef, args)
        if req is not None:
            self.inbox.append(("lost", req.node_id))

    @workflow.signal(dynamic=True)
    def unknown_signal(self, name: str, args: Sequence[RawValue]) -> None:
        """A signal no handler knows (a misspelt name): recorded, never raised."""
        self._dropped(name, "unknown signal (known: register_node, remove_node, node_lost)")

    def _signal(self, name: str, model: type[_Payload], args: tuple[Any, ...]) -> _Payload | None:
        parsed = _parse(model, args)
        if isinstance(parsed, str):
            self._dropped(name, parsed)
            return None
        return parsed

    def _dropped(self, name: str, problem: str) -> None:
        """A signal could not be used: the sender cannot be told (signals are not
        answered), so it is logged, counted and shown (details, status) instead."""
        workflow.logger.warning("dropping %s signal: %s", name, problem[:500])
        if not workflow.patched(PATCH_DROPPED_SIGNALS):
            return
        line = f"{name}: {problem}"[:300]
        self.signals_dropped += 1
        self.last_dropped = line
        workflow.metric_meter().create_counter(
            "forge_signals_dropped_total", "signals dropped: unknown name or bad payload"
        ).add(1, {"signal": name[:64]})
        self.dirty = True  # the next pass publishes it

    # -- updates ------------------------------------------------------------------------
    @workflow.update(name=c.UPDATE_SUBMIT_JOB)
    async def submit_job(self, raw: Any) -> c.JobResult:
        req = _update_arg(c.SubmitJob, raw)
        self.updates += 1
        await workflow.wait_condition(lambda: self.ready)
        await self._reserve(_json_size(req.job))
        ticket = self._queue_job(req.job.id, req.job)
        return await self._settle(req.job.id, ticket, wait=req.wait)

    @submit_job.validator
    def _validate_submit(self, raw: Any) -> None:
        req = _update_arg(c.SubmitJob, raw)
        # Jobs may arrive before any node: they wait, pending, with reasons.
        self._refuse_if_busy()
        if not req.job.groups:
            raise _refuse("job has no groups")

    @workflow.update(name=c.UPDATE_SUBMIT_JOBS)
    async def submit_jobs(self, raw: Any) -> list[c.JobResult]:
        req = _update_arg(c.SubmitJobs, raw)
        self.updates += 1
        await workflow.wait_condition(lambda: self.ready)
        await self._reserve(sum(_json_size(j) for j in req.jobs))
        tickets = [self._queue_job(j.id, j) for j in req.jobs]
        if req.wait:
            await workflow.wait_condition(lambda: self.planned_ticket >= tickets[-1])
        return [
            await self._settle(j.id, t, wait=False) for j, t in zip(req.jobs, tickets, strict=True)
        ]

    @submit_jobs.validator
    def _validate_submit_jobs(self, raw: Any) -> None:
        req = _update_arg(c.SubmitJobs, raw)
        self._refuse_if_busy()
        size = sum(_json_size(j) for j in req.jobs)
        if size > MAX_BATCH_BYTES:
            raise _refuse(
                f"{len(req.jobs)} jobs of {size / 1024:,.0f} KiB as JSON in one update; the "
                f"limit is {MAX_BATCH_BYTES // 1024} KiB: send them in smaller batches"
            )
        ids = [j.id for j in req.jobs]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise _refuse(f"job ids repeated in one batch: {', '.join(dupes[:5])}")

    @workflow.update(name=c.UPDATE_SCALE)
    async def scale(self, raw: Any) -> c.JobResult:
        req = _update_arg(c.ScaleGroup, raw)
        self.updates += 1
        await workflow.wait_condition(lambda: self.ready)
        current = self._current_job(req.job_id)
        await self._reserve(_json_size(current) if current is not None else 0)
        job = self._current_job(req.job_id)  # again: it may have changed meanwhile
        if job is None or job.group(req.group) is None:
            raise ApplicationError(
                f"no group {req.job_id}/{req.group}", type=INVALID_INPUT, non_retryable=True
            )
        ticket = self._queue_job(req.job_id, job.with_desired(req.group, req.count))
        return await self._settle(req.job_id, ticket, wait=True)

    @scale.validator
    def _validate_scale(self, raw: Any) -> None:
        req = _update_arg(c.ScaleGroup, raw)
        self._refuse_if_busy()
        if not self.ready:
            return  # checked again by the handler once the state is loaded
        job = self._current_job(req.job_id)
        if job is None:
            raise _refuse(f"unknown job {req.job_id!r}")
        if job.group(req.group) is None:
            raise _refuse(f"job {req.job_id!r} has no group {req.group!r}")

    @workflow.update(name=c.UPDATE_STOP_JOB)
    async def stop_job(self, raw: Any) -> c.JobResult:
        req = _update_arg(c.StopJob, raw)
        self.updates += 1
        await workflow.wait_condition(lambda: self.ready)
        if self._current_job(req.job_id) is None:
            raise ApplicationError(
                f"unknown job {req.job_id!r}", type=INVALID_INPUT, non_retryable=True
            )
        ticket = self._queue_job(req.job_id, None)
        return await self._settle(req.job_id, ticket, wait=True)

    @stop_job.validator
    def _validate_stop(self, raw: Any) -> None:
        req = _update_arg(c.StopJob, raw)
        self._refuse_if_busy()
        if self.ready and self._current_job(req.job_id) is None:
            raise _refuse(f"unknown job {req.job_id!r}")

    @workflow.update(name=c.UPDATE_DRAIN_NODE)
    async def drain_node(self, raw: Any) -> int:
        req = _update_arg(c.DrainNode, raw)
        self.updates += 1
        await workflow.wait_condition(lambda: self.ready)
        moving = sum(1 for b in self.bindings.values() if b.node == req.node_id)
        self.inbox.append(("drain", req.node_id))
        target = self.passes + 1
        await workflow.wait_condition(lambda: self.passes >= target)
        return moving

    @drain_node.validator
    def _validate_drain(self, raw: Any) -> None:
        req = _update_arg(c.DrainNode, raw)
        self._refuse_if_busy()
        if not self.ready:
            return
        node = self.nodes.get(req.node_id)
        if node is None:
            raise _refuse(f"unknown node {req.node_id!r}")
        if node.state is NodeState.LOST:
            raise _refuse(f"node {req.node_id!r} is lost; nothing to drain")

    @workflow.update(name=c.UPDATE_REPORT_FAILED)
    async def report_failed(self, raw: Any) -> c.ReportFailedResult:
        req = _update_arg(c.ReportFailed, raw)
        self.updates += 1
        await workflow.wait_condition(lambda: self.ready)
        accepted = 0
        for wid in req.workload_ids:
            b = self.bindings.get(wid)
            # keyed by the binding when the sender says where it failed: a report
            # replayed after a reset cannot restart a replica that has moved since
            if b is not None and req.on.get(wid, b.node) == b.node:
                self.failed[wid] = None
                accepted += 1
        self.dirty = True
        target = self.passes + 1
        await workflow.wait_condition(lambda: self.passes >= target)
        return c.ReportFailedResult(accepted=accepted)

    @report_failed.validator
    def _validate_report(self, raw: Any) -> None:
        req = _update_arg(c.ReportFailed, raw)
        self._refuse_if_busy()
        if not self.ready:
            return
        unknown = [w for w in req.workload_ids if w not in self.bindings]
        if unknown:
            shown = ", ".join(unknown[:5]) + (" ..." if len(unknown) > 5 else "")
            raise _refuse(f"not bound: {shown}")

    def _refuse_if_busy(self) -> None:
        """Refuse new updates while this run is due to continue as new.

        The loop continues as new only once it is idle, so a steady stream of updates
        would keep one run growing past the server's limits (2,000 updates, then
        51,200 events): the server then refuses every update. A refused update
        leaves nothing in history and the client retries it, reaching the next run.
        """
        if self._continue_as_new_due():
            raise ApplicationError(
                "the cluster workflow is continuing as new; retry shortly", type=BUSY
            )

    async def _reserve(self, size: int) -> None:
        """Backpressure: handlers queue at most MAX_BATCH_BYTES of job JSON for one
        store write (whose activity input must stay under Temporal's 2 MiB payload
        limit, or every workflow task fails); one that would overflow the queue waits
        for the next pass to take it. Returns at once, without yielding, when there
        is room, so small submissions run exactly as before."""
        while self.job_queue and self.queued_bytes + size > MAX_BATCH_BYTES:
            await workflow.wait_condition(lambda: not self.job_queue)
        if not self.job_queue:
            self.queued_bytes = 0
        self.queued_bytes += size

    def _current_job(self, job_id: str) -> Job | None:
        """The job as it will be after the queued writes (and those in flight)."""
        if job_id in self.job_queue:
            return self.job_queue[job_id]
        if job_id in self.job_writing:
            return self.job_writing[job_id]
        return self.jobs.get(job_id)

    def _queue_job(self, job_id: str, job: Job | None) -> int:
        """Queue a job write (None deletes) for the next pass; returns its ticket.
        The pass writes the whole queue with one activity, so a burst of
        submissions costs one store round trip, not one per job."""
        self.job_queue.pop(job_id, None)  # keep arrival order of the latest write
        self.job_queue[job_id] = job
        self.ticket += 1
        self.dirty = True
        return self.ticket

    async def _settle(self, job_id: str, ticket: int, *, wait: bool) -> c.JobResult:
        # Without wait, the update completes once queued: it is durable already (its
        # acceptance is in history; a worker that replays it queues it again), so a
        # burst of submissions is not throttled by Temporal's in-flight update limit.
        if wait:
            await workflow.wait_condition(lambda: self.planned_ticket >= ticket)
        job = self.jobs.get(job_id)
        desired = bound = 0
        if job is not None:
            for g in job.groups:
                for i in range(g.scaling.desired):
                    desired += 1
                    bound += workload_id(job.id, g.name, i) in self.bindings
        return c.JobResult(
            job_id=job_id,
            revision=self.jobs_revision,
            desired=desired,
            bound=bound,
            pending=desired - bound,
        )

    # -- queries ------------------------------------------------------------------------
    # Best-effort views for operators (`temporal workflow query`). Forge's own tools
    # read what the loop publishes instead: a query sent while a worker takes the
    # run over can wedge replay (RELIABILITY.md), and these walk every binding.
    @workflow.query(name=c.QUERY_STATUS)
    def status(self) -> c.StatusView:
        pending, truncated = views.pending_views(self.pending)
        return c.StatusView(
            summary=self._summary(),
            nodes=views.node_views(self.nodes.values(), self.bindings.values()),
            pending=pending,
            pending_truncated=truncated + self.deferred,
        )

    @workflow.query(name=c.QUERY_ASSIGNMENTS)
    def assignments(self, q: c.AssignmentsQuery | None = None) -> c.AssignmentsPage:
        q = q or c.AssignmentsQuery()  # the Web UI runs a query without an argument
        ids = sorted(
            w
            for w, b in self.bindings.items()
            if w > q.after and (q.node is None or b.node == q.node)
        )
        page = ids[: q.limit]
        items = [
            c.AssignmentView(
                workload_id=w,
                node=self.bindings[w].node,
                gpu_ids=list(self.bindings[w].gpu_ids),
                status=str(self.bindings[w].status),
            )
            for w in page
        ]
        nxt = page[-1] if len(ids) > q.limit else None
        return c.AssignmentsPage(items=items, next_after=nxt)

    @workflow.query(name=c.QUERY_EXPLAIN)
    def explain(self, wid: str) -> c.Explanation:
        e = self.pending.get(wid)
        shown = views.pending_views({wid: e})[0][0] if e is not None else None
        return views.explanation(
            wid,
            binding=self.bindings.get(wid),
            pending=shown,
            job=self.jobs.get(wid.rsplit("/", 2)[0]),
            nodes=self.nodes.values(),
            bindings=self.bindings.values(),
        )

    # -- presentation -------------------------------------------------------------------
    def _notices(self) -> list[str]:
        if not self.signals_dropped:
            return []
        return [f"{self.signals_dropped} signal(s) dropped; last: {self.last_dropped}"]

    def _state_after(self, plan: Plan) -> int:
        """The bindings hash after ``plan``, from its changes alone."""
        total = self.state_sum
        for b in plan.dropped:
            total -= _hash(b)
        for b in plan.placed:
            total += _hash(b)
        return total % STATE_MOD

    def _publication(self, plan: Plan, now: float) -> tuple[str, c.Summary]:
        """What this pass publishes (status JSON without the fields that change every
        pass, so an unchanged cluster publishes nothing), and its summary."""
        summary = c.Summary(
            desired=plan.desired,
            bound=len(plan.bindings),
            pending=len(plan.pending) + plan.deferred,
            nodes=len(self.nodes),
            jobs=len(self.jobs),
            passes=0,
            generation=self.generation,
            last_pass_at=None,
            last_pass="",
        )
        doc = views.loop_status(
            summary,
            plan.pending,
            deferred=plan.deferred,
            notices=self._notices(),
            state_digest=f"{self._state_after(plan):016x}",
        )
        full = summary.model_copy(
            update={
                "passes": self.passes + 1,
                "last_pass_at": now,
                "last_pass": _pass_text(self.passes + 1, plan),
            }
        )
        return doc.model_dump_json(), full

    def _summary(self) -> c.Summary:
        desired = sum(g.scaling.desired for j in self.jobs.values() for g in j.groups)
        return c.Summary(
            desired=desired,
            bound=len(self.bindings),
            pending=len(self.pending) + self.deferred,
            nodes=len(self.nodes),
            jobs=len(self.jobs),
            passes=self.passes,
            generation=self.generation,
            last_pass_at=self.last_pass_at,
            last_pass=self.last_pass,
        )

    def _details(self) -> None:
        states = Counter(str(n.state) for n in self.nodes.values())
        reasons = views.pending_reasons(self.pending, self.deferred, limit=5)
        lines = [
            f"**Forge cluster `{self.cluster}`** (run {self.runs}, generation {self.generation})",
            "",
            f"- nodes: {len(self.nodes)} ("
            + ", ".join(f"{n} {s}" for s, n in sorted(states.items()))
            + ")",
            f"- jobs: {len(self.jobs)}, replicas bound: {len(self.bindings)}, "
            f"pending: {len(self.pending) + self.deferred}",
            f"- last pass: {self.last_pass}",
        ]
        lines.extend(f"- **{n}**" for n in self._notices())
        if reasons:
            lines.append("- pending because:")
            lines.extend(f"  - {n} x {r}" for r, n in reasons)
        workflow.set_current_details("\n".join(lines))
        self._search_attributes()

    def _search_attributes(self) -> None:
        if workflow.info().typed_search_attributes.get(SA_CLUSTER) is None:
            return  # the server has no Forge attributes registered; see worker start-up
        values = (len(self.pending) + self.deferred, len(self.bindings), len(self.nodes))
        if values == self.search_attrs:
            return
        self.search_attrs = values
        workflow.upsert_search_attributes(
            [
                SA_PENDING.value_set(values[0]),
                SA_BOUND.value_set(values[1]),
                SA_NODES.value_set(values[2]),
            ]
        )

    def _record(self, plan: Plan, elapsed: float) -> None:
        meter = workflow.metric_meter().with_additional_attributes({"cluster": self.cluster})
        meter.create_gauge("forge_replicas_desired", "desired replicas").set(plan.desired)
        meter.create_gauge("forge_replicas_bound", "bound replicas").set(len(plan.bindings))
        meter.create_gauge("forge_replicas_pending", "pending replicas").set(
            len(plan.pending) + plan.deferred
        )
        backoff = sum(1 for e in plan.pending.values() if e.kind == "backoff")
        meter.create_gauge("forge_replicas_backoff", "replicas in backoff").set(backoff)
        states = Counter(str(n.state) for n in self.nodes.values())
        gauge = meter.create_gauge("forge_nodes", "nodes by state")
        for s in ("ready", "draining", "lost"):
            gauge.set(states.get(s, 0), {"state": s})
        meter.create_counter("forge_placements_total", "replicas placed").add(len(plan.placed))
        meter.create_counter("forge_releases_total", "replicas released").add(len(plan.released))
        # every release moves or stops a running replica: by reason, so a move that
        # nothing asked for (a restart churn bug) shows up in production
        moved = meter.create_counter(
            "forge_replicas_moved_total", "replicas released from their node, by reason"
        )
        for reason, n in sorted(Counter(r for _, r in plan.released).items()):
            moved.add(n, {"reason": reason})
        meter.create_counter("forge_passes_total", "reconcile passes").add(1)
        meter.create_histogram_float("forge_pass_seconds", "time to plan one pass", "s").record(
            elapsed
        )
        meter.create_histogram("forge_pass_work_units", "node checks and scores of a pass").record(
            plan.work
        )
        if elapsed > self.longest_plan:
            self.longest_plan = elapsed
            meter.create_gauge_float(
                "forge_longest_plan_seconds",
                "longest planning step of this run (one activation)",
                "s",
            ).set(elapsed)

    # -- activity helper ----------------------------------------------------------------
    async def _act(self, name: str, arg: Any, result_type: Any, *, summary: str) -> Any:
        return await workflow.execute_activity(
            name,
            arg,
            result_type=result_type,
            start_to_close_timeout=STORE_TIMEOUT,
            heartbeat_timeout=STORE_HEARTBEAT,
            retry_policy=STORE_RETRY,
            summary=summary[:200],
        )


_Payload = TypeVar("_Payload", bound=pydantic.BaseModel)


def _parse(model: type[_Payload], args: tuple[Any, ...]) -> _Payload | str:
    """The one argument of a signal or update as ``model`` (validated in JSON mode,
    as a typed handler would), or what is wrong with it, field errors first."""
    if len(args) != 1:
        return f"expected one argument, got {len(args)}"
    try:
        return model.model_validate_json(json.dumps(args[0]))
    except pydantic.ValidationError as err:
        shown = [
            f"{'.'.join(map(str, e['loc'])) or '(payload)'}: {e['msg']}" for e in err.errors()[:3]
        ]
        more = f" (+{err.error_count() - 3} more)" if err.error_count() > 3 else ""
        return "; ".join(shown) + more
    except (TypeError, ValueError) as err:  # not JSON data at all
        return f"not a {model.__name__}: {type(err).__name__}"


def _update_arg(model: type[_Payload], raw: Any) -> _Payload:
    """An update's argument, or a refusal a plain client can act on: non-retryable,
    naming the fields (raised in a validator, nothing enters history)."""
    parsed = _parse(model, (raw,))
    if isinstance(parsed, str):
        raise _refuse(f"{model.__name__}: {parsed}")
    return parsed


def _refuse(message: str) -> ApplicationError:
    return ApplicationError(message[:1000], type=INVALID_INPUT, non_retryable=True)


def _hash(b: Binding) -> int:
    return binding_hash(b.job, b.group, b.ordinal, b.node, b.gpu_ids, b.cpu, b.memory)


def _pass_text(passes: int, plan: Plan) -> str:
    return (
        f"pass {passes}: +{len(plan.placed)} placed, -{len(plan.released)} released, "
        f"{len(plan.pending) + plan.deferred} pending"
        + (f" ({plan.deferred} deferred)" if plan.deferred else "")
    )


def _status_json(published: tuple[str, c.Summary]) -> str:
    """The published status with the live summary filled in."""
    doc = c.LoopStatus.model_validate_json(published[0])
    return doc.model_copy(update={"summary": published[1]}).model_dump_json()


def _json_size(job: Job) -> int:
    return len(job.model_dump_json())


def _row(b: Binding) -> ac.BindRow:
    row = (b.job, b.group, b.ordinal, b.node, b.gpu_ids, b.cpu, b.memory, str(b.status))
    return (*row, b.gpu_milli) if b.gpu_milli else row
