"""The ``Store`` protocol: where jobs, the persisted bindings, heartbeats and task
reports live.

The store is the system of record for *intent* (jobs, with a revision like an etcd
key space) and the durable copy of *actual* state (bindings and registered nodes),
written only by the cluster workflow's persist activity, one fenced delta per pass.
High-rate traffic (node heartbeats, task status reports) is written here by agents
and read in batches, so it never becomes one Temporal signal per event.

Every method is synchronous: SQLite and psycopg are blocking drivers and the
activities that call them run in a thread pool. Every method takes the cluster
name first, so one database can hold many clusters.

The rows themselves (the errors, ``Fence``, ``Delta``, ``TaskReport`` ...) are
defined in ``forge.stores.rows`` and re-exported here, with the helpers the stores
and the workflow share (digests, ``next_state``) and the protocols.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from typing import Any, Protocol, runtime_checkable

from forge.core.models import Assignment, AssignmentStatus, Job, Node
from forge.core.quota import QueueSpec
from forge.stores.rows import (
    ApplyResult,
    AssignmentRow,
    Delta,
    Fence,
    GroupUsage,
    GroupVersion,
    JobChange,
    JobPage,
    SpecPage,
    StaleFenceError,
    StoreError,
    TaskReport,
)

__all__ = [
    "STATE_MOD",
    "AgentStore",
    "ApplyResult",
    "AssignmentRow",
    "Delta",
    "Fence",
    "GroupUsage",
    "GroupVersion",
    "JobChange",
    "JobPage",
    "ReplicaState",
    "SpecPage",
    "StaleFenceError",
    "Store",
    "StoreError",
    "TaskReport",
    "binding_hash",
    "check_fence",
    "delta_digest",
    "forgets_state",
    "group_of",
    "is_usage",
    "mean_usage",
    "next_state",
    "rows_digest",
    "state_digest",
]


#: What the loop decides on about one replica, as its reports last said it:
#: ``(status, node, healthy)``. The store keeps it per replica so it can tell a
#: report that changes a decision from one that only repeats what is known.
ReplicaState = tuple[str, str, bool | None]


def next_state(prev: ReplicaState | None, report: TaskReport) -> ReplicaState | None:
    """The replica's state after ``report``, or None when the report changes nothing
    the loop decides on (wake for decisions, not for data).

    A usage sample (``running`` with cpu or memory, no health verdict) never is:
    an agent sends a replica's ``running`` transition before its first sample, so
    a sample says nothing the loop has not heard, and a sample of the process a new
    binding replaces (a new version on the same node) must not stand in for the new
    process's own start. Any other report is a decision when the store knows
    nothing of the replica yet, when its status or node differ from the last
    decision, or when its health verdict differs from the last one. A ``running``
    report without a verdict is a process's start (checks not yet run), so after a
    verdict it is news: it is how a new process on the same node (a new version)
    is told apart from the one it replaced when a late verdict of the old process
    arrived after the new binding. A repeated ``running`` / ``failed`` (an agent
    that restarted, a batch sent twice) is not. What is no decision stays in the
    store (``group_usage`` and ``latest_usage`` read the samples) and never moves
    the reports sequence the watch follows. ``apply_delta`` forgets the state of a
    replica it releases or binds pending, so the first report about a new binding
    is always a decision.
    """
    if report.status == "running" and report.healthy is None and is_usage(report):
        return None
    if (
        prev is not None
        and prev[0] == report.status
        and prev[1] == report.node
        and report.healthy == prev[2]
    ):
        return None
    return (report.status, report.node, report.healthy)


def is_usage(report: TaskReport) -> bool:
    """The report carries a usage sample (cpu or memory)."""
    return report.cpu is not None or report.memory is not None


def forgets_state(delta: Delta) -> list[str]:
    """The replicas whose ``ReplicaState`` ``delta`` clears: released, or bound and
    still pending (a new binding, a restart, a new version), whose next report the
    loop is waiting for."""
    pending = [a.workload_id for a in delta.bind if a.status is AssignmentStatus.PENDING]
    return sorted({*delta.release, *pending})


def delta_digest(delta: Delta) -> str:
    """A digest of a delta, identical in the workflow and in every store.

    The persist activity returns it and the workflow compares it with its own, so a
    replay that rebuilt a different plan than the one persisted (a determinism bug)
    is detected instead of silently diverging from the store.
    """
    rows = [
        (a.job, a.group, a.ordinal, a.node, a.gpu_ids, a.cpu, a.memory, str(a.status))
        + ((a.gpu_milli, a.version) if a.version else (a.gpu_milli,) if a.gpu_milli else ())
        for a in delta.bind
    ]
    return rows_digest(
        rows, delta.release, delta.nodes_upsert, delta.nodes_remove, status=delta.status
    )


def rows_digest(
    bind: Sequence[tuple[Any, ...]],
    release: Sequence[str],
    nodes_upsert: Sequence[Node],
    nodes_remove: Sequence[str],
    *,
    status: str | None = None,
) -> str:
    """The digest of a delta given as compact rows (what the workflow holds), so a
    20,000-binding pass is hashed without building 20,000 models.

    The published status is part of it when there is one: it carries the pending
    replicas' backoff attempts and wake times, so a replay whose timing rules changed
    (a backoff constant, say) no longer matches what the store applied either."""
    doc: dict[str, object] = {
        "bind": [[*r[:4], list(r[4]), *r[5:]] for r in bind],
        "release": list(release),
        "nodes_upsert": [n.model_dump(mode="json") for n in nodes_upsert],
        "nodes_remove": list(nodes_remove),
    }
    if status is not None:
        doc["status"] = status
    body = json.dumps(doc, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()[:32]


#: Bindings as a multiset hash: the sum of each binding's hash, modulo 2**64. A pass
#: updates it with what it placed and released (no walk over every binding), and a
#: reader of the store recomputes it from the rows: equal sums mean the store holds
#: exactly the workflow's bindings (invariant 6), without asking the workflow.
STATE_MOD = 1 << 64


def binding_hash(
    job: str,
    group: str,
    ordinal: int,
    node: str,
    gpu_ids: Sequence[str],
    cpu: int,
    memory: int,
) -> int:
    text = f"{job}/{group}/{ordinal}|{node}|{','.join(gpu_ids)}|{cpu}|{memory}"
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def state_digest(assignments: Iterable[Assignment]) -> str:
    """The bindings hash of what a store holds (see ``STATE_MOD``), as hex."""
    total = 0
    for a in assignments:
        total += binding_hash(a.job, a.group, a.ordinal, a.node, a.gpu_ids, a.cpu, a.memory)
    return f"{total % STATE_MOD:016x}"


def check_fence(
    fence: Fence, stored: Fence | None, stored_digest: str, digest: str
) -> ApplyResult | None:
    """Decide what ``apply_delta`` does with ``fence``; ``None`` means "apply it".

    Shared by every store so the three backends cannot drift apart on the one rule
    that keeps a late retry from overwriting a newer pass.
    """
    if stored is None or fence > stored:
        return None
    if fence < stored:
        raise StaleFenceError(f"fence {tuple(fence)} is older than the stored {tuple(stored)}")
    if digest != stored_digest:
        raise StoreError(
            f"fence {tuple(fence)} was already applied with a different delta "
            f"(stored digest {stored_digest}, this one {digest}): the plan diverged"
        )
    return ApplyResult(applied=False, digest=stored_digest)


def group_of(workload: str) -> str | None:
    """``job/group`` of a workload id ``job/group/ordinal`` (None if malformed)."""
    head, sep, _ = workload.rpartition("/")
    return head if sep and "/" in head else None


def mean_usage(
    latest: Iterable[tuple[str, float | None, float | None, float | None]],
) -> dict[str, GroupUsage]:
    """Average ``(workload_id, cpu, memory, gpu)`` rows per ``job/group``.

    Each dimension is averaged over the replicas that reported it, so a replica
    that reports only memory does not drag the group's cpu towards zero; a cpu or
    memory nobody reported is 0.0, a gpu nobody reported None. Rows without cpu and
    memory are no usage sample (gpu rides with one). Shared so every store rounds
    the same way.
    """
    sums: dict[str, list[float]] = {}
    for workload, cpu, memory, gpu in latest:
        group = group_of(workload)
        if group is None or (cpu is None and memory is None):
            continue
        acc = sums.setdefault(group, [0.0] * 6)
        for i, value in enumerate((cpu, memory, gpu)):
            if value is not None:
                acc[2 * i] += value
                acc[2 * i + 1] += 1
    return {
        group: GroupUsage(c / nc if nc else 0.0, m / nm if nm else 0.0, g / ng if ng else None)
        for group, (c, nc, m, nm, g, ng) in sorted(sums.items())
    }


@runtime_checkable
class AgentStore(Protocol):
    """What a node agent does with the store, and nothing more: heartbeat and report
    for its node, read its node, its bindings and their jobs.

    The agent is typed against this, not ``Store``, so the least-privilege store an
    agent's own PostgreSQL role opens (``PostgresAgentStore``, which can do only
    this) is a complete store for it, and a new agent feature that needs more is a
    visible change here, to the agent's role and its SQL functions too. Every
    ``Store`` is an ``AgentStore``. Implementations for an agent's role return only
    the agent's own rows: bindings and nodes of its node, jobs cut to the groups
    bound on it.
    """

    def heartbeat(self, cluster: str, node_id: str, at: float) -> None: ...

    def report(self, cluster: str, reports: list[TaskReport]) -> int: ...

    def nodes(self, cluster: str, after: str = "", limit: int = 5000) -> list[Node]: ...

    def assignments(self, cluster: str, after: str = "", limit: int = 5000) -> list[Assignment]: ...

    def get_job(self, cluster: str, job_id: str) -> Job | None: ...

    def close(self) -> None: ...


@runtime_checkable
class Store(Protocol):
    # -- jobs: intent, with a monotonically increasing per-cluster revision --------
    def put_job(self, cluster: str, job: Job) -> int:
        """Insert or replace a job; returns the new revision."""
        ...

    def put_jobs(self, cluster: str, jobs: Sequence[Job]) -> int:
        """Upsert jobs in one transaction, a revision each; the last (or the current if none)."""
        ...

    def delete_job(self, cluster: str, job_id: str) -> int | None:
        """Delete a job (leaves a tombstone); returns the revision, None if absent."""
        ...

    def get_job(self, cluster: str, job_id: str) -> Job | None: ...

    def list_jobs(self, cluster: str) -> list[Job]:
        """Live jobs ordered by id."""
        ...

    def job_changes(self, cluster: str, since: int, limit: int = 500) -> JobPage:
        """Changes with revision > since, oldest first, at most ``limit``.

        Only the latest change of each job is kept (like a compacted watch); deleted
        jobs appear as tombstones (``job=None``)."""
        ...

    def assignment_rows(
        self, cluster: str, after: str = "", limit: int = 5000
    ) -> list[AssignmentRow]:
        """``assignments`` as plain rows, no model built: what a new run's reload
        reads, 300,000 of them at 10,000 nodes."""
        ...

    def job_spec_changes(self, cluster: str, since: int, limit: int = 500) -> SpecPage:
        """``job_changes`` with each spec as the stored JSON text, unparsed."""
        ...

    def revision(self, cluster: str) -> int:
        """The latest job revision (0 for an empty cluster)."""
        ...

    def group_versions(self, cluster: str, job_id: str) -> list[GroupVersion]:
        """Every version of the job's groups' task specs, by group then number
        (kept after the job is deleted; a job written again continues them)."""
        ...

    # -- actual state: bindings and nodes, written by the persist activity ---------
    def apply_delta(self, cluster: str, fence: Fence, delta: Delta) -> ApplyResult:
        """Apply a pass's changes atomically.

        fence < stored fence: raise ``StaleFenceError`` (nothing written).
        fence == stored fence: a retry; nothing written, ``applied=False``, the
        stored digest returned (``StoreError`` if the digest differs).
        fence > stored fence: apply, store fence and digest, ``applied=True``.
        """
        ...

    def loop_status(self, cluster: str) -> str | None:
        """The status document the loop last published with a delta (JSON)."""
        ...

    def completions(self, cluster: str, after: str = "", limit: int = 5000) -> list[str]:
        """Batch replicas that completed (``Delta.complete``) with workload_id >
        after, ordered by workload_id; a job's go when it is deleted."""
        ...

    def job_reports(self, cluster: str, job_id: str, after: int, limit: int) -> list[TaskReport]:
        """``job_id``'s replicas' decisions with seq > ``after``, by seq (job runs)."""
        ...

    def queues(self, cluster: str) -> list[QueueSpec]:
        """The cluster's queues as the loop last persisted them (``Delta.queues``)."""
        ...

    def fence(self, cluster: str) -> Fence | None:
        """The last applied fence, None if nothing was ever persisted."""
        ...

    def assignments(self, cluster: str, after: str = "", limit: int = 5000) -> list[Assignment]:
        """Bindings with workload_id > after, ordered by workload_id."""
        ...

    def nodes(self, cluster: str, after: str = "", limit: int = 5000) -> list[Node]:
        """Registered nodes with id > after, ordered by id."""
        ...

    # -- liveness and task status, written by agents, read in batches --------------
    def heartbeat(self, cluster: str, node_id: str, at: float) -> None: ...

    def expired_nodes(self, cluster: str, before: float, limit: int = 1000) -> list[str]:
        """Registered nodes, not already lost, whose last heartbeat is older than
        ``before``. Nodes that never sent a heartbeat are not monitored."""
        ...

    def report(self, cluster: str, reports: list[TaskReport]) -> int:
        """Record task reports, in order; returns the reports sequence after them.

        Only decisions (see ``next_state``) are appended with the next sequence
        numbers; every report carrying cpu or memory updates the replica's latest
        usage. A usage sample therefore moves nothing the watch follows."""
        ...

    def reports_since(self, cluster: str, seq: int, limit: int = 1000) -> list[TaskReport]:
        """Decision reports with seq > ``seq``, oldest first (usage-only samples and
        repeats of a known state are not in it)."""
        ...

    def group_usage(self, cluster: str, since: float) -> dict[str, GroupUsage]:
        """Mean (cpu, memory, gpu) utilisation per ``job/group`` over each replica's
        latest report at or after ``since``; groups with no report are absent.

        Only reports carrying a cpu or memory value count (see ``mean_usage``), and
        a replica released by ``apply_delta`` stops counting: its usage must not
        keep a group from scaling down once it is gone."""
        ...

    def latest_usage(self, cluster: str, after: str = "", limit: int = 5000) -> list[TaskReport]:
        """Each bound replica's latest usage report (the one ``group_usage`` counts),
        with its message and node, for replicas with workload_id > ``after``, ordered
        by workload_id. For ``forge status``; the loop never reads it."""
        ...

    def close(self) -> None: ...
