"""What a pass reads from the store, through the activities, into the loop state:
the snapshot a run starts from, job changes, task reports, and metrics for the
autoscaler. Everything is paged: nothing that grows with the cluster crosses
history in one payload.
"""

from __future__ import annotations

from temporalio import workflow

from workflows import activities as acts
from workflows import batch, queues
from workflows.queue import JobQueue
from workflows.state import LoopState, binding_from_row, hash_binding, worker_clock

with workflow.unsafe.imports_passed_through():
    from forge.core.autoscale import AutoscaleState, GroupMetrics, decide, next_due
    from forge.core.models import AssignmentStatus, Job, Node, workload_id
    from forge.core.placement import Binding
    from forge.core.reconcile import Carry
    from forge.stores.base import group_of
    from forge.wire import activity_contract as ac

__all__ = [
    "autoscale",
    "load_bindings",
    "load_jobs",
    "load_nodes",
    "load_reports",
    "put_job",
    "take_own_writes",
]


async def load_nodes(st: LoopState) -> dict[str, Node]:
    nodes: dict[str, Node] = {}
    after = ""
    while True:
        page = await acts.snapshot_nodes(
            ac.PageIn(cluster=st.cluster, after=after, limit=st.opts.snapshot_page)
        )
        started = worker_clock()
        for n in page.nodes:
            nodes[n.id] = n
        st.unrecorded += worker_clock() - started
        if page.next_after is None:
            return nodes
        after = page.next_after


async def load_bindings(st: LoopState, carry: Carry | None) -> tuple[dict[str, Binding], int]:
    """The stored bindings (absorbed into ``carry`` as they arrive, when there is
    one) and their hash, summed page by page: no activation walks every binding."""
    bindings: dict[str, Binding] = {}
    state_sum = 0
    after = ""
    while True:
        rows = await acts.snapshot_assignments(
            ac.PageIn(cluster=st.cluster, after=after, limit=st.opts.snapshot_page)
        )
        started = worker_clock()
        for row in rows.rows:
            b = binding_from_row(row)
            if carry is not None:
                carry.absorb(workload_id(b.job, b.group, b.ordinal), b)
            else:
                bindings[workload_id(b.job, b.group, b.ordinal)] = b
            state_sum += hash_binding(b)
        st.unrecorded += worker_clock() - started
        if rows.next_after is None:
            return bindings, state_sum
        after = rows.next_after


async def load_jobs(st: LoopState, *, starting: bool = False) -> None:
    """Job changes since ``st.jobs_revision`` (all of them from revision 0). At a
    run's start (``starting``) a run without queues takes the store's (a resync
    never does: a deletion of the last queue taken this pass is not persisted yet)."""
    # A full load (from revision 0) fills a fresh map and swaps it in at the
    # end, so the jobs never vanish from the handlers' view while pages arrive.
    full = not st.jobs_revision
    jobs = st.jobs if not full else {}
    if full:
        st.batch = {}  # (their done ordinals stay: reloaded at a run's start only)
    while True:
        page = await acts.job_changes(
            ac.JobChangesIn(cluster=st.cluster, since=st.jobs_revision, limit=st.opts.job_page)
        )
        started = worker_clock()
        # each distinct group of the page shared once, before its jobs are built
        page.groups[:] = [st.shared.group(g) for g in page.groups]
        if starting:
            queues.restore(st, page.queues)
        for job_id, job in page.jobs():
            if not full:
                st.job_changed(job_id, job)
            put_job(st, jobs, job_id, job)
        st.unrecorded += worker_clock() - started
        st.jobs_revision = max(st.jobs_revision, page.revision)
        if not page.more:
            break
    st.jobs = jobs
    st.known_revision = max(st.known_revision, st.jobs_revision)
    if full:  # any job may differ: the next pass compares them all
        st.jobs_changed = None
        st.autoscaled = {
            j.id: None for j in jobs.values() if any(g.autoscale is not None for g in j.groups)
        }


def put_job(st: LoopState, jobs: dict[str, Job], job_id: str, job: Job | None) -> None:
    """One job change into ``jobs`` (None deletes)."""
    batch.track(st, job_id, job, jobs.get(job_id) or st.jobs.get(job_id))
    if job is None:
        jobs.pop(job_id, None)
        return
    job = st.shared.share(job)
    old = jobs.get(job_id)
    if old is not None and old != job:
        # a changed request may fit where the old one did not: backed-off
        # replicas get another try now
        st.capacity_changed = True
    # an unchanged job keeps its object (a full reload too): a pass re-checks only
    # the jobs whose object changed (reconcile.Carry)
    same = old if old is not None else st.jobs.get(job_id)
    jobs[job_id] = same if same is not None and same == job else job


