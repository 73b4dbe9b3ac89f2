"""The cluster workflow's signals, updates and queries, and the state they share
with the loop.

:class:`ClusterWorkflow` inherits them (Temporal collects handlers from the class's
bases), so this module is the workflow's interface and ``workflows.cluster`` its
loop. Handlers never do I/O: they queue work (node operations, job writes) for the
next pass and, when the caller asked to wait, wait for the pass that planned it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from temporalio import workflow
from temporalio.common import RawValue

from workflows import queues
from workflows.batch import done_of, scale_group
from workflows.inputs import (
    Payload,
    busy,
    json_size,
    not_found,
    parse,
    parse_batch,
    refuse,
    refuse_bad_jobs,
    update_arg,
)
from workflows.mail import (
    Budget,
    Dropped,
    Failed,
    Item,
    JobWrite,
    Mail,
    NodeOps,
    Promote,
    Reset,
)
from workflows.queue import JobQueue
from workflows.queues import QueueWrite
from workflows.state import LoopState, worker_clock

with workflow.unsafe.imports_passed_through():
    from forge.core.models import MAX_BATCH_BYTES, Job, NodeState, workload_id
    from forge.wire import contract as c
    from forge.wire import views

__all__ = ["PATCH_DROPPED_SIGNALS", "Handlers"]

#: What one submitted job costs a replay (parsed from the update, written to the
#: store), in pass work units: measured ~0.2 ms a job against ~1 us a unit.
JOB_UNITS = 200

#: A dropped signal (bad payload, unknown name) is counted and published by a pass.
#: Folded into the baseline (no longer branched on); the name stays for importers.
PATCH_DROPPED_SIGNALS = "dropped-signals-1"
LOGGED_ITEMS = 20  # rejected items of one register_node signal logged one by one


class Handlers(queues.QueueHandlers):
    def __init__(self, inp: c.ClusterInput) -> None:
        self.st = LoopState.start(inp)
        self.queues_persisted = self.st.queues  # as the store holds them (workflows.queues)
        self.queue = JobQueue()
        self.inbox: list[c.NodeOp] = []  # node operations for the next pass
        self.ready = False  # the state is loaded: handlers may act on it
        self.dirty = True  # a pass is due
        # Replicas examined by this run's passes: a worker that takes the workflow
        # over replays every pass, so the run ends before replay gets slow.
        self.replay_cost = 0
        # The recorded seconds of this run's workflow work (workflows.patches.
        # REPLAY_SECONDS: on once a pass has asked; the handlers read the flag)
        self.replay_seconds = 0.0
        self.replay_timed = False
        self.updates = 0  # accepted in this run
        # update id -> the batch and its jobs' JSON sizes, as the validator parsed them:
        # a memo of a pure parse (a replay, which runs no validator, parses again and
        # gets the same), never state a decision reads
        self._validated: dict[str, tuple[c.SubmitJobs, list[int]]] = {}
        # Handlers post to the mail and the loop takes it at recorded intakes
        # (workflows.mail); runs recorded before it let handlers change the state.
        # The workflow asks in its first activation, before any handler runs.
        self.mail = Mail()
        self.intake = False

    def _continue_as_new_due(self) -> bool:
        info, opts = workflow.info(), self.st.opts
        limit = opts.max_passes_per_run
        return (
            info.is_continue_as_new_suggested()
            or info.get_current_history_length() >= opts.max_history_events
            or info.get_current_history_size() >= opts.max_history_bytes
            or self.replay_cost >= opts.max_replay_cost
            or (self.replay_timed and self.replay_seconds >= opts.max_replay_seconds)
            or self.updates >= opts.max_updates_per_run  # the server refuses past 2,000
            or bool(limit and self.st.passes >= limit)
        )

    # -- signals: parsed here, never refused (see workflows.inputs) -----------------------
    @workflow.signal(name=c.SIGNAL_REGISTER_NODE)
    def register_node(self, *args: Any) -> None:
        """Registers every valid node of the batch; each invalid one is reported
        (by id and field) through the dropped-signal notice, never the whole batch."""
        name = c.SIGNAL_REGISTER_NODE
        batch = parse_batch(c.RegisterNodes, "nodes", args)
        kept = batch.value.nodes if batch.value is not None else []
        if kept:
            self._post(NodeOps(tuple(c.RegisterOp(node=node) for node in kept)))
        if batch.problem:
            self._dropped(name, batch.problem)
        elif batch.rejected:
            for line in batch.rejected[:LOGGED_ITEMS]:
                workflow.logger.warning("%s: node dropped: %s", name, line[:500])
            shown = "; ".join(f"node {line}" for line in batch.rejected)
            total = len(kept) + len(batch.rejected)
            self._dropped(name, f"{len(batch.rejected)} of {total} nodes dropped: {shown}")

    @workflow.signal(name=c.SIGNAL_REMOVE_NODE)
    def remove_node(self, *args: Any) -> None:
        req = self._signal(c.SIGNAL_REMOVE_NODE, c.NodeRef, args)
        if req is not None:
            self._post(NodeOps((c.RemoveOp(node_id=req.node_id),)))

    @workflow.signal(name=c.SIGNAL_NODE_LOST)
    def node_lost(self, *args: Any) -> None:
        req = self._signal(c.SIGNAL_NODE_LOST, c.NodeRef, args)
        if req is not None:
            self._post(NodeOps((c.LostOp(node_id=req.node_id),)))

    @workflow.signal(name=c.SIGNAL_LOOP_BUDGET)
    def loop_budget(self, *args: Any) -> None:
        """The watchdog lowers the pass budget after repeated deadlocks (it resets
        the run first): kept for this run and those it continues as."""
        req = self._signal(c.SIGNAL_LOOP_BUDGET, c.LoopBudget, args)
        if req is not None:
            self._post(Budget(req.max_work))

    @workflow.signal(name=c.SIGNAL_LOOP_RESET)
    def loop_reset(self, *args: Any) -> None:
        """The watchdog reset a stuck run into this one: counted through
        continue-as-new and shown by ``forge status`` and the Web UI's details."""
        req = self._signal(c.SIGNAL_LOOP_RESET, c.LoopReset, args)
        if req is not None:
            self._post(Reset(req.from_run, req.cause))

    @workflow.signal(dynamic=True)
    def unknown_signal(self, name: str, args: Sequence[RawValue]) -> None:
        """A signal no handler knows (a misspelt name): recorded, never raised."""
        self._dropped(
            name,
            "unknown signal (known: register_node, remove_node, node_lost, loop_budget, "
            "loop_reset)",
        )

    def _signal(self, name: str, model: type[Payload], args: tuple[Any, ...]) -> Payload | None:
        parsed = parse(model, args)
        if isinstance(parsed, str):
            self._dropped(name, parsed)
            return None
        return parsed

    def _dropped(self, name: str, problem: str) -> None:
        """A signal could not be used: the sender cannot be told (signals are not
        answered), so it is logged, counted and shown (details, status) instead."""
        workflow.logger.warning("dropping %s signal: %s", name, problem[:500])
        workflow.metric_meter().create_counter(
            "forge_signals_dropped_total", "signals dropped: unknown name or bad payload"
        ).add(1, {"signal": name[:64]})
        self._post(Dropped(name, problem))  # the next pass publishes it

    # -- the mail: what handlers bring, applied by the loop -------------------------------
    def _post(self, item: Item) -> int:
        """Hand ``item`` to the loop: posted for its next intake (returns the item's
        number), or, in a run recorded before intakes, applied at once (returns 0)."""
        if self.intake:
            return self.mail.post(item)
        self._apply(item)
        return 0

    def _apply(self, item: Item) -> None:
        """Make ``item`` part of the loop's state (at an intake, or from the handler in
        a run recorded before intakes): exactly what the handlers used to do."""
        st = self.st
        if isinstance(item, JobWrite):
            self._queue_job(item.job_id, item.job)
        elif isinstance(item, NodeOps):
            self.inbox.extend(item.ops)
        elif isinstance(item, Failed):
            st.failed.update(dict.fromkeys(self._accepted(item)))
            self.dirty = True
        elif isinstance(item, Promote):
            st.promoted.update(dict.fromkeys(item.names))
            self.dirty = True
        elif isinstance(item, Budget):
            st.max_work = item.max_work
            self.dirty = True
        elif isinstance(item, QueueWrite):
            queues.apply(st, item)
            self.dirty = True
        elif isinstance(item, Reset):
            if item.from_run != st.last_reset_run:  # racing watchdogs report one reset
                st.resets += 1
                st.last_reset = item.cause[:300]
                st.last_reset_run = item.from_run
                self.dirty = True
        else:
            st.signals_dropped += 1
            st.last_dropped = f"{item.name}: {item.problem}"[:300]
            self.dirty = True

    def _accepted(self, item: Failed) -> list[str]:
        """The reported replicas still bound where the sender saw them: keyed by the
        binding, so a report replayed after a reset cannot restart a replica that
        has moved since."""
        on = dict(item.on)
        out = []
        for wid in item.workload_ids:
            b = self.st.bindings.get(wid)
            if b is not None and on.get(wid, b.node) == b.node:
                out.append(wid)
        return out

    def _current(self, job_id: str) -> Job | None:
        """The job as it will be once everything posted and queued is written."""
        posted, job = self.mail.current(job_id)
        if posted:
            return job
        return self.queue.current(job_id, self.st.jobs)

    async def _planned(self, seq: int) -> None:
        """Wait until a pass has planned with mail item ``seq`` (0: the next pass)."""
        if seq:
            await workflow.wait_condition(lambda: self.mail.planned >= seq)
        else:
            await self._next_pass()

    # -- updates ------------------------------------------------------------------------
    @workflow.update(name=c.UPDATE_SUBMIT_JOB)
    async def submit_job(self, raw: RawValue) -> c.JobResult:
        req = update_arg(c.SubmitJob, raw)
        self.updates += 1
        self.replay_cost += JOB_UNITS
        await workflow.wait_condition(lambda: self.ready)
        size = json_size(req.job)
        if self.intake:
            seq = self.mail.post(JobWrite(req.job.id, req.job, size))
            await self._backpressure(seq, wait=req.wait)
            return self._result(req.job.id)
        await self.queue.reserve(size)
        ticket = self._queue_job(req.job.id, req.job)
        return await self._settle(req.job.id, ticket, wait=req.wait)

    @submit_job.validator
    def _validate_submit(self, raw: RawValue) -> None:
        self._refuse_if_busy()  # first: a refused update costs no parse
        req = update_arg(c.SubmitJob, raw)
        # Jobs may arrive before any node: they wait, pending, with reasons.
        if not req.job.groups:
            raise refuse("job has no groups")
        refuse_bad_jobs([req.job], self.st.queues)

    @workflow.update(name=c.UPDATE_SUBMIT_JOBS)
    async def submit_jobs(self, raw: RawValue) -> list[c.JobResult]:
        started = worker_clock()
        info = workflow.current_update_info()
        seen = self._validated.pop(info.id, None) if info is not None else None
        # parsed by the validator (this worker accepted it), else here (a replay)
        req, sizes = seen if seen is not None else (update_arg(c.SubmitJobs, raw), None)
        self.updates += 1
        # what replaying this batch costs a worker taking the run over (parsing it,
        # writing it): counted like a pass's work, so a run of submissions ends
        # (continue-as-new) before its replay gets long
        self.replay_cost += JOB_UNITS * len(req.jobs)
        if sizes is None:  # not validated by this worker (a replay): the same sizes
            sizes = [json_size(j) for j in req.jobs]
        # the handler's own work, recorded by the next persist (a replay does it too)
        self.st.unrecorded += worker_clock() - started
        await workflow.wait_condition(lambda: self.ready)
        if self.intake:
            seqs = [
                self.mail.post(JobWrite(j.id, j, n)) for j, n in zip(req.jobs, sizes, strict=True)
            ]
            await self._backpressure(seqs[-1], wait=req.wait)
            return [self._result(j.id) for j in req.jobs]
        await self.queue.reserve(sum(sizes))
        tickets = [self._queue_job(j.id, j) for j in req.jobs]
        if req.wait:
            await workflow.wait_condition(lambda: self.queue.planned >= tickets[-1])
        return [
            await self._settle(j.id, t, wait=False) for j, t in zip(req.jobs, tickets, strict=True)
        ]

    @submit_jobs.validator
    def _validate_submit_jobs(self, raw: RawValue) -> None:
        self._refuse_if_busy()  # first: a refused update costs no parse
        req = update_arg(c.SubmitJobs, raw)
        sizes = [json_size(j) for j in req.jobs]
        size = sum(sizes)
        if size > MAX_BATCH_BYTES:
            raise refuse(
                f"{len(req.jobs)} jobs of {size / 1024:,.0f} KiB as JSON in one update; the "
                f"limit is {MAX_BATCH_BYTES // 1024} KiB: send them in smaller batches"
            )
        ids = [j.id for j in req.jobs]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise refuse(f"job ids repeated in one batch: {', '.join(dupes[:5])}")
        refuse_bad_jobs(req.jobs, self.st.queues)
        info = workflow.current_update_info()
        if info is not None:  # accepted: the handler reuses both, no second parse
            self._validated[info.id] = (req, sizes)

    @workflow.update(name=c.UPDATE_SCALE)
    async def scale(self, raw: RawValue) -> c.JobResult:
        req = update_arg(c.ScaleGroup, raw)
        self.updates += 1
        await workflow.wait_condition(lambda: self.ready)
        if self.intake:
            job = self._current(req.job_id)
            if job is None or job.group(req.group) is None:
                raise not_found(f"no group {req.job_id}/{req.group}")
            scaled = scale_group(job, req.group, req.count)
            seq = self.mail.post(JobWrite(req.job_id, scaled, json_size(scaled)))
            await self._backpressure(seq, wait=True)
            return self._result(req.job_id)
        current = self.queue.current(req.job_id, self.st.jobs)
        await self.queue.reserve(json_size(current) if current is not None else 0)
        job = self.queue.current(req.job_id, self.st.jobs)  # again: it may have changed
        if job is None or job.group(req.group) is None:
            raise not_found(f"no group {req.job_id}/{req.group}")
        ticket = self._queue_job(req.job_id, scale_group(job, req.group, req.count))
        return await self._settle(req.job_id, ticket, wait=True)

    @scale.validator
    def _validate_scale(self, raw: RawValue) -> None:
        self._refuse_if_busy()  # first: a refused update costs no parse
        req = update_arg(c.ScaleGroup, raw)
        if not self.ready:
            return  # checked again by the handler once the state is loaded
        job = self._current(req.job_id)
        if job is None:
            raise not_found(f"unknown job {req.job_id!r}")
        if job.group(req.group) is None:
            raise not_found(f"job {req.job_id!r} has no group {req.group!r}")

    @workflow.update(name=c.UPDATE_STOP_JOB)
    async def stop_job(self, raw: RawValue) -> c.JobResult:
        req = update_arg(c.StopJob, raw)
        self.updates += 1
        await workflow.wait_condition(lambda: self.ready)
        if self._current(req.job_id) is None:
            raise not_found(f"unknown job {req.job_id!r}")
        if self.intake:
            seq = self.mail.post(JobWrite(req.job_id, None, 0))
            await self._backpressure(seq, wait=True)
            return self._result(req.job_id)
        ticket = self._queue_job(req.job_id, None)
        return await self._settle(req.job_id, ticket, wait=True)

    @stop_job.validator
    def _validate_stop(self, raw: RawValue) -> None:
        self._refuse_if_busy()  # first: a refused update costs no parse
        req = update_arg(c.StopJob, raw)
        if self.ready and self._current(req.job_id) is None:
            raise not_found(f"unknown job {req.job_id!r}")

    @workflow.update(name=c.UPDATE_DRAIN_NODE)
    async def drain_node(self, raw: RawValue) -> int:
        req = update_arg(c.DrainNode, raw)
        self.updates += 1
        await workflow.wait_condition(lambda: self.ready)
        moving = sum(1 for b in self.st.bindings.values() if b.node == req.node_id)
        seq = self._post(NodeOps((c.DrainOp(node_id=req.node_id),)))
        await self._planned(seq)
        return moving

    @drain_node.validator
    def _validate_drain(self, raw: RawValue) -> None:
        self._refuse_if_busy()  # first: a refused update costs no parse
        req = update_arg(c.DrainNode, raw)
        if not self.ready:
            return
        node = self.st.nodes.get(req.node_id)
        if node is None:
            raise not_found(f"unknown node {req.node_id!r}")
        if node.state is NodeState.LOST:
            raise refuse(f"node {req.node_id!r} is lost; nothing to drain")

    @workflow.update(name=c.UPDATE_REPORT_FAILED)
    async def report_failed(self, raw: RawValue) -> c.ReportFailedResult:
        req = update_arg(c.ReportFailed, raw)
        self.updates += 1
        await workflow.wait_condition(lambda: self.ready)
        item = Failed(tuple(req.workload_ids), tuple(sorted(req.on.items())))
        accepted = len(self._accepted(item))  # as the handler sees it; a pass checks again
        seq = self._post(item)
        await self._planned(seq)
        return c.ReportFailedResult(accepted=accepted)

    @report_failed.validator
    def _validate_report(self, raw: RawValue) -> None:
        self._refuse_if_busy()  # first: a refused update costs no parse
        req = update_arg(c.ReportFailed, raw)
        if not self.ready:
            return
        unknown = [w for w in req.workload_ids if w not in self.st.bindings]
        if unknown:
            shown = ", ".join(unknown[:5]) + (" ..." if len(unknown) > 5 else "")
            raise refuse(f"not bound: {shown}")

    @workflow.update(name=c.UPDATE_PROMOTE)
    async def promote(self, raw: RawValue) -> c.PromoteResult:
        req = update_arg(c.Promote, raw)
        self.updates += 1
        await workflow.wait_condition(lambda: self.ready)
        names = self._promotable(req)  # again: a pass may have ended the rollout since
        seq = self._post(Promote(tuple(names)))
        if seq:
            await self._planned(seq)
        else:  # the pass that planned it takes it out of ``promoted``
            await workflow.wait_condition(lambda: not any(n in self.st.promoted for n in names))
        return c.PromoteResult(promoted=names)

    @promote.validator
    def _validate_promote(self, raw: RawValue) -> None:
        self._refuse_if_busy()  # first: a refused update costs no parse
        req = update_arg(c.Promote, raw)
        if self.ready:
            self._promotable(req)

    def _promotable(self, req: c.Promote) -> list[str]:
        """The groups (``job/group``) of ``req`` whose rollout waits for a promotion;
        refuses, naming what, when there is none."""
        job = self._current(req.job_id)
        if job is None:
            raise not_found(f"unknown job {req.job_id!r}")
        if req.group is not None and job.group(req.group) is None:
            raise not_found(f"job {req.job_id!r} has no group {req.group!r}")
        names: list[str] = []
        for g in job.groups:
            if req.group is not None and g.name != req.group:
                continue
            name = f"{job.id}/{g.name}"
            r = self.st.rollouts.get(name)
            policy = g.update
            canary = policy is not None and policy.canary > 0 and not policy.auto_promote
            if r is not None and not r.failed and not r.rollout.promoted and canary:
                names.append(name)
        if not names:
            what = f"{req.job_id}/{req.group}" if req.group is not None else f"job {req.job_id!r}"
            raise refuse(f"no rollout of {what} waits for a promotion")
        return names

    def _refuse_if_busy(self) -> None:
        """Refuse new updates while this run is due to continue as new.

        The loop continues as new only once it is idle, so a steady stream of updates
        would keep one run growing past the server's limits (2,000 updates, then
        51,200 events): the server then refuses every update. A refused update
        leaves nothing in history and the client retries it, reaching the next run.

        Checked before the argument is parsed: while a run waits to continue as new,
        the in-flight batches of a big submission come back every half second, and
        parsing 1,000 jobs to refuse them took most of the loop's thread (the loop
        it was waiting for then took longer to get idle).
        """
        if self._continue_as_new_due():
            raise busy()

    def _queue_job(self, job_id: str, job: Job | None) -> int:
        """Queue a job write (None deletes) for the next pass; returns its ticket."""
        self.dirty = True
        return self.queue.put(job_id, job)

    async def _next_pass(self) -> None:
        target = self.st.passes + 1
        await workflow.wait_condition(lambda: self.st.passes >= target)

    async def _settle(self, job_id: str, ticket: int, *, wait: bool) -> c.JobResult:
        # Without wait, the update completes once queued: it is durable already (its
        # acceptance is in history; a worker that replays it queues it again), so a
        # burst of submissions is not throttled by Temporal's in-flight update limit.
        if wait:
            await workflow.wait_condition(lambda: self.queue.planned >= ticket)
        return self._result(job_id)

    async def _backpressure(self, seq: int, *, wait: bool) -> None:
        """After posting job write ``seq``: with ``wait``, wait for the pass that
        planned it; else, while more job JSON is posted than one store write takes,
        wait until an intake has taken it (a flood of submissions is held back as
        the queue's reserve held it back before)."""
        if wait:
            await workflow.wait_condition(lambda: self.mail.planned >= seq)
        elif self.mail.bytes > MAX_BATCH_BYTES:
            await workflow.wait_condition(lambda: self.mail.taken >= seq)

    def _result(self, job_id: str) -> c.JobResult:
        job = self.st.jobs.get(job_id)
        desired = bound = 0
        if job is not None:
            for g in job.groups:
                for i in range(g.scaling.desired):
                    desired += 1
                    bound += workload_id(job.id, g.name, i) in self.st.bindings
        return c.JobResult(
            job_id=job_id,
            revision=self.st.jobs_revision,
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
        st = self.st
        return views.status_view(
            self._summary(), st.nodes.values(), st.bindings.values(), st.pending, st.deferred
        )

    @workflow.query(name=c.QUERY_ASSIGNMENTS)
    def assignments(self, q: c.AssignmentsQuery | None = None) -> c.AssignmentsPage:
        # the Web UI runs a query without an argument
        return views.assignments_page(self.st.bindings, q or c.AssignmentsQuery())

    @workflow.query(name=c.QUERY_EXPLAIN)
    def explain(self, wid: str) -> c.Explanation:
        st = self.st
        e = st.pending.get(wid)
        return views.explanation(
            wid,
            binding=st.bindings.get(wid),
            pending=views.pending_views({wid: e})[0][0] if e is not None else None,
            job=st.jobs.get(wid.rsplit("/", 2)[0]),
            nodes=st.nodes.values(),
            bindings=st.bindings.values(),
            preemptions=st.recent_preemptions,
            done=done_of(st, wid),
        )

    def _summary(self) -> c.Summary:
        st = self.st
        return views.loop_summary(
            jobs=st.jobs,
            nodes=len(st.nodes),
            bound=len(st.bindings),
            pending=len(st.pending) + st.deferred,
            passes=st.passes,
            generation=st.generation,
            last_pass_at=st.last_pass_at,
            last_pass=st.last_pass,
        )
