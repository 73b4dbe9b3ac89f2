"""An in-process store: the reference behaviour of the ``Store`` protocol.

Used by unit tests and the in-process workflow tests, where activities run in a
thread pool, so every method holds one lock: the store's whole state moves from
one consistent snapshot to the next, which is exactly what the SQL stores get from
their transactions. Models are frozen, so handing out the stored instances is safe.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from forge.core.models import Assignment, Job, Node, NodeState
from forge.core.quota import QueueSpec
from forge.core.versions import describe_change
from forge.stores.base import (
    ApplyResult,
    AssignmentRow,
    Delta,
    Fence,
    GroupUsage,
    GroupVersion,
    JobChange,
    JobPage,
    ReplicaState,
    SpecPage,
    StoreError,
    TaskReport,
    check_fence,
    delta_digest,
    forgets_state,
    mean_usage,
    next_state,
)

__all__ = ["MemoryStore"]


def _row(a: Assignment) -> AssignmentRow:
    return AssignmentRow(
        workload_id=a.workload_id,
        job=a.job,
        group=a.group,
        ordinal=a.ordinal,
        node=a.node,
        gpu_ids=tuple(a.gpu_ids),
        cpu=a.cpu,
        memory=a.memory,
        status=a.status.value,
        gpu_milli=a.gpu_milli,
        version=a.version,
    )


@dataclass
class _Usage:
    seq: int  # the report's number when it was a decision, else 0
    cpu: float | None
    memory: float | None
    at: float
    status: str
    message: str
    node: str
    gpu: float | None = None


@dataclass
class _Cluster:
    revision: int = 0
    # job id -> (revision of its latest change, spec or None for a tombstone)
    jobs: dict[str, tuple[int, Job | None]] = field(default_factory=dict)
    fence: Fence | None = None
    digest: str = ""
    assignments: dict[str, Assignment] = field(default_factory=dict)
    nodes: dict[str, Node] = field(default_factory=dict)
    heartbeats: dict[str, float] = field(default_factory=dict)
    reports: list[TaskReport] = field(default_factory=list)  # decisions: [i].seq == i + 1
    usage: dict[str, _Usage] = field(default_factory=dict)
    states: dict[str, ReplicaState] = field(default_factory=dict)  # see next_state
    status: str | None = None
    completions: dict[str, None] = field(default_factory=dict)  # batch replicas done
    queues: list[QueueSpec] = field(default_factory=list)  # by name
    versions: dict[tuple[str, str], list[GroupVersion]] = field(default_factory=dict)


class MemoryStore:
    """The ``Store`` protocol over dictionaries, guarded by one lock.

    Listing methods sort on each call (O(n log n)): simple, and fast enough for the
    tests this store exists for; production state belongs in SQLite or PostgreSQL.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._clusters: dict[str, _Cluster] = {}
        self._closed = False

    def _cluster(self, name: str) -> _Cluster:
        if self._closed:
            raise StoreError("store is closed")
        cluster = self._clusters.get(name)
        if cluster is None:
            cluster = self._clusters[name] = _Cluster()
        return cluster

    # -- jobs ----------------------------------------------------------------------
    def put_job(self, cluster: str, job: Job) -> int:
        return self.put_jobs(cluster, [job])

    def put_jobs(self, cluster: str, jobs: Sequence[Job]) -> int:
        with self._lock:
            c = self._cluster(cluster)
            for job in jobs:
                c.revision += 1
                c.jobs[job.id] = (c.revision, job)
                for g in job.groups:
                    versions = c.versions.setdefault((job.id, g.name), [])
                    last = versions[-1] if versions else None
                    if last is not None and last.version == g.version:
                        continue
                    versions.append(
                        GroupVersion(
                            job_id=job.id,
                            group=g.name,
                            number=len(versions) + 1,
                            version=g.version,
                            revision=c.revision,
                            changed=describe_change(last.spec if last else None, g),
                            spec=g,
                        )
                    )
            return c.revision

    def group_versions(self, cluster: str, job_id: str) -> list[GroupVersion]:
        with self._lock:
            found = self._cluster(cluster).versions
            return [v for (j, _), vs in sorted(found.items()) if j == job_id for v in vs]

    def delete_job(self, cluster: str, job_id: str) -> int | None:
        with self._lock:
            c = self._cluster(cluster)
            current = c.jobs.get(job_id)
            if current is None or current[1] is None:
                return None
            c.revision += 1
            c.jobs[job_id] = (c.revision, None)
            prefix = f"{job_id}/"
            for workload in [w for w in c.completions if w.startswith(prefix)]:
                del c.completions[workload]
            return c.revision

    def get_job(self, cluster: str, job_id: str) -> Job | None:
        with self._lock:
            entry = self._cluster(cluster).jobs.get(job_id)
            return entry[1] if entry is not None else None

    def list_jobs(self, cluster: str) -> list[Job]:
        with self._lock:
            jobs = self._cluster(cluster).jobs
            return [job for _, (_, job) in sorted(jobs.items()) if job is not None]

    def job_changes(self, cluster: str, since: int, limit: int = 500) -> JobPage:
        with self._lock:
            jobs = self._cluster(cluster).jobs
            newer = sorted((rev, job_id, job) for job_id, (rev, job) in jobs.items() if rev > since)
        page = newer[:limit]
        changes = [JobChange(revision=rev, job_id=job_id, job=job) for rev, job_id, job in page]
        return JobPage(
            changes=changes,
            revision=changes[-1].revision if changes else since,
            more=len(newer) > limit,
        )

    def job_spec_changes(self, cluster: str, since: int, limit: int = 500) -> SpecPage:
        page = self.job_changes(cluster, since, limit)
        rows = [
            (ch.revision, ch.job_id, ch.job.model_dump_json() if ch.job is not None else None)
            for ch in page.changes
        ]
        return SpecPage(rows, page.revision, page.more)

    def revision(self, cluster: str) -> int:
        with self._lock:
            return self._cluster(cluster).revision

    # -- actual state --------------------------------------------------------------
    def apply_delta(self, cluster: str, fence: Fence, delta: Delta) -> ApplyResult:
        fence = Fence(*fence)
        digest = delta_digest(delta)
        with self._lock:
            c = self._cluster(cluster)
            settled = check_fence(fence, c.fence, c.digest, digest)
            if settled is not None:
                return settled
            # Nothing below can fail half-way, so validating first is atomic enough.
            for workload in delta.release:
                c.assignments.pop(workload, None)
                c.usage.pop(workload, None)
            for workload in forgets_state(delta):
                c.states.pop(workload, None)
            for a in delta.bind:
                c.assignments[a.workload_id] = a
            for node_id in delta.nodes_remove:
                c.nodes.pop(node_id, None)
            for node in delta.nodes_upsert:
                c.nodes[node.id] = node
            if delta.status is not None:
                c.status = delta.status
            for workload in delta.complete:
                c.completions[workload] = None
            if delta.queues is not None:
                c.queues = sorted(delta.queues, key=lambda q: q.name)
            c.fence, c.digest = fence, digest
        return ApplyResult(applied=True, digest=digest)

    def loop_status(self, cluster: str) -> str | None:
        with self._lock:
            return self._cluster(cluster).status

    def completions(self, cluster: str, after: str = "", limit: int = 5000) -> list[str]:
        with self._lock:
            done = sorted(w for w in self._cluster(cluster).completions if w > after)
            return done[:limit]

    def queues(self, cluster: str) -> list[QueueSpec]:
        with self._lock:
            return list(self._cluster(cluster).queues)

    def fence(self, cluster: str) -> Fence | None:
        with self._lock:
            return self._cluster(cluster).fence

    def assignments(self, cluster: str, after: str = "", limit: int = 5000) -> list[Assignment]:
        with self._lock:
            items = self._cluster(cluster).assignments
            keys = sorted(k for k in items if k > after)[:limit]
            return [items[k] for k in keys]

    def assignment_rows(
        self, cluster: str, after: str = "", limit: int = 5000
    ) -> list[AssignmentRow]:
        return [_row(a) for a in self.assignments(cluster, after, limit)]

    def nodes(self, cluster: str, after: str = "", limit: int = 5000) -> list[Node]:
        with self._lock:
            items = self._cluster(cluster).nodes
            keys = sorted(k for k in items if k > after)[:limit]
            return [items[k] for k in keys]

    # -- liveness and task status --------------------------------------------------
    def heartbeat(self, cluster: str, node_id: str, at: float) -> None:
        with self._lock:
            beats = self._cluster(cluster).heartbeats
            beats[node_id] = max(at, beats.get(node_id, at))

    def expired_nodes(self, cluster: str, before: float, limit: int = 1000) -> list[str]:
        with self._lock:
            c = self._cluster(cluster)
            expired = sorted(
                node_id
                for node_id, node in c.nodes.items()
                if node.state != NodeState.LOST
                and node_id in c.heartbeats
                and c.heartbeats[node_id] < before
            )
            return expired[:limit]

    def report(self, cluster: str, reports: list[TaskReport]) -> int:
        with self._lock:
            c = self._cluster(cluster)
            for r in reports:
                seq = 0
                state = next_state(c.states.get(r.workload_id), r)
                if state is not None:
                    c.states[r.workload_id] = state
                    seq = len(c.reports) + 1
                    c.reports.append(r.model_copy(update={"seq": seq}))
                if r.cpu is None and r.memory is None:
                    continue
                last = c.usage.get(r.workload_id)
                if last is None or r.at >= last.at:
                    c.usage[r.workload_id] = _Usage(
                        seq, r.cpu, r.memory, r.at, r.status, r.message, r.node, r.gpu
                    )
            return len(c.reports)

    def reports_since(self, cluster: str, seq: int, limit: int = 1000) -> list[TaskReport]:
        with self._lock:
            reports = self._cluster(cluster).reports
            start = max(seq, 0)
            return reports[start : start + max(limit, 0)]

    def job_reports(
        self, cluster: str, job_id: str, after: int = 0, limit: int = 5000
    ) -> list[TaskReport]:
        prefix = f"{job_id}/"
        with self._lock:
            reports = self._cluster(cluster).reports[max(after, 0) :]
            return [r for r in reports if r.workload_id.startswith(prefix)][: max(limit, 0)]

    def group_usage(self, cluster: str, since: float) -> dict[str, GroupUsage]:
        with self._lock:
            usage = self._cluster(cluster).usage
            rows = [(w, u.cpu, u.memory, u.gpu) for w, u in usage.items() if u.at >= since]
        return mean_usage(rows)

    def latest_usage(self, cluster: str, after: str = "", limit: int = 5000) -> list[TaskReport]:
        with self._lock:
            c = self._cluster(cluster)
            wids = sorted(w for w in c.usage if w > after)[: max(limit, 0)]
            return [
                TaskReport(
                    seq=u.seq,
                    workload_id=w,
                    status=u.status,
                    cpu=u.cpu,
                    memory=u.memory,
                    gpu=u.gpu,
                    at=u.at,
                    message=u.message,
                    node=u.node,
                )
                for w in wids
                for u in (c.usage[w],)
            ]

    def close(self) -> None:
        with self._lock:
            self._closed = True
