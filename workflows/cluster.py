"""ClusterWorkflow: one long-running workflow per cluster runs the reconcile loop.

Deterministic orchestration only: every decision comes from ``forge``'s pure
functions, every byte of I/O from an activity. A pass:

1. take what arrived: node operations (queued in arrival order), the watch
   activity's news (job revision moved, task reports, expired heartbeats);
2. load job changes since the last revision (paged), task reports (batched) and,
   for autoscaled groups that are due, metrics;
3. plan with :func:`forge.core.reconcile.reconcile`;
4. persist the plan's delta, fenced by (generation, pass), and check the digest
   the store returns against our own: a replay that planned differently from the
   original run (a determinism bug) stops here instead of diverging silently;
5. wait on a condition whose timeout is the earliest deadline (backoff expiry,
   autoscale tick, resync): no fixed ticker, so an idle cluster is quiet.

The state a pass decides from is one object (``workflows.state``), restored in
``@workflow.init`` from the checkpoint and reloaded from the store (in pages) by
``_bootstrap``; the job queue, the watch and the activity calls are helpers next to
this module, and what the loop shows (status, details, metrics) are pure views in
``forge.wire.views``.
"""

from __future__ import annotations

import time

from temporalio import workflow

from workflows import activities as acts
from workflows import loading
from workflows.handlers import PATCH_DROPPED_SIGNALS
from workflows.patches import (
    PATCH_PLACEMENT_V2,
    PATCH_PUBLISH,
    PATCH_ROLLOUTS,
    PATCH_ROLLOUTS_2,
    PATCH_ROLLOUTS_3,
    PATCH_WORK_BUDGET,
    PATCH_WORK_BUDGET_2,
)
from workflows.presentation import Presentation, status_json
from workflows.state import binding_row
from workflows.watch import StoreWatch

with workflow.unsafe.imports_passed_through():
    from forge.core.models import Node
    from forge.core.reconcile import (
        DEFAULT_MAX_WORK,
        MAX_WORK_V2,
        PENDING_UNITS_V2,
        Carry,
        Plan,
        reconcile,
    )
    from forge.core.versions import with_tasks_of
    from forge.stores.base import STATE_MOD, rows_digest
    from forge.wire import activity_contract as ac
    from forge.wire import contract as c
    from forge.wire import errors, views

__all__ = [
    "PATCH_DROPPED_SIGNALS",
    "PATCH_PLACEMENT_V2",
    "PATCH_PUBLISH",
    "PATCH_ROLLOUTS",
    "PATCH_ROLLOUTS_2",
    "PATCH_ROLLOUTS_3",
    "PATCH_WORK_BUDGET",
    "PATCH_WORK_BUDGET_2",
    "ClusterWorkflow",
    "DivergenceError",
]

#: Node JSON one pass persists at most (a burst of registrations between two passes
#: is spread over several persists, each far below Temporal's 2 MiB payload limit).
NODE_BYTES = 512 * 1024


class DivergenceError(RuntimeError):
    """The store applied a different delta than this code planned: the workflow
    code changed without ``workflow.patched``. Failing the workflow task (not the
    workflow) keeps the history intact until the code is fixed."""


