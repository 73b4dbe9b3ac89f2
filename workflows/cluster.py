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

import asyncio
import time
from datetime import datetime

from temporalio import workflow

from workflows import activities as acts
from workflows import batch, loading, patches, queues
from workflows.alarms import Alarms
from workflows.mail import JobWrite
from workflows.presentation import Presentation, status_json
from workflows.state import binding_row, worker_clock
from workflows.watch import StoreWatch

with workflow.unsafe.imports_passed_through():
    from forge import clocks
    from forge.core.budget import next_budget
    from forge.core.models import MAX_BATCH_BYTES, Node
    from forge.core.reconcile import (
        MAX_WORK,
        PENDING_UNITS,
        Carry,
        Plan,
        ReconcileOptions,
        reconcile,
    )
    from forge.core.releasing import restarts_a_batch_gang
    from forge.core.versions import with_tasks_of
    from forge.stores.base import STATE_MOD, rows_digest
    from forge.wire import activity_contract as ac
    from forge.wire import contract as c
    from forge.wire import errors, views

__all__ = ["ClusterWorkflow", "DivergenceError"]

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
        self.intake = workflow.patched(patches.PASS_INTAKE)  # before any handler runs
        self.watch = StoreWatch()
        self.continue_due = False  # the last intake found continue-as-new due
        self.alarms = Alarms()
        self.rings = 0  # the alarms rung when the loop last began to wait
        self.published = ""  # the last status published (without per-pass fields)
        self.adaptive = False  # the adaptive-budget patch, decided by each pass
        self.to_target = False  # the budget-to-target patch, likewise
        self.local_writes = False  # the job-writes-local patch, likewise
        self.plan_started = 0.0  # perf_counter at the pass's planning (a measurement)
        self.budget_used = MAX_WORK  # the budget the last plan was given
        self.pass_now = 0.0  # the clock the pass running plans with

    # -- the loop -----------------------------------------------------------------------
    @workflow.run
    async def run(self, inp: c.ClusterInput) -> None:
        await self._bootstrap(workflow.now().timestamp())
        self.ready = True
        if self.intake:
            await self._run_recorded()
        while True:  # a run recorded before intakes (workflows.patches.PASS_INTAKE)
            if self._continue_as_new_now() and not (self.inbox or self.queue.queued):
                # Deferred work does not hold it up (the new run plans it from the
                # store), so a due continue-as-new comes within a pass or two of
                # becoming due, and updates are refused as busy only that long.
                await self.watch.cancel()
                if self._continue_as_new_now() and not (self.inbox or self.queue.queued):
                    self._continue_as_new()
            if self.dirty or self.inbox or self.queue.queued or self.watch.done():
                await self._pass()
                continue
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

    async def _run_recorded(self) -> None:
        """The loop of runs with intakes: each turn starts with one (a local activity
        recording what the loop saw), and every decision after it, to continue as new,
        to plan, or to sleep until when, is taken from the recorded intake and state
        earlier passes made, never from what handlers did since."""
        while True:
            rec = await self._intake()
            if rec.due and rec.idle and self._drained(rec):
                await self.watch.cancel()
                # (a handler that ran since the intake posted after it: not without it)
                if self.mail.total == rec.mail:
                    self._continue_as_new()
            # what the intake took, never what handlers posted since: a replay may
            # run those handlers earlier than the live run did
            due = self.dirty or self.inbox or self.queue.queued or rec.watch
            due = due or self.mail.taken < rec.mail  # beyond one store write's bytes
            if not due:
                self._ensure_watch()
                wake, _ = self.st.next_wake(rec.now)
                due = self.dirty = wake <= rec.now  # the recorded clock passed a deadline
            if due:
                await self._pass(rec)
                continue
            self.continue_due = rec.due  # and waiting for handlers: their end wakes it
            self.rings = self.alarms.rings
            # one round for the tasks this activation resolved (the watch's result):
            # a wake the loop could already see must not make it wait for a later task
            await asyncio.sleep(0)
            if not self._woken():
                # the recorded clock decided to sleep until ``wake`` (workflows.alarms)
                self.alarms.ensure(wake, workflow.now().timestamp())
                since = workflow.now()
                await workflow.wait_condition(self._woken)
                if not (self.mail.pending() or self._handlers_done()):
                    await self._past(since)  # woken by an alarm or the watch

    def _woken(self) -> bool:
        """Something a turn of the loop takes: mail, the watch's news, an alarm that
        rang since the loop began to wait, or handlers a continue-as-new waited for."""
        return (
            self.mail.pending()
            or self.watch.done()
            or self.alarms.rings > self.rings
            or self._handlers_done()
        )

    def _handlers_done(self) -> bool:
        """Continue-as-new is due and waits for no handler any more."""
        return self.continue_due and workflow.all_handlers_finished()

    async def _past(self, since: datetime) -> None:
        """Go on only in a workflow task later than the one the loop began to wait in.

        A timer's firing or the watch's result can reach this worker with the clock
        of that earlier task: Core runs the events that trail a query sent to a worker
        that never saw the run as a live activation with the previous task's clock
        (../shared/research/temporal-query-takeover/), and an update in the next task
        then comes in an activation of its own. A replay runs both in one activation,
        the update first, so whatever the loop did in the query's activation would
        come before the update's acceptance live and after it replayed. Waiting for the
        clock to move emits nothing there; in the next task the updates are taken
        first, as a replay takes them. A wake by a handler needs no wait: it came with
        its task."""
        await workflow.wait_condition(lambda: workflow.now() > since or self.mail.pending())

    async def _intake(self) -> ac.Intake:
        """Record what the loop sees now, then take the handlers' items it saw."""
        seen = ac.Intake(
            now=workflow.now().timestamp(),
            mail=self.mail.total,
            watch=self.watch.done(),
            due=self._continue_as_new_due(),
            idle=workflow.all_handlers_finished(),
        )
        rec = await acts.intake(seen)
        # Replayed, a handler may run later than it did live: wait for what was seen.
        await workflow.wait_condition(
            lambda: self.mail.total >= rec.mail and (self.watch.done() or not rec.watch)
        )
        queue = self.queue
        if not queue.queued:
            queue.queued_bytes = 0
        for item in self.mail.take(rec.mail, MAX_BATCH_BYTES - queue.queued_bytes):
            if isinstance(item, JobWrite):
                queue.queued_bytes += item.size
            self._apply(item)
        return rec

    def _drained(self, rec: ac.Intake) -> bool:
        """Nothing the intake saw, or passes queued, waits for a pass."""
        return (
            self.mail.taken == rec.mail
            and self.mail.planned >= self.mail.taken
            and not (self.inbox or self.queue.queued)
        )

    def _continue_as_new(self) -> None:
        nxt = c.ClusterInput(
            cluster=self.st.cluster,
            options=self.st.opts,
            checkpoint=self.st.checkpoint(),
        )
        self.st.drop_cluster()
        workflow.continue_as_new(nxt)

    async def _bootstrap(self, now: float) -> None:
        """Load the persisted state: the fence, nodes, jobs, then bindings (paged).
        Jobs come first so that each page of bindings is checked and held as it
        arrives (``Carry.absorb``): no activation of a new run walks every binding."""
        st = self.st
        st.generation = max(st.generation, await acts.fence(st.cluster) + 1)
        st.pass_no = 0
        st.nodes = await loading.load_nodes(st)
        st.jobs = {}
        st.jobs_revision = 0
        await loading.load_jobs(st, starting=True)
        carry = Carry.start(st.jobs, st.nodes, rolling=True)
        _, state_sum = await loading.load_bindings(st, carry)
        await batch.load_done(st)
        st.state_sum = state_sum % STATE_MOD
        st.carry = carry
        st.bindings = carry.bindings
        st.last_resync = now
        # A run replays its own bootstrap whatever it does next: replay-seconds bounds
        # the work after it (counting it made a run whose bootstrap alone took the
        # limit continue as new after every pass: at 10k nodes / 300k replicas, 160
        # runs of one pass each, placing nothing)
        st.unrecorded = 0.0
        self._details()

    async def _pass(self, rec: ac.Intake | None = None) -> None:
        """Take what arrived, load, plan, persist, commit: with an intake's recorded
        clock and watch news, else (a run recorded before intakes) as they are now."""
        self.dirty = False
        # asked every pass, as the other patches are (a run's history names them all)
        self.local_writes = workflow.patched(patches.JOB_WRITES_LOCAL)
        self.st.batch_ends = workflow.patched(patches.FAILED_BATCH_JOB_ENDS)
        now = self.pass_now = rec.now if rec is not None else workflow.now().timestamp()
        watched = rec.watch if rec is not None else self.watch.done()
        nodes_upsert, nodes_remove = self._take_news(watched)
        for job_id in batch.expired(self.st, now, self.queue.queued):  # ttl_after_finished
            self._queue_job(job_id, None)
        written = await self._load(now)
        # taken before planning: reconcile updates the bindings (the carry's) in place
        status_changed = [w for w in self.st.status_updates if w in self.st.bindings]
        plan, elapsed = self._plan(now)
        if not await self._persist_pass(plan, status_changed, nodes_upsert, nodes_remove, now):
            return  # state was reloaded from the store; plan again
        started = worker_clock()
        revert = self._commit(plan, status_changed, written, elapsed, now)
        self.mail.planned = self.mail.taken  # intakes come between passes only
        self.st.unrecorded += worker_clock() - started  # recorded by the next persist
        if revert:
            await self._revert(revert)

    def _take_news(self, watched: bool) -> tuple[dict[str, Node], dict[str, None]]:
        """The watch's news (when it had returned) and the node operations, in
        arrival order: at most NODE_BYTES of node JSON per pass (one persist input),
        the rest next pass."""
        st = self.st
        if watched:
            news = self.watch.take()
            st.known_revision = max(st.known_revision, news.jobs_revision)
            st.known_reports_seq = max(st.known_reports_seq, news.reports_seq)
            self.inbox.extend(c.LostOp(node_id=n) for n in news.expired)
        nodes_upsert: dict[str, Node] = {}
        nodes_remove: dict[str, None] = {}
        inbox, self.inbox = self.inbox, []
        size = 0
        for k, op in enumerate(inbox):
            if isinstance(op, c.RegisterOp):
                size += len(op.node.model_dump_json())
                if size > NODE_BYTES and k:
                    self.inbox = inbox[k:] + self.inbox
                    self.dirty = True
                    break
            st.apply(op, nodes_upsert, nodes_remove)
        return nodes_upsert, nodes_remove

    async def _load(self, now: float) -> int:
        """Write the queued jobs, load job changes, task reports and (when due)
        metrics. Returns the job-queue ticket the pass plans with."""
        st = self.st
        resync = now - st.last_resync >= st.opts.resync_seconds
        if resync:
            st.jobs_revision = 0  # a full reload (swapped in when complete)
            st.last_resync = now
        if self.queue.queued:
            # revision 0 is then an empty store the loop has loaded (no resync due):
            # its own first writes are taken without reading them back
            await self._write_jobs(from_empty=self.local_writes and not resync)
        written = self.queue.written
        if st.known_revision > st.jobs_revision or not st.jobs_revision:
            await loading.load_jobs(st)
        self.queue.writing = {}  # now in st.jobs
        if st.known_reports_seq > st.reports_seq:
            await loading.load_reports(st)
        if await loading.autoscale(st, self.queue, now):
            self.dirty = True
        return written

    def _options(self) -> ReconcileOptions:
        """The pass's options: the cluster's, with the loop's work budget (a pass
        plans at most this much and defers the rest, so no activation runs near the
        SDK's 2 s deadlock limit however big the cluster), rolling updates, health
        checks."""
        options = self.st.opts.reconcile
        update: dict[str, object] = {
            "rollouts": True,
            "health_checks": True,
        }
        for patch_id, option in patches.OPTION_SWITCHES:  # a run recorded before: off
            if not workflow.patched(patch_id):
                update[option] = False
        work = self.st.max_work or (0 if options.max_work else MAX_WORK)
        self.adaptive = workflow.patched(patches.ADAPTIVE_BUDGET)
        self.replay_timed = self.adaptive and workflow.patched(patches.REPLAY_SECONDS)
        self.to_target = self.adaptive and workflow.patched(patches.BUDGET_TO_TARGET)
        gang_failed = restarts_a_batch_gang(self.st.jobs, self.st.failed)
        if not (gang_failed and workflow.patched(patches.BATCH_GANG_ONE_ATTEMPT)):
            update["gang_attempts"] = False  # counted alone (or no batch gang member failed)
        if work and self.adaptive and self.st.pass_budget:
            work = min(work, self.st.pass_budget)  # as timed, never above the watchdog's
        if work:  # the watchdog's after repeated deadlocks, else the loop's
            update.update(max_work=work, pending_units=PENDING_UNITS)
        self.budget_used = work or options.max_work
        return options.model_copy(update=update)

    def _plan(self, now: float) -> tuple[Plan, float]:
        st = self.st
        st.take_health(now)
        with workflow.unsafe.sandbox_unrestricted():  # a metric, and the persist's input
            started = self.plan_started = clocks.plan_clock()
        done, completed = batch.for_pass(st, now)
        plan = reconcile(
            jobs=st.jobs,
            nodes=st.nodes,
            bindings=st.bindings,
            pending=st.pending,
            failures=st.failures,
            failed=[w for w in st.failed if w in st.bindings],
            capacity_changed=st.capacity_changed,
            now=now,
            options=self._options(),
            carry=st.carry,
            rollouts=st.rollouts,
            since=st.since,
            promoted=st.promoted,
            health=st.health,
            jobs_changed=st.jobs_changed,
            done=done,
            completed=completed,
            queues=st.queues,
        )
        with workflow.unsafe.sandbox_unrestricted():
            elapsed = time.perf_counter() - started
        return plan, elapsed

    async def _persist_pass(
        self,
        plan: Plan,
        status_changed: list[str],
        nodes_upsert: dict[str, Node],
        nodes_remove: dict[str, None],
        now: float,
    ) -> bool:
        """Persist what changed (the plan's delta, node changes, replicas whose status
        changed, the published status) in one fenced activity. False: the state was
        reloaded from the store instead (a stale fence)."""
        st = self.st
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
            complete=batch.completions(plan),
            queues=queues.unpersisted(st.queues, self.queues_persisted),
        )
        batch.failures(st, plan)
        published = self._publication(plan, now)
        if published[0] != self.published:
            persist = persist.model_copy(update={"status": status_json(published)})
        if not (
            persist.bind
            or persist.release
            or persist.nodes_upsert
            or persist.nodes_remove
            or persist.status is not None
            or persist.queues is not None
        ):
            return True
        st.pass_no += 1
        if not await self._persist(persist, plan):
            return False
        self.queues_persisted = st.queues
        if persist.status is not None:
            self.published = published[0]
            # the summary for describe() (no store needed); small, never compressed
            workflow.upsert_memo({c.MEMO_SUMMARY: published[1].model_dump(mode="json")})
        return True

    def _commit(
        self, plan: Plan, status_changed: list[str], written: int, elapsed: float, now: float
    ) -> dict[str, str]:
        """Make the plan the loop's state. Returns the failed rollouts to revert."""
        st = self.st
        st.state_sum = st.state_after(plan)
        st.bindings = plan.bindings
        st.carry = plan.carry
        st.jobs_changed = {}
        st.pending = plan.pending
        st.deferred = plan.deferred
        st.failures = plan.failures
        st.preemptions, st.recent_preemptions = st.preemptions_after(plan)
        st.commit_rollouts(plan, status_changed, now, checks=True)
        self.dirty = batch.settle(st, now) or self.dirty  # (it clears ``failed``)
        st.status_updates = {}
        # (freed: only a pass that preempted, so only under PREEMPTION)
        st.capacity_changed = plan.freed
        self.queue.planned = written
        st.passes += 1
        # what a worker taking the run over replays: the passes' work
        self.replay_cost += plan.work
        st.last_pass_at = now
        st.last_pass = views.pass_text(st.passes, plan)
        if plan.deferred or plan.again or plan.freed:  # (again: only under DISRUPTION_BUDGETS)
            self.dirty = True
        self._record(plan, elapsed)
        self._details()
        return plan.rollouts.revert if plan.rollouts is not None else {}

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
        if self.adaptive:
            with workflow.unsafe.sandbox_unrestricted():  # the activity hands it back
                seconds = clocks.plan_clock() - self.plan_started
            timed: dict[str, float] = {"plan_seconds": round(seconds, 4)}
            if self.replay_timed:
                timed["work_seconds"] = round(self.st.unrecorded, 4)
                self.st.unrecorded = 0.0
            persist = persist.model_copy(update=timed)
        try:
            result = await acts.persist(persist, summary=summary)
        except acts.LoopActivityFailed as err:  # what is not handled fails the task
            if err.cause_type == errors.STALE_FENCE:
                # Another run persisted a newer pass (a reset, a second starter):
                # our view is stale. Reload from the store and plan again.
                workflow.logger.warning("stale fence; reloading state from the store")
                await self._bootstrap(self.pass_now if self.intake else workflow.now().timestamp())
                self.dirty = True
                return False
            raise
        if result.digest != expected:
            raise DivergenceError(
                f"pass {persist.pass_no}: store applied digest {result.digest}, this code "
                f"planned {expected}; workflow code changed without workflow.patched?"
            )
        if self.replay_timed:  # recorded figures only: a replay counts the same
            self.replay_seconds += (result.plan_seconds or 0.0) + (result.work_seconds or 0.0)
        if self.adaptive and result.plan_seconds is not None:
            # from history, never this worker's clock: a replay plans the same passes
            self.st.pass_budget = next_budget(
                self.budget_used,
                result.plan_seconds,
                deferred=plan.deferred > 0,
                ceiling=self.st.max_work or MAX_WORK,
                to_target=self.to_target,
            )
        return True

    async def _write_jobs(self, *, from_empty: bool) -> None:
        st = self.st
        started = worker_clock()
        queue, ticket = self.queue.take()
        write = ac.WriteJobsIn(
            cluster=st.cluster,
            put=[j for j in queue.values() if j is not None],
            delete=[i for i, j in queue.items() if j is None],
        )
        st.unrecorded += worker_clock() - started
        if self.local_writes:
            out = await acts.write_jobs_local(write)
        else:  # recorded before it: the specs were the activity's recorded input
            out = await acts.write_jobs(write)
        started = worker_clock()
        loading.take_own_writes(st, queue, out.revision, out.missing, from_empty=from_empty)
        st.unrecorded += worker_clock() - started
        self.st.known_revision = max(self.st.known_revision, out.revision)
        self.queue.written = ticket

    def _ensure_watch(self) -> None:
        if self.st.opts.watch:
            self.watch.ensure(self.st.watch_input())

    # -- continue-as-new ---------------------------------------------------------------
    def _continue_as_new_now(self) -> bool:
        # Handlers first: an update waiting for a pass must see it before we go.
        return self._continue_as_new_due() and workflow.all_handlers_finished()
