"""Batch jobs in the loop: which ends complete a replica, the done ordinals a pass
must not place again, and their record in the store (the rules are
:mod:`forge.core.kinds`'; the pass is :func:`forge.core.reconcile.reconcile`'s).

The store is the record: a completion is written by the persist that releases its
binding, in one transaction, and a run loads them back at its start, so an ordinal
completes at most once whatever happens to the run (kill -9, a takeover, a reset,
continue-as-new). Histories made before batch jobs hold none: every function here
then leaves the loop exactly as it was (no activity, no state), so they replay.
"""

from __future__ import annotations

from collections.abc import Container

from temporalio import workflow

from workflows import activities as acts
from workflows.state import LoopState

with workflow.unsafe.imports_passed_through():
    from forge.core.kinds import ending, fatal
    from forge.core.models import Job, workload_id
    from forge.core.plan import FailureHistory, PendingEntry, Plan
    from forge.core.releasing import COMPLETE
    from forge.core.visiting import Done
    from forge.wire import activity_contract as ac
    from forge.wire import contract as c

__all__ = [
    "REMOVED_KEPT",
    "SCALE_KEEPS_MAX_FAILED",
    "completions",
    "deadlines",
    "done_of",
    "end",
    "expired",
    "failures",
    "for_pass",
    "load_done",
    "scale_group",
    "settle",
    "state_of",
    "take_end",
    "track",
]

#: ``forge job scale`` keeps a batch group's ``scaling.max_failed`` (it reset it to
#: 0 before). Asked only when scaling a group that has one, so no other history
#: records it (hence not among the loop's ids in workflows/patches.py).
SCALE_KEEPS_MAX_FAILED = "scale-keeps-max-failed"


def scale_group(job: Job, group: str, count: int) -> Job:
    """``job`` with ``group`` scaled to ``count`` (an update handler's, in the task
    that runs it: a patch marker is recorded there)."""
    g = job.group(group)
    if g is None or not g.scaling.max_failed:
        return job.with_desired(group, count)
    return job.with_desired(group, count, keep=workflow.patched(SCALE_KEEPS_MAX_FAILED))


def track(st: LoopState, job_id: str, job: Job | None, old: Job | None = None) -> None:
    """Keep ``st.batch`` (the batch jobs' ids) with the jobs; a deleted batch job's
    done ordinals go with it (the store deletes its completions with the job). A
    failed job whose spec changes is tried again (as Nomad runs a dead batch job's
    new version): its runs not complete may run, each with a fresh history."""
    if job is not None:
        st.batch_removed.pop(job_id, None)  # the id is a job again
    if job is not None and job.type == "batch":
        st.batch[job_id] = None
        ended = job_id in st.batch_failed or job_id in st.batch_tolerated
        if st.batch_ends and old is not None and old != job and ended:
            _forget_failed(st, job_id, old)
        if job.active_deadline is not None and job_id not in st.batch_started:
            st.batch_timing[job_id] = None  # its clock starts at the next pass
        if old != job and (job.ttl_after_finished is not None or job_id in st.batch_finished):
            st.batch_check[job_id] = None  # finished or not: seen after the pass
        return
    if st.batch.pop(job_id, 0) is None:
        if (job_id in st.batch_failed or job_id in st.batch_tolerated) and old is not None:
            _forget_failed(st, job_id, old)  # (a service of that id starts afresh)
        st.batch_failed.pop(job_id, None)
        st.batch_ended.pop(job_id, None)
        st.batch_tolerated.pop(job_id, None)
        st.batch_started.pop(job_id, None)
        st.batch_timing.pop(job_id, None)
        st.batch_finished.pop(job_id, None)
        for key in [k for k in sorted(st.done) if k[0] == job_id]:
            del st.done[key]


def _forget_failed(st: LoopState, job_id: str, old: Job) -> None:
    """A failed job (or one with runs failed within ``max_failed``) changed or went:
    it is failed no more, and its runs' histories (fatal marks included) go, so what
    comes next starts afresh."""
    st.batch_failed.pop(job_id, None)
    st.batch_ended.pop(job_id, None)
    st.batch_tolerated.pop(job_id, None)
    st.batch_started.pop(job_id, None)  # a new try: a new deadline
    for g in old.groups:
        for ordinal in range(g.scaling.desired):
            st.failures.pop(workload_id(job_id, g.name, ordinal), None)


