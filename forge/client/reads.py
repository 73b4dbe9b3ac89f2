"""Reads of what the loop published, from the store the worker persists to.

A query sent while a worker takes the run over can wedge replay (RELIABILITY.md), so
status, assignments and explanations come from the store (bindings, nodes and the
status each pass writes with its delta), like any outside reader. Blocking: the
client runs these in a thread.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from forge.core.kinds import phase
from forge.core.models import Assignment, Job, Node
from forge.core.placement import Binding
from forge.stores.base import Store
from forge.wire import contract as c
from forge.wire import views
from forge.wire.queues import QueueView

__all__ = [
    "STORE_PAGE",
    "JobList",
    "all_assignments",
    "all_nodes",
    "assignment_views",
    "batch_state",
    "completed_runs",
    "explanation",
    "job_list",
    "job_state",
    "node_usage",
    "published",
    "queues",
    "status",
]

_R = TypeVar("_R")
STORE_PAGE = 5000  # rows per store read


def published(store: Store, cluster: str) -> c.LoopStatus | None:
    raw = store.loop_status(cluster)
    return c.LoopStatus.model_validate_json(raw) if raw is not None else None


def _every(
    fetch: Callable[[str, int], list[_R]], key: Callable[[_R], str], page: int = STORE_PAGE
) -> list[_R]:
    """Every row of a store listing, page by page (``fetch(after, limit)``)."""
    out: list[_R] = []
    while True:
        got = fetch(key(out[-1]) if out else "", page)
        out.extend(got)
        if len(got) < page:
            return out


def all_nodes(store: Store, cluster: str) -> list[Node]:
    return _every(lambda after, n: store.nodes(cluster, after, n), lambda x: x.id)


def all_assignments(store: Store, cluster: str, page: int = STORE_PAGE) -> list[Assignment]:
    return _every(
        lambda after, n: store.assignments(cluster, after, n), lambda a: a.workload_id, page
    )


def assignment_views(found: Sequence[Assignment]) -> list[c.AssignmentView]:
    return [
        c.AssignmentView(
            workload_id=a.workload_id, node=a.node, gpu_ids=list(a.gpu_ids), status=a.status
        )
        for a in found
    ]


def status(
    store: Store, cluster: str, assignments: Sequence[Assignment] | None = None
) -> c.StatusView:
    """``assignments``: every binding, when the caller has read them already."""
    doc = published(store, cluster)
    nodes = all_nodes(store, cluster)
    if assignments is None:
        assignments = all_assignments(store, cluster)
    bindings = [Binding.from_assignment(a) for a in assignments]
    summary = doc.summary if doc is not None else c.Summary.empty()
    return c.StatusView(
        summary=summary,
        nodes=views.node_views(nodes, bindings),
        pending=doc.pending if doc is not None else [],
        pending_truncated=doc.pending_truncated if doc is not None else 0,
        notices=doc.notices if doc is not None else [],
        preemptions=doc.preemptions if doc is not None else 0,
        resets=doc.resets if doc is not None else 0,
        last_reset=doc.last_reset if doc is not None else "",
        queues=doc.queues if doc is not None else [],
    )


def queues(store: Store, cluster: str) -> list[QueueView] | None:
    """Each queue as the last pass that changed something published it; None when
    the loop has published nothing yet (then only the loop knows)."""
    doc = published(store, cluster)
    return None if doc is None else doc.queues


def node_usage(
    store: Store, cluster: str, assignments: Sequence[Assignment] | None = None
) -> dict[str, views.NodeUsage]:
    """Per node, what its replicas use and the ports they listen on, from the agents'
    latest usage reports (empty when no agent reports). ``assignments``: every
    binding, when the caller has read them already."""
    reports = _every(
        lambda after, n: store.latest_usage(cluster, after, n), lambda r: r.workload_id
    )
    if not reports:
        return {}
    if assignments is None:
        assignments = all_assignments(store, cluster)
    return views.node_usage(reports, assignments)


def explanation(store: Store, cluster: str, wid: str) -> c.Explanation:
    doc = published(store, cluster)
    bindings = [Binding.from_assignment(a) for a in all_assignments(store, cluster)]
    shown = {p.workload_id: p for p in doc.pending} if doc is not None else {}
    return views.explanation(
        wid,
        binding=next((b for b in bindings if b.workload_id == wid), None),
        pending=shown.get(wid),
        job=store.get_job(cluster, wid.rsplit("/", 2)[0]),
        nodes=all_nodes(store, cluster),
        bindings=bindings,
        preemptions=doc.recent_preemptions if doc is not None else (),
        done=_done(store, cluster, wid),
    )


def _done(store: Store, cluster: str, wid: str) -> set[int]:
    """The done ordinals of ``wid``'s group as the store records them."""
    prefix = f"{wid.rsplit('/', 1)[0]}/"
    runs = completed_runs(store, cluster, wid.split("/", 1)[0]) if wid.count("/") == 2 else []
    return {int(w.rsplit("/", 1)[1]) for w in runs if w.startswith(prefix)}


