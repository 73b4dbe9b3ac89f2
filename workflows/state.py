"""The loop's state: built from the checkpoint a run starts with, saved to the one
it hands the next.

Nodes, jobs and bindings are not in the checkpoint: every pass persists them to the
store, and a new run reloads them in pages (``workflows.loading``), so the
checkpoint does not grow with the cluster. What a pass decides from is here; what
only the running loop needs (its queue, its watch, its wake-ups) stays on the workflow.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from forge import clocks
    from forge.core.autoscale import AutoscaleState, next_due
    from forge.core.models import AssignmentStatus, Job, Node, NodeState
    from forge.core.placement import Binding
    from forge.core.quota import QueueSpec
    from forge.core.reconcile import Carry, FailureHistory, PendingEntry, Plan
    from forge.core.rolling import GroupRollout
    from forge.core.sharing import SharedGroups
    from forge.stores.base import STATE_MOD, binding_hash, group_of
    from forge.wire import activity_contract as ac
    from forge.wire import contract as c
    from forge.wire import views

__all__ = ["LoopState", "binding_from_row", "binding_row", "hash_binding", "worker_clock"]
_NO_WAKE = ("deferred", "failed", "queued")  # no clock ends these: a pass or a change does
_CLOCKS = (("batch_started", "active_deadline"), ("batch_finished", "ttl_after_finished"))


@dataclass(eq=False)
class LoopState:
    cluster: str
    opts: c.ClusterOptions
    runs: int = 1
    generation: int = 1
    pass_no: int = 0  # the last persisted pass of this generation (the fence)
    passes: int = 0  # passes of this run
    nodes: dict[str, Node] = field(default_factory=dict)
    jobs: dict[str, Job] = field(default_factory=dict)
    jobs_revision: int = 0  # the store revision self.jobs reflects (0: reload all)
    known_revision: int = 0  # the newest revision heard of (watch, own writes)
    bindings: dict[str, Binding] = field(default_factory=dict)
    pending: dict[str, PendingEntry] = field(default_factory=dict)
    deferred: int = 0  # replicas a budgeted pass left for the next, not listed
    failures: dict[str, FailureHistory] = field(default_factory=dict)
    autoscale: dict[str, AutoscaleState] = field(default_factory=dict)
    autoscale_evaluated: dict[str, float] = field(default_factory=dict)
    reports_seq: int = 0
    known_reports_seq: int = 0
    last_resync: float = 0.0
    capacity_changed: bool = True
    failed: dict[str, None] = field(default_factory=dict)  # workloads reported failed
    status_updates: dict[str, str] = field(default_factory=dict)  # since the last persist
    signals_dropped: int = 0
    last_dropped: str = ""
    state_sum: int = 0  # binding_hash summed over self.bindings
    # the last pass's allocations and indexes (Carry): None after a (re)load
    carry: Carry | None = None
    last_pass: str = "not yet run"
    last_pass_at: float | None = None
    # rolling updates (under the rollouts patch): each group's rollout ("job/group"),
    # when its replicas' health began, groups promoted since the last pass, and when
    # a rollout's answer changes by itself (a health clock, a deadline, the stagger)
    rollouts: dict[str, GroupRollout] = field(default_factory=dict)
    since: dict[str, float] = field(default_factory=dict)
    promoted: dict[str, None] = field(default_factory=dict)
    rollout_wake: float | None = None
    rollout_waiting: dict[str, str] = field(default_factory=dict)  # why, for the details
    # health checks (rollouts-3): the check verdicts of rolling groups' replicas
    # (False from placement until the agent reports it passed), and the replicas
    # whose verdict the reports changed since the last pass
    health: dict[str, bool] = field(default_factory=dict)
    health_changed: dict[str, None] = field(default_factory=dict)
    # a pass's work budget set by the watchdog's loop_budget signal (0: the default)
    max_work: int = 0
    # the budget the recorded timings of the last passes give the next (0: the
    # default; forge.core.budget, under the adaptive-budget patch)
    pass_budget: int = 0
    # the jobs whose object may have changed since the last pass (None: any may
    # have, compare them all), so a pass never walks every job to find out
    jobs_changed: dict[str, None] | None = None
    autoscaled: dict[str, None] = field(default_factory=dict)  # with an autoscaled group
    # one object per distinct group spec, shared by the jobs that have it: the
    # cluster's jobs cost a record each, not a dozen tracked objects (kept per run)
    shared: SharedGroups = field(default_factory=SharedGroups)
    # seconds of workflow work (updates parsed, pages loaded) measured since the last
    # persist, which carries them into history (workflows.patches.REPLAY_SECONDS);
    # a measurement, never read for a decision until the activity hands it back
    unrecorded: float = 0.0
    # replicas preempted so far, and the most recent preemptions (status, explain)
    preemptions: int = 0
    recent_preemptions: list[c.PreemptionView] = field(default_factory=list)
    # runs the watchdog reset (its loop_reset signal), the last one's cause and the
    # run it left (a second report of that reset counts once)
    resets: int = 0
    last_reset: str = ""
    last_reset_run: str = ""
    # batch jobs (workflows.batch): their ids, kept with ``jobs``; each group's done
    # ordinals (from the store at a run's start, then from reports); the replicas
    # that completed since the last pass; gang members that exited 0 while the rest
    # of their gang runs (by the node they ran on)
    batch: dict[str, None] = field(default_factory=dict)
    done: dict[tuple[str, str], set[int]] = field(default_factory=dict)
    completed: dict[str, None] = field(default_factory=dict)
    exited: dict[str, str] = field(default_factory=dict)
    batch_failed: dict[str, str] = field(default_factory=dict)  # job -> run: why
    why_failed: dict[str, str] = field(default_factory=dict)  # this pass's: run -> message
    batch_ended: dict[str, None] = field(default_factory=dict)  # failed: none bound now
    batch_tolerated: dict[str, dict[str, int]] = field(default_factory=dict)  # max_failed
    batch_started: dict[str, float] = field(default_factory=dict)  # active_deadline's start
    batch_timing: dict[str, None] = field(default_factory=dict)  # deadlines to start
    batch_finished: dict[str, float] = field(default_factory=dict)  # ttl_after_finished's
    batch_check: dict[str, None] = field(default_factory=dict)  # finished? (this pass)
    batch_removed: dict[str, c.JobState] = field(default_factory=dict)  # by their ttl
    batch_ends: bool = False  # the failed-batch-job-ends patch, asked each pass
    queues: dict[str, QueueSpec] = field(default_factory=dict)  # by name (workflows.queues)

    @classmethod
    def start(cls, inp: c.ClusterInput) -> LoopState:
        cp = inp.checkpoint
        if cp is None:
            return cls(cluster=inp.cluster, opts=inp.options)
        return cls(
            cluster=inp.cluster,
            opts=inp.options,
            runs=cp.runs + 1,
            generation=cp.generation + 1,
            pending=dict(cp.pending),
            failures=dict(cp.failures),
            autoscale=dict(cp.autoscale),
            autoscale_evaluated=dict(cp.autoscale_evaluated),
            reports_seq=cp.reports_seq,
            known_reports_seq=cp.reports_seq,
            last_resync=cp.last_resync,
            capacity_changed=False,
            signals_dropped=cp.signals_dropped,
            last_dropped=cp.last_dropped,
            rollouts=dict(cp.rollouts),
            since=dict(cp.since),
            health=dict(cp.health),
            max_work=cp.max_work,
            preemptions=cp.preemptions,
            recent_preemptions=list(cp.recent_preemptions),
            pass_budget=cp.pass_budget,
            resets=cp.resets,
            last_reset=cp.last_reset,
            last_reset_run=cp.last_reset_run,
            exited=dict(cp.exited),
            batch_failed=dict(cp.batch_failed),
            batch_ended=dict(cp.batch_ended),
            batch_tolerated={j: dict(g) for j, g in cp.batch_tolerated.items()},
            batch_started=dict(cp.batch_started),
            batch_finished=dict(cp.batch_finished),
            batch_removed=dict(cp.batch_removed),
            queues=dict(cp.queues),
            # a rollout's clocks are reconsidered by the first pass of the new run
            rollout_wake=0.0 if cp.rollouts else None,
        )

    def checkpoint(self) -> c.Checkpoint:
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
            rollouts=self.rollouts,
            since=self.since,
            health=self.health,
            max_work=self.max_work,
            preemptions=self.preemptions,
            recent_preemptions=self.recent_preemptions,
            pass_budget=self.pass_budget,
            resets=self.resets,
            last_reset=self.last_reset,
            last_reset_run=self.last_reset_run,
            exited=self.exited,
            batch_failed=self.batch_failed,
            batch_ended=self.batch_ended,
            batch_tolerated=self.batch_tolerated,
            batch_started=self.batch_started,
            batch_finished=self.batch_finished,
            batch_removed=self.batch_removed,
            queues=self.queues,
        )

    def watch_input(self) -> ac.WatchIn:
        """The store watch from what the loop has seen (or heard of)."""
        return ac.WatchIn(
            cluster=self.cluster,
            jobs_revision=max(self.jobs_revision, self.known_revision),
            reports_seq=max(self.reports_seq, self.known_reports_seq),
            heartbeat_ttl=self.opts.heartbeat_ttl,
            max_seconds=self.opts.watch_seconds,
            poll=self.opts.watch_poll,
        )

    def next_wake(self, now: float) -> tuple[float, str]:
        """The earliest deadline (backoff expiry, autoscale tick, resync), and why."""
        wake: float | None = None
        why = ""
        # A deadline that passed while the last pass persisted is still one: a pass at once
        for e in self.pending.values():
            if e.kind not in _NO_WAKE and (wake is None or e.not_before < wake):
                wake, why = e.not_before, f"{e.kind} expiry"
        for job_id in sorted(self.autoscaled):
            job = self.jobs[job_id]
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
        if self.rollout_wake is not None and (wake is None or self.rollout_wake < wake):
            wake, why = self.rollout_wake, "rollout"
        for since, name in _CLOCKS:  # batch jobs with a deadline or a time to live
            for job_id, t0 in getattr(self, since).items():
                limit = getattr(self.jobs.get(job_id), name, None)
                if limit is not None and (wake is None or t0 + limit < wake):
                    wake, why = t0 + limit, name.replace("_", " ")
        resync = self.last_resync + self.opts.resync_seconds
        if wake is None or resync < wake:
            return resync, "job resync"
        return wake, why

    def drop_cluster(self) -> None:
        """Let go of the nodes, jobs and bindings as this run ends (continue-as-new):
        the run's instance is held in reference cycles (its tasks, its handlers), so
        whatever hangs off it waits for a full collection; what is let go here is
        freed at once instead (it is acyclic), and no collection walks it."""
        self.nodes, self.jobs, self.bindings = {}, {}, {}
        self.pending, self.failures, self.health, self.since = {}, {}, {}, {}
        self.carry = None
        self.autoscaled = {}
        self.shared = SharedGroups()

    def job_changed(self, job_id: str, job: Job | None) -> None:
        """Note a job put (or deleted: None) into ``jobs`` outside a load."""
        if self.jobs_changed is not None:
            self.jobs_changed[job_id] = None
        if job is not None and any(g.autoscale is not None for g in job.groups):
            self.autoscaled[job_id] = None
        else:
            self.autoscaled.pop(job_id, None)

    def apply(self, op: c.NodeOp, upsert: dict[str, Node], remove: dict[str, None]) -> None:
        """Apply a node operation, noting what the pass must persist."""
        if isinstance(op, c.RegisterOp):
            node = op.node
            old = self.nodes.get(node.id)
            if old is not None and old == node:
                node = old  # the same object: the next pass has nothing to re-check here
            self.nodes[node.id] = node
            remove.pop(node.id, None)
            upsert[node.id] = node
            if old is None or old != node:
                self.capacity_changed = True
            return
        existing = self.nodes.get(op.node_id)
        if existing is None:
            workflow.logger.info("ignoring %s for unknown node %s", op.op, op.node_id)
            return
        if isinstance(op, c.RemoveOp):
            del self.nodes[op.node_id]
            upsert.pop(op.node_id, None)
            remove[op.node_id] = None
            return
        state = NodeState.LOST if isinstance(op, c.LostOp) else NodeState.DRAINING
        if existing.state is state or existing.state is NodeState.LOST:
            return
        changed = existing.model_copy(update={"state": state})
        self.nodes[op.node_id] = changed
        upsert[op.node_id] = changed

    def commit_rollouts(
        self, plan: Plan, running: list[str], now: float, checks: bool = False
    ) -> None:
        """Keep what the pass decided about rollouts; ``since`` (and, with
        ``checks``, ``health``) only for the replicas of groups still rolling (they
        must not grow with the cluster)."""
        rp = plan.rollouts
        if rp is None:
            return
        r = self.rollouts = rp.rollouts
        self.rollout_wake = rp.wake
        self.rollout_waiting = {
            k: s.waiting
            for k, s in rp.steps.items()
            if k in rp.rollouts and not rp.rollouts[k].failed and s.waiting
        }
        # promoted since the pass began (a promote update that arrived while it
        # persisted) waits for the next pass; the rest this pass took in
        self.promoted = {k: None for k in self.promoted if k in r and not r[k].rollout.promoted}
        since = dict(self.since)
        for w, _ in plan.released:
            since.pop(w, None)
        for b in plan.placed:
            since[b.workload_id] = now
        for w in running:
            since[w] = now
        self.since = {w: t for w, t in since.items() if group_of(w) in self.rollouts}
        self.health_changed = {}
        if not checks:
            return
        health = dict(self.health)
        for w, _ in plan.released:
            health.pop(w, None)
        for b in plan.placed:
            health[b.workload_id] = False  # healthy once the agent says its check passed
        self.health = {w: v for w, v in health.items() if group_of(w) in self.rollouts}

    def take_health(self, now: float) -> None:
        """Verdicts heard since the last pass: a replica's health begins now."""
        for w in self.health_changed:
            if w in self.health:
                self.since[w] = now

    def state_after(self, plan: Plan) -> int:
        """The bindings hash after ``plan``, from its changes alone."""
        total = self.state_sum
        for b in plan.dropped:
            total -= hash_binding(b)
        for b in plan.placed:
            total += hash_binding(b)
        return total % STATE_MOD

    def preemptions_after(self, plan: Plan) -> tuple[int, list[c.PreemptionView]]:
        """The preemption count and the recent ones once ``plan`` is committed."""
        if not plan.preemptions:
            return self.preemptions, self.recent_preemptions
        total = self.preemptions + sum(len(p.victims) for p in plan.preemptions)
        recent = [*self.recent_preemptions, *views.preemption_views(plan)]
        return total, recent[-c.RECENT_PREEMPTIONS :]

    def notices(self) -> list[str]:
        out = []
        if self.signals_dropped:
            out.append(f"{self.signals_dropped} signal(s) dropped; last: {self.last_dropped}")
        if self.max_work:
            out.append(f"pass budget lowered to {self.max_work:,} units after a deadlock")
        return out