def take_own_writes(
    st: LoopState,
    queue: dict[str, Job | None],
    revision: int,
    missing: list[str],
    *,
    from_empty: bool = False,
) -> bool:
    """After this loop's own job write: when the store's revision moved by exactly
    the writes it made and nothing else was waiting to be loaded, the store holds
    what the loop already has, so the jobs go into the state without reading them
    back (a job spec then crosses history once, in its update). False: load.
    Revision 0 means a full reload is due, unless ``from_empty`` says it is the
    empty store the loop loaded (under the job-writes-local patch: before it, the
    first jobs written were read back)."""
    written = sum(1 for job in queue.values() if job is not None)
    deleted = sum(1 for job_id, job in queue.items() if job is None and job_id not in missing)
    base = st.jobs_revision
    if (not base and not from_empty) or st.known_revision > base:
        return False
    if revision - base != written + deleted:
        return False
    for job_id, job in queue.items():
        if job is None and job_id in missing:
            continue
        st.job_changed(job_id, job)
        put_job(st, st.jobs, job_id, job)
    st.jobs_revision = revision
    return True


async def load_reports(st: LoopState) -> None:
    """Task reports up to the newest heard of: failures to restart, replicas now
    running."""
    while st.known_reports_seq > st.reports_seq:
        out = await acts.read_reports(
            ac.ReportsIn(cluster=st.cluster, seq=st.reports_seq, limit=st.opts.report_page)
        )
        for wid, status in out.statuses:
            b = st.bindings.get(wid)
            if b is None or out.nodes.get(wid, b.node) != b.node:
                continue  # not bound, or about a binding that has moved since
            if status in ("failed", "exited"):
                batch.take_end(
                    st, wid, status, b.node, out.failures.get(wid, ""), out.exit_codes.get(wid)
                )
            elif status == "running" and b.status is AssignmentStatus.PENDING:
                b.status = AssignmentStatus.RUNNING
                st.status_updates = {**st.status_updates, wid: status}
        for wid, ok in out.health.items():
            b = st.bindings.get(wid)
            if b is None or out.nodes.get(wid, b.node) != b.node:
                continue
            if group_of(wid) in st.rollouts and st.health.get(wid) is not ok:
                st.health[wid] = ok  # only rolling groups' replicas: bounded
                st.health_changed[wid] = None
        if out.last_seq <= st.reports_seq:
            break
        st.reports_seq = out.last_seq


async def autoscale(st: LoopState, queue: JobQueue, now: float) -> bool:
    """Evaluate the autoscaled groups that are due; a changed count is queued as a
    job write. True when one was."""
    due: list[tuple[Job, str]] = []
    for job_id in sorted(st.autoscaled):
        job = st.jobs[job_id]
        for g in job.groups:
            if g.autoscale is None:
                continue
            key = f"{job.id}/{g.name}"
            state = st.autoscale.get(key, AutoscaleState())
            if next_due(g.autoscale, state, st.autoscale_evaluated.get(key), now) <= now:
                due.append((job, g.name))
    if not due:
        return False
    out = await acts.metrics(
        ac.MetricsIn(cluster=st.cluster, groups=[f"{j.id}/{g}" for j, g in due])
    )
    queued = False
    for job, gname in due:
        key = f"{job.id}/{gname}"
        group = job.group(gname)
        assert group is not None and group.autoscale is not None
        usage = out.usage.get(key)
        metrics = GroupMetrics(usage[0], usage[1], out.gpu.get(key)) if usage else None
        state = st.autoscale.get(key, AutoscaleState())
        d = decide(group.autoscale, group.scaling, metrics, state, now)
        st.autoscale[key] = d.state
        st.autoscale_evaluated[key] = now
        if d.changed:
            workflow.logger.info("autoscale %s: %s", key, d.reason)
            new_job = st.jobs[job.id].with_desired(gname, d.desired)
            queue.put(job.id, new_job)
            st.jobs[job.id] = new_job
            st.job_changed(job.id, new_job)
            queued = True
    return queued