def completed_runs(store: Store, cluster: str, job_id: str, page: int = STORE_PAGE) -> list[str]:
    """A batch job's completed runs (their workload ids), page by page."""
    return _of_job(lambda after: store.completions(cluster, after, page), job_id, page)


def _of_job(fetch: Callable[[str], Sequence[str]], job_id: str, page: int) -> list[str]:
    """The ids under ``JOB/`` of a store listing sorted by workload id: a job's ids
    sort together, right after ``JOB/``, so this reads only the job's pages."""
    prefix, out, after = f"{job_id}/", [], f"{job_id}/"
    while True:
        got = fetch(after)
        mine = [w for w in got if w.startswith(prefix)]
        out.extend(mine)
        if len(got) < page or len(mine) < len(got):
            return out
        after = got[-1]


def job_state(store: Store, cluster: str, job_id: str) -> c.JobState | None:
    """Where a job stands as the store holds it (the ``job_state`` query's answer,
    from the record rather than the run): ``complete`` once every desired run
    completed, ``failed`` once the loop published it failed for good, else
    ``running``; ``service`` for a service job; None: no such job."""
    job = store.get_job(cluster, job_id)
    if job is None:  # or removed by its ttl_after_finished: its last state, published
        doc = published(store, cluster)
        return doc.removed_jobs.get(job_id) if doc is not None else None

    def ids(after: str) -> list[str]:
        return [a.workload_id for a in store.assignments(cluster, after, STORE_PAGE)]

    bound = len(_of_job(ids, job_id, STORE_PAGE))
    if job.type != "batch":
        return c.job_state(job, complete=0, bound=bound, failed=None, tolerated=0)
    doc = published(store, cluster) or c.LoopStatus(summary=c.Summary.empty())
    return c.job_state(
        job,
        complete=len(completed_runs(store, cluster, job_id)),
        bound=bound,
        failed=doc.failed_jobs.get(job_id),
        tolerated=doc.tolerated_failures.get(job_id, 0),
    )


def batch_state(store: Store, cluster: str, job_id: str) -> tuple[str, str] | None:
    """``(state, what)`` of :func:`job_state`; None: no such job."""
    found = job_state(store, cluster, job_id)
    return None if found is None else (found.state, found.what)


@dataclass(frozen=True)
class JobList:
    """``forge job list``'s view: the jobs, their bound replicas, and each batch
    job's state (``complete``, ``failed``, ``running``) and completed runs."""

    jobs: list[Job]
    bound: Counter[str]
    states: dict[str, str]
    complete: Counter[str]

    def labels(self) -> dict[str, str]:
        """Each batch job's STATE: its state and runs complete (``complete 2/2``), as
        ``kubectl get jobs``' COMPLETIONS (a finished job binds nothing: BOUND 0
        alone would read as stuck)."""
        out = {}
        for j in self.jobs:
            if j.id in self.states:
                desired = sum(g.scaling.desired for g in j.groups)
                out[j.id] = f"{self.states[j.id]} {self.complete[j.id]}/{desired}"
        return out

    def as_json(self) -> list[dict[str, object]]:
        """``--json``: one object per job (``state`` and ``complete``: batch only)."""
        out: list[dict[str, object]] = []
        for j in self.jobs:
            row: dict[str, object] = {
                "id": j.id,
                "priority": j.priority,
                "desired": sum(g.scaling.desired for g in j.groups),
                "bound": self.bound.get(j.id, 0),
                "groups": {g.name: g.scaling.desired for g in j.groups},
            }
            if j.type == "batch":
                row |= {
                    "type": "batch",
                    "state": self.states[j.id],
                    "complete": self.complete[j.id],
                }
            out.append(row)
        return out


def job_list(store: Store, cluster: str, page: int = STORE_PAGE) -> JobList:
    """Every job with its bound and completed replicas, each read page by page
    (O(jobs + bindings + completions): what the command prints)."""
    jobs = store.list_jobs(cluster)
    bound: Counter[str] = Counter()
    after: str | None = ""
    while after is not None:  # counted page by page: a million bindings are not kept
        rows = store.assignments(cluster, after, page)
        bound.update(a.job for a in rows)
        after = rows[-1].workload_id if len(rows) == page else None
    complete: Counter[str] = Counter()
    after = "" if any(j.type == "batch" for j in jobs) else None
    while after is not None:
        done = store.completions(cluster, after, page)
        complete.update(w.split("/", 1)[0] for w in done)
        after = done[-1] if len(done) == page else None
    doc = published(store, cluster) or c.LoopStatus(summary=c.Summary.empty())
    states: dict[str, str] = {
        j.id: phase(
            sum(g.scaling.desired for g in j.groups),
            complete[j.id],
            doc.failed_jobs.get(j.id),
            doc.tolerated_failures.get(j.id, 0),
        )[0]
        for j in jobs
        if j.type == "batch"
    }
    return JobList(jobs, bound, states, complete)