@workflow.defn(name=c.WORKFLOW_TYPE)
class ClusterWorkflow(Presentation):
    @workflow.init
    def __init__(self, inp: c.ClusterInput) -> None:
        super().__init__(inp)
        self.watch = StoreWatch()
        self.published = ""  # the last status published (without per-pass fields)

    # -- the loop -----------------------------------------------------------------------
    @workflow.run
    async def run(self, inp: c.ClusterInput) -> None:
        await self._bootstrap()
        self.ready = True
        while True:
            if self.dirty or self.inbox or self.queue.queued or self.watch.done():
                await self._pass()
                continue
            if self._continue_as_new_now():
                await self.watch.cancel()
                if not (self.dirty or self.inbox):
                    workflow.continue_as_new(
                        c.ClusterInput(
                            cluster=self.st.cluster,
                            options=self.st.opts,
                            checkpoint=self.st.checkpoint(),
                        )
                    )
            self._ensure_watch()
            now = workflow.now().timestamp()
            wake, why = self.st.next_wake(now)
            if wake <= now:
                self.dirty = True
                continue
            try:
                await workflow.wait_condition(
                    lambda: (
                        self.dirty
                        or bool(self.inbox)
                        or self.watch.done()
                        or self._continue_as_new_now()
                    ),
                    timeout=wake - now,
                    timeout_summary=why,
                )
            except TimeoutError:
                self.dirty = True

    async def _bootstrap(self) -> None:
        """Load the persisted state: the fence, nodes, bindings and jobs (paged)."""
        st = self.st
        st.generation = max(st.generation, await acts.fence(st.cluster) + 1)
        st.pass_no = 0
        nodes = await loading.load_nodes(st)
        carry: Carry | None = None
        if workflow.patched(PATCH_WORK_BUDGET):
            # jobs first, so that each page of bindings is checked and held as it
            # arrives: no activation of a new run walks every binding
            st.nodes = nodes
            st.jobs = {}
            st.jobs_revision = 0
            await loading.load_jobs(st)
            carry = Carry.start(st.jobs, nodes, rolling=workflow.patched(PATCH_ROLLOUTS))
        bindings, state_sum = await loading.load_bindings(st, carry)
        st.nodes = nodes
        st.state_sum = state_sum % STATE_MOD
        st.carry = carry
        if carry is not None:
            st.bindings = carry.bindings
        else:  # before the patch: the first pass checks every binding
            st.bindings = bindings
            st.jobs = {}
            st.jobs_revision = 0
            await loading.load_jobs(st)
        st.last_resync = workflow.now().timestamp()
        self._details()

    async def _pass(self) -> None:
        st = self.st
        self.dirty = False
        now = workflow.now().timestamp()
        nodes_upsert: dict[str, Node] = {}
        nodes_remove: dict[str, None] = {}

        if self.watch.done():
            news = self.watch.take()
            st.known_revision = max(st.known_revision, news.jobs_revision)
            st.known_reports_seq = max(st.known_reports_seq, news.reports_seq)
            self.inbox.extend(c.LostOp(node_id=n) for n in news.expired)

        # node changes, in arrival order; with the work budget, at most
        # NODE_BYTES of node JSON per pass (one persist input), the rest next pass
        inbox, self.inbox = self.inbox, []
        chunked = workflow.patched(PATCH_WORK_BUDGET)
        size = 0
        for k, op in enumerate(inbox):
            if chunked and isinstance(op, c.RegisterOp):
                size += len(op.node.model_dump_json())
                if size > NODE_BYTES and k:
                    self.inbox = inbox[k:] + self.inbox
                    self.dirty = True
                    break
            st.apply(op, nodes_upsert, nodes_remove)

        # jobs, reports, metrics
        if now - st.last_resync >= st.opts.resync_seconds:
            st.jobs_revision = 0  # a full reload (swapped in when complete)
            st.last_resync = now
        written = self.queue.written
        if self.queue.queued:
            await self._write_jobs()
            written = self.queue.written
        if st.known_revision > st.jobs_revision or not st.jobs_revision:
            await loading.load_jobs(st)
        self.queue.writing = {}  # now in st.jobs
        if st.known_reports_seq > st.reports_seq:
            await loading.load_reports(st)
        if await loading.autoscale(st, self.queue, now):
            self.dirty = True

        # plan (what to persist for status changes is taken first: reconcile may
        # update the bindings, which are the carry's, in place)
        failed = [w for w in st.failed if w in st.bindings]
        status_changed = [w for w in st.status_updates if w in st.bindings]
        options = st.opts.reconcile
        bounded = workflow.patched(PATCH_WORK_BUDGET)
        if bounded and not options.max_work:
            # a pass plans at most this much and defers the rest to the next pass,
            # and re-checks only what changed (the carry), so no activation runs
            # near the SDK's 2 s deadlock limit, however big the cluster
            if workflow.patched(PATCH_WORK_BUDGET_2):
                update = {"max_work": MAX_WORK_V2, "pending_units": PENDING_UNITS_V2}
            else:
                update = {"max_work": DEFAULT_MAX_WORK}
            options = options.model_copy(update=update)
        rolling = workflow.patched(PATCH_ROLLOUTS)
        if rolling:
            options = options.model_copy(update={"rollouts": True})
        checks = rolling and workflow.patched(PATCH_ROLLOUTS_3)
        if checks:
            options = options.model_copy(update={"health_checks": True})
            st.take_health(now)
        # -- placement-v2 (begin) --
        carry = st.carry if bounded else None
        if workflow.patched(PATCH_PLACEMENT_V2):
            if options.placement_version < 2:
                options = options.model_copy(update={"placement_version": 2})
        elif options.placement_version >= 2:
            carry = None  # what version 2 did before it kept the carry
        # -- placement-v2 (end) --
        with workflow.unsafe.sandbox_unrestricted():  # a metric only, never a decision
            started = time.perf_counter()
        plan = reconcile(
            jobs=st.jobs,
            nodes=st.nodes,
            bindings=st.bindings,
            pending=st.pending,
            failures=st.failures,
            failed=failed,
            capacity_changed=st.capacity_changed,
            now=now,
            options=options,
            carry=carry,
            rollouts=st.rollouts,
            since=st.since,
            promoted=st.promoted,
            health=st.health,
        )
        with workflow.unsafe.sandbox_unrestricted():
            elapsed = time.perf_counter() - started

        # persist what changed
        released = {w for w, _ in plan.released}
        placed = {b.workload_id for b in plan.placed}
        binds = list(plan.placed)
        again = list(status_changed)
        if plan.rollouts is not None:  # pre-versions bindings given their version
            again.extend(w for w in plan.rollouts.stamped if w not in st.status_updates)
        binds.extend(
            plan.bindings[w]
            for w in again
            if w in plan.bindings and w not in released and w not in placed
        )
        persist = ac.PersistIn(
            cluster=st.cluster,
            generation=st.generation,
            pass_no=st.pass_no + 1,
            bind=[binding_row(b) for b in binds],
            release=sorted(released),
            nodes_upsert=list(nodes_upsert.values()),
            nodes_remove=list(nodes_remove),
        )
        published: tuple[str, c.Summary] | None = None
        if workflow.patched(PATCH_PUBLISH):
            published = self._publication(plan, now)
            if published[0] != self.published:
                persist = persist.model_copy(update={"status": status_json(published)})
        if (
            persist.bind
            or persist.release
            or persist.nodes_upsert
            or persist.nodes_remove
            or persist.status is not None
        ):
            st.pass_no += 1
            if not await self._persist(persist, plan):
                return  # state was reloaded from the store; plan again
            if persist.status is not None and published is not None:
                self.published = published[0]
                # the summary for describe() (no store needed); small, never compressed
                workflow.upsert_memo({c.MEMO_SUMMARY: published[1].model_dump(mode="json")})

        # commit
        st.state_sum = st.state_after(plan)
        st.bindings = plan.bindings
        st.carry = plan.carry if bounded else None
        st.pending = plan.pending
        st.deferred = plan.deferred
        st.failures = plan.failures
        st.commit_rollouts(plan, status_changed, now, checks)
        revert = plan.rollouts.revert if plan.rollouts is not None else {}
        st.failed = {}
        st.status_updates = {}
        st.capacity_changed = False
        self.queue.planned = written
        st.passes += 1
        # what a worker taking the run over replays: the passes' work
        self.replay_cost += plan.work if bounded else plan.desired + len(plan.released)
        st.last_pass_at = now
        st.last_pass = views.pass_text(st.passes, plan)
        if plan.deferred:
            self.dirty = True
        self._record(plan, elapsed)
        self._details()
        if revert and workflow.patched(PATCH_ROLLOUTS_2):
            await self._revert(revert)

    async def _revert(self, revert: dict[str, str]) -> None:
        """Failed rollouts with auto_revert: each group goes back to the spec of the
        last version that was healthy (read from the store), queued as a job write as
        the autoscaler's are, and rolled out like any change."""
        st = self.st
        for name, version in sorted(revert.items()):
            job_id, group = name.rsplit("/", 1)
            out = await acts.group_spec(
                ac.GroupSpecIn(cluster=st.cluster, job_id=job_id, group=group, version=version)
            )
            job = self.queue.current(job_id, st.jobs)
            if out.spec is None or job is None or job.group(group) is None:
                workflow.logger.warning("cannot revert %s to %s: not in the store", name, version)
                continue
            workflow.logger.info("reverting %s to version %s", name, version)
            reverted = with_tasks_of(job, group, out.spec)
            self.queue.put(job_id, reverted)
            st.jobs[job_id] = reverted
            self.dirty = True

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
            result = await acts.persist(persist, summary=summary)
        except acts.LoopActivityFailed as err:  # what is not handled fails the task
            if err.cause_type == errors.STALE_FENCE:
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

    async def _write_jobs(self) -> None:
        queue, ticket = self.queue.take()
        out = await acts.write_jobs(
            ac.WriteJobsIn(
                cluster=self.st.cluster,
                put=[j for j in queue.values() if j is not None],
                delete=[i for i, j in queue.items() if j is None],
            )
        )
        self.st.known_revision = max(self.st.known_revision, out.revision)
        self.queue.written = ticket

    def _ensure_watch(self) -> None:
        st = self.st
        if st.opts.watch:
            self.watch.ensure(
                ac.WatchIn(
                    cluster=st.cluster,
                    jobs_revision=max(st.jobs_revision, st.known_revision),
                    reports_seq=max(st.reports_seq, st.known_reports_seq),
                    heartbeat_ttl=st.opts.heartbeat_ttl,
                    max_seconds=st.opts.watch_seconds,
                    poll=st.opts.watch_poll,
                )
            )

    # -- continue-as-new ---------------------------------------------------------------
    def _continue_as_new_now(self) -> bool:
        # Handlers first: an update waiting for a pass must see it before we go.
        return self._continue_as_new_due() and workflow.all_handlers_finished()