def take_end(
    st: LoopState, wid: str, status: str, node: str, why: str = "", code: int | None = None
) -> None:
    """A replica ended (``failed`` or ``exited``): a failure to restart, or a batch
    run complete. A gang's member that completed waits for the rest: the gang
    completes whole, or is restarted whole when a member fails. A batch run's
    failure keeps its agent's message (its exit status) for this pass's
    :func:`failures`; one whose exit status its group lists in ``fail_on_exit`` is
    marked fatal in its failure history, which the pass reads: never retried."""
    job_id, group, _ = wid.rsplit("/", 2)
    job = st.jobs.get(job_id) if st.batch else None
    g = job.group(group) if job is not None else None
    if job is None or ending(job.type, status) != "complete":
        st.failed[wid] = None
        if job is not None and job.type == "batch" and why:
            st.why_failed[wid] = why
        if job and g and (dead := fatal(job.type, g.reschedule.fail_on_exit, code)):
            hist = st.failures.get(wid, FailureHistory())
            st.failures[wid] = hist.model_copy(update={"fatal": dead})
        return
    if g is None or not g.gang:
        st.completed[wid] = None
        return
    st.exited[wid] = node
    done = st.done.get((job_id, group), set())
    members = [
        w
        for o in range(g.scaling.desired)
        if o not in done and (w := workload_id(job_id, group, o)) not in st.completed
    ]
    if all(w in st.exited for w in members):
        for w in members:
            st.completed[w] = None
            del st.exited[w]


def for_pass(st: LoopState, now: float) -> tuple[Done | None, list[str]]:
    """The pass's done ordinals (with those completed since the last pass) and the
    bindings to release as complete. Ordinals past a group's desired count are
    dropped when its job changes, so the count of what is left stays right. First,
    the jobs whose :func:`deadlines` passed end."""
    deadlines(st, now)
    if not (st.done or st.completed):
        return None, []
    for wid in st.completed:
        job_id, group, ordinal = wid.rsplit("/", 2)
        st.done.setdefault((job_id, group), set()).add(int(ordinal))
    changed = st.jobs_changed
    if changed is None or changed:
        for key in sorted(st.done):
            if changed is not None and key[0] not in changed:
                continue
            job = st.jobs.get(key[0])
            g = job.group(key[1]) if job is not None else None
            kept = {o for o in st.done[key] if o < g.scaling.desired} if g is not None else None
            if kept:
                st.done[key] = kept
            else:
                del st.done[key]
    return st.done, [w for w in st.completed if w in st.bindings]


def completions(plan: Plan) -> list[str]:
    """What the persist records as complete: the pass's releases as such."""
    return [w for w, why in plan.released if why == COMPLETE]


def failures(st: LoopState, plan: Plan) -> None:
    """A batch job whose run failed in this pass with no attempt left has failed for
    good: recorded before the pass publishes its status, which is what ``forge job
    wait`` reads (nothing else may change after it, so no later pass would publish).
    Bounded by the runs that failed in this pass."""
    for wid in st.failed if st.batch else ():
        job_id = wid.split("/", 1)[0]
        entry = plan.pending.get(wid)
        if job_id in st.batch and entry is not None and entry.kind in ("exhausted", "failed"):
            why = st.why_failed.get(wid)
            last = f" (last: {why})" if why else ""
            if entry.kind == "exhausted" and _tolerate(st, plan, wid):
                continue
            st.batch_failed.setdefault(job_id, f"{wid}: {'; '.join(entry.reasons)}{last}")


def _tolerate(st: LoopState, plan: Plan, wid: str) -> bool:
    """A run out of attempts in a group whose ``scaling.max_failed`` has room: it
    fails alone, marked fatal in the pass's failure histories (never placed again,
    as a Kubernetes Job's failed index), and the job goes on. A run whose exit
    status is in ``fail_on_exit`` is never tolerated: that rule fails the job."""
    job_id, group, _ = wid.rsplit("/", 2)
    job = st.jobs.get(job_id)
    g = job.group(group) if job is not None else None
    counts = st.batch_tolerated.get(job_id, {})
    if g is None or job_id in st.batch_failed or counts.get(group, 0) >= g.scaling.max_failed:
        return False
    n = counts.get(group, 0) + 1
    st.batch_tolerated[job_id] = {**counts, group: n}
    hist = plan.failures.get(wid) or FailureHistory()
    dead = f"failed for good, {n} of scaling.max_failed {g.scaling.max_failed}: not run again"
    plan.failures[wid] = hist.model_copy(update={"fatal": dead})
    # what the next pass would say of it (forge.core.waiting), said now: a group no
    # later pass visits keeps this entry, and it must not wait for an expiry
    plan.pending[wid] = PendingEntry(kind="failed", attempts=len(hist.times), reasons=(dead,))
    return True