def hash_binding(b: Binding) -> int:
    return binding_hash(b.job, b.group, b.ordinal, b.node, b.gpu_ids, b.cpu, b.memory)


def binding_row(b: Binding) -> ac.BindRow:
    row = (b.job, b.group, b.ordinal, b.node, b.gpu_ids, b.cpu, b.memory, str(b.status))
    if b.version:  # rolling updates: the version rides at the end, after the share
        return (*row, b.gpu_milli, b.version)
    return (*row, b.gpu_milli) if b.gpu_milli else row


#: A stored status by its text (a dict lookup; the enum's own lookup is slower).
_STATUS = {s.value: s for s in AssignmentStatus}


def binding_from_row(row: ac.BindRow | ac.LoadedRow) -> Binding:
    job, group, ordinal, node, gpu_ids, cpu, mem, status = row[:8]
    return Binding(
        job,
        group,
        ordinal,
        node,
        tuple(gpu_ids),
        cpu,
        mem,
        _STATUS[status],
        gpu_milli=row[8] if len(row) > 8 else 0,
        version=str(row[-1]) if len(row) == 10 else "",
    )


def worker_clock() -> float:
    """The worker's clock, for measurements only: what they feed a decision comes
    back through an activity's result, so a replay reads the recorded figure."""
    with workflow.unsafe.sandbox_unrestricted():
        return clocks.plan_clock()