def settle(st: LoopState, now: float) -> bool:
    """After a pass's persist: its completions and failures are planned (and the
    jobs they finished noted, :func:`_finished`); a waiting gang member whose
    binding went (its gang restarted, its node lost) will run again; a job that
    failed in it ends (:func:`end`). True: a pass must follow."""
    _finished(st, now)
    st.completed = {}
    st.why_failed = {}
    st.failed = {}
    if st.exited:
        bindings = st.bindings
        st.exited = {
            w: n for w, n in st.exited.items() if (b := bindings.get(w)) is not None and b.node == n
        }
    if not st.batch_ends or len(st.batch_ended) == len(st.batch_failed):
        return False
    again = False
    for job_id in sorted(st.batch_failed):
        if job_id not in st.batch_ended and not end(st, job_id):
            st.batch_ended[job_id] = None
        again = again or job_id not in st.batch_ended
    return again


def _finished(st: LoopState, now: float) -> None:
    """Note when each batch job with ``ttl_after_finished`` finished (complete or
    failed), or that it is running again (scaled up, a failed one changed): only
    the jobs this pass touched (a run ended, the spec changed, a deadline passed),
    so bounded by them and their runs; nothing at all for jobs without a ttl."""
    touched = st.batch_check
    for wid in (*st.completed, *st.failed) if st.batch else ():
        touched[wid.split("/", 1)[0]] = None
    for job_id in sorted(touched):
        job = st.jobs.get(job_id)
        if job is not None and job.ttl_after_finished is not None and _over(st, job):
            st.batch_finished.setdefault(job_id, now)
        else:
            st.batch_finished.pop(job_id, None)
    st.batch_check = {}


def _over(st: LoopState, job: Job) -> bool:
    """Whether ``job`` is failed or complete (:func:`state_of`'s verdict), in
    O(groups): the done ordinals are those below each group's desired count."""
    if job.id in st.batch_failed:
        return True
    tolerated = st.batch_tolerated.get(job.id, {})
    return all(
        len(st.done.get((job.id, g.name), ())) + tolerated.get(g.name, 0) >= g.scaling.desired
        for g in job.groups
    )


def expired(st: LoopState, now: float, queued: Container[str]) -> list[str]:
    """The finished jobs whose ``ttl_after_finished`` has passed, for the loop to
    delete as ``forge job stop`` does (the store drops their completions with them),
    as a Kubernetes Job's ``ttlSecondsAfterFinished``. One with a write queued is
    left to it (a user's change may try it again). Bounded by the finished jobs
    with a ttl."""
    out = []
    for job_id, t in st.batch_finished.items():
        ttl = getattr(st.jobs.get(job_id), "ttl_after_finished", None)
        if ttl is not None and now >= t + ttl and job_id not in queued:
            out.append(job_id)
    for job_id in out:
        del st.batch_finished[job_id]
        workflow.logger.info("removing job %s: its ttl_after_finished passed", job_id)
        _remember(st, job_id)
    return out


#: Removed jobs whose last state the loop keeps (published, in the checkpoint).
REMOVED_KEPT = 100


def _remember(st: LoopState, job_id: str) -> None:
    """Keep the last state of a job removed by its ttl, so a ``forge job wait`` that
    polls after the removal still reads how it ended (Kubernetes' waiters see a
    deleted Job instead). The most recent :data:`REMOVED_KEPT`; one O(runs) count."""
    state, job = state_of(st, job_id), st.jobs.get(job_id)
    if state is None or job is None:
        return
    ttl = f"removed {job.ttl_after_finished:g} s after it finished (ttl_after_finished)"
    st.batch_removed.pop(job_id, None)
    st.batch_removed[job_id] = state.model_copy(update={"what": f"{state.what}; {ttl}"})
    while len(st.batch_removed) > REMOVED_KEPT:
        del st.batch_removed[next(iter(st.batch_removed))]


def deadlines(st: LoopState, now: float) -> None:
    """Before a pass plans: start the clock of each batch job with an
    ``active_deadline`` the loop has just seen, and fail each whose deadline passed
    before it completed (Kubernetes' ``activeDeadlineSeconds``): its runs still
    bound are stopped in this very pass and none is placed again (:func:`end`).
    Bounded by the jobs with a deadline still running; nothing at all without one."""
    if not st.batch_ends or not (st.batch_started or st.batch_timing):
        return
    for job_id in st.batch_timing:
        st.batch_started.setdefault(job_id, now)
    st.batch_timing = {}
    for job_id, t0 in list(st.batch_started.items()):
        job = st.jobs.get(job_id)
        if job is None or job.active_deadline is None or job_id in st.batch_failed:
            del st.batch_started[job_id]  # gone, no deadline any more, failed already
            continue
        if now < t0 + job.active_deadline:
            continue
        del st.batch_started[job_id]
        state = state_of(st, job_id)
        if state is not None and state.state == "complete":
            continue
        why = f"active_deadline {job.active_deadline:g} s passed: its runs were stopped"
        st.batch_failed[job_id] = why
        st.batch_check[job_id] = None
        end(st, job_id)


def end(st: LoopState, job_id: str) -> bool:
    """A batch job failed for good: each of its runs not complete is marked fatal
    (never placed again, forge.core.waiting) and those still bound fail, so the next
    pass stops them. True: some were bound. Run after each pass until none is (then
    the job is in ``batch_ended``, carried across runs): whatever comes between (a
    continue-as-new, a reload), its runs are stopped. Bounded by the job's runs."""
    job = st.jobs.get(job_id)
    if job is None:
        return False
    why = f"its job failed ({st.batch_failed[job_id].split(':', 1)[0]}): not run again"
    bound = False
    for g in job.groups:
        done = st.done.get((job_id, g.name), ())
        for ordinal in range(g.scaling.desired):
            wid = workload_id(job_id, g.name, ordinal)
            if ordinal in done:
                continue
            hist = st.failures.get(wid)
            if hist is None or not hist.fatal:
                st.failures[wid] = (hist or FailureHistory()).model_copy(update={"fatal": why})
            if wid in st.bindings:
                st.failed[wid] = None
                bound = True
    return bound


async def load_done(st: LoopState) -> None:
    """A run's start: the completed ordinals, in pages (only when there are batch
    jobs: a run without any asks nothing, as runs did before batch jobs)."""
    st.done = {}
    if not st.batch:
        return
    after = ""
    while True:
        page = await acts.snapshot_completions(
            ac.PageIn(cluster=st.cluster, after=after, limit=st.opts.snapshot_page)
        )
        for wid in page.done:
            job_id, group, ordinal = wid.rsplit("/", 2)
            if job_id in st.batch:
                st.done.setdefault((job_id, group), set()).add(int(ordinal))
        if page.next_after is None:
            return
        after = page.next_after


def done_of(st: LoopState, wid: str) -> set[int]:
    """The done ordinals of ``wid``'s group (the ``explain`` query's)."""
    parts = wid.rsplit("/", 2)
    return st.done.get((parts[0], parts[1]), set()) if len(parts) == 3 else set()


def state_of(st: LoopState, job_id: str) -> c.JobState | None:
    """Where ``job_id`` stands as this run holds it (the ``job_state`` query; None:
    no such job). A run counts as complete once a pass or a report made it so, even
    before the persist that records it. Bounded by the job's desired runs."""
    job = st.jobs.get(job_id)
    if job is None:
        return None
    complete = bound = 0
    for g in job.groups:
        done = st.done.get((job_id, g.name), set())
        for ordinal in range(g.scaling.desired):
            wid = workload_id(job_id, g.name, ordinal)
            complete += ordinal in done or wid in st.completed
            bound += wid in st.bindings
    return c.job_state(
        job,
        complete=complete,
        bound=bound,
        failed=st.batch_failed.get(job_id),
        tolerated=sum(st.batch_tolerated.get(job_id, {}).values()),
    )
