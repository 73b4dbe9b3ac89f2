"""Activity names and payloads between the cluster workflow and its activities.

Like :mod:`forge.wire.contract` for clients, this is the one module both sides share,
so the workflow never imports the code that does I/O. Bulk data travels in
compact rows (``BindRow``) rather than one JSON object per binding: smaller
payloads, less history, and faster to encode.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from forge.core.models import Assignment, AssignmentStatus, Job, Node, TaskGroup
from forge.core.periodic import Schedule
from forge.core.quota import QueueSpec
from forge.serialize import omit_defaults
from forge.stores.base import AssignmentRow, Delta

__all__ = [
    "ACT_FENCE",
    "ACT_GROUP_SPEC",
    "ACT_INTAKE",
    "ACT_JOB_CHANGES",
    "ACT_METRICS",
    "ACT_PERSIST",
    "ACT_READ_REPORTS",
    "ACT_SNAPSHOT_ASSIGNMENTS",
    "ACT_SNAPSHOT_COMPLETIONS",
    "ACT_SNAPSHOT_NODES",
    "ACT_WATCH",
    "ACT_WRITE_JOBS",
    "JOB_EXTRAS",
    "AssignmentRows",
    "BindRow",
    "ClusterRef",
    "CompletionsPage",
    "GroupSpecIn",
    "GroupSpecOut",
    "Intake",
    "JobChangesIn",
    "JobRow",
    "JobsPage",
    "LoadedRow",
    "MetricsIn",
    "MetricsOut",
    "NodesPage",
    "PageIn",
    "PersistIn",
    "ReportsIn",
    "ReportsOut",
    "WatchIn",
    "WatchOut",
    "WriteJobsIn",
    "WriteJobsOut",
    "assignment_from_row",
    "row_from_assignment",
    "to_delta",
]

ACT_FENCE = "forge.fence"
ACT_SNAPSHOT_NODES = "forge.snapshot_nodes"
ACT_SNAPSHOT_ASSIGNMENTS = "forge.snapshot_assignments"
ACT_JOB_CHANGES = "forge.job_changes"
ACT_WRITE_JOBS = "forge.write_jobs"
ACT_PERSIST = "forge.persist"
ACT_WATCH = "forge.watch"
ACT_READ_REPORTS = "forge.read_reports"
ACT_METRICS = "forge.metrics"
ACT_GROUP_SPEC = "forge.group_spec"
ACT_INTAKE = "forge.intake"
ACT_SNAPSHOT_COMPLETIONS = "forge.snapshot_completions"

#: (job, group, ordinal, node, gpu_ids, cpu, memory, status[, gpu_milli]): the share
#: of a shared GPU only when there is one, so rows (and digests) of whole-device
#: bindings are what they always were.
BindRow = (
    tuple[str, str, int, str, tuple[str, ...], int, int, str]
    | tuple[str, str, int, str, tuple[str, ...], int, int, str, int]
    | tuple[str, str, int, str, tuple[str, ...], int, int, str, int, str]
)


class _Msg(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ClusterRef(_Msg):
    cluster: str


class PageIn(_Msg):
    cluster: str
    after: str = ""
    limit: int = Field(default=5000, ge=1)


class NodesPage(_Msg):
    nodes: list[Node]
    next_after: str | None


#: A bind row as a loaded page carries it: checked where it is made (a store's row,
#: through ``row_from_assignment``), not again field by field where it is read.
#: Validating the union ``BindRow`` cost a new run ~1 us a binding (0.3 s of every
#: reload at 300,000 bindings, and again in every replay of it).
LoadedRow = tuple[Any, ...]


class AssignmentRows(_Msg):
    rows: list[LoadedRow]
    next_after: str | None


class CompletionsPage(_Msg):
    """Batch replicas that completed (``Store.completions``), a page of them."""

    done: list[str]
    next_after: str | None


class JobChangesIn(_Msg):
    cluster: str
    since: int
    limit: int = 500


#: One job change in a compact page: (revision, job id, name (None: deleted),
#: priority, the indexes of its groups in the page's ``groups``[, the job's other
#: fields that are not their default, as JSON: :data:`JOB_EXTRAS`]).
JobRow = (
    tuple[int, str, str | None, int, list[int]]
    | tuple[int, str, str | None, int, list[int], dict[str, Any]]
)

#: The job fields a compact row carries beside name, priority and groups, when set.
#: Every other field of ``Job``: rows carried only the first two until the batch
#: fields came, and a job loaded from a page lost ``active_deadline`` (so after a
#: continue-as-new or a resync, its deadline never came).
JOB_EXTRAS = (
    "preemption",
    "type",
    "schedule",
    "active_deadline",
    "ttl_after_finished",
    "queue",
)


class JobsPage(_Msg):
    """A page of job changes with each distinct group spec once: a new run reloads
    every job, and 50,000 jobs of 30 shapes are then 30 groups to parse (and one
    version digest and one request each, cached on the shared object), not 50,000.
    The specs were validated when stored, so :meth:`jobs` builds them unvalidated."""

    groups: list[TaskGroup]
    rows: list[JobRow]
    revision: int = Field(description="the highest revision this page covers")
    more: bool
    #: the cluster's stored queues, on the first page of a full load (``since`` 0)
    #: only: a run started afresh on the store gets them back (left out when None)
    queues: list[QueueSpec] | None = Field(default=None, exclude_if=lambda v: v is None)

    def jobs(self) -> list[tuple[str, Job | None]]:
        groups = self.groups
        out: list[tuple[str, Job | None]] = []
        for row in self.rows:
            _, job_id, name, priority, idx = row[:5]
            if name is None:
                out.append((job_id, None))
                continue
            shared = tuple(groups[i] for i in idx)
            extra: dict[str, Any] = dict(row[5]) if len(row) > 5 else {}
            if extra.get("schedule") is not None:  # the one extra that is a model
                extra["schedule"] = Schedule.model_validate(extra["schedule"])
            job = Job.model_construct(
                id=job_id, name=name, priority=priority, groups=shared, **extra
            )
            out.append((job_id, job))
        return out


class WriteJobsIn(_Msg):
    """Job writes queued by updates (submit, scale, stop) and the autoscaler since
    the last pass, written in one transaction: one activity per pass, not per job."""

    cluster: str
    put: list[Job] = Field(default_factory=list)
    delete: list[str] = Field(default_factory=list)


class Intake(_Msg):
    """What the loop saw when it woke (``workflows.mail``): recorded by a local
    activity that hands it back, so a replay takes the same handler items, the same
    watch news and the same clock, whatever activation its handlers ran in."""

    now: float = Field(description="workflow time the loop woke at (epoch seconds)")
    mail: int = Field(ge=0, description="handler items posted so far")
    watch: bool = Field(description="the store watch had returned")
    due: bool = Field(description="continue-as-new was due")
    idle: bool = Field(default=False, description="no handler was running")


class WriteJobsOut(_Msg):
    revision: int
    missing: list[str] = Field(default_factory=list, description="deletes of unknown jobs")


class PersistIn(_Msg):
    cluster: str
    generation: int
    pass_no: int
    bind: list[BindRow] = Field(default_factory=list)
    release: list[str] = Field(default_factory=list)
    nodes_upsert: list[Node] = Field(default_factory=list)
    nodes_remove: list[str] = Field(default_factory=list)
    status: str | None = None  # forge.wire.contract.LoopStatus as JSON, stored as it is
    #: how long the pass's planning activation ran (wall clock, measured by the
    #: worker): returned in the result, so history holds it (forge.core.budget)
    plan_seconds: float | None = Field(default=None, exclude_if=lambda v: v is None)
    #: the run's other workflow work since the last persist (updates parsed, pages
    #: loaded), measured the same way and returned the same way: what a replay of
    #: the run costs, counted by time (workflows.patches.REPLAY_SECONDS)
    work_seconds: float | None = Field(default=None, exclude_if=lambda v: v is None)
    #: batch replicas that completed, released in this persist too (left out when none)
    complete: list[str] = Field(default_factory=list, exclude_if=lambda v: not v)
    #: the cluster's queues, all of them, when a change since the run's last persist
    #: made them differ from the store's (left out when None: unchanged)
    queues: list[QueueSpec] | None = Field(default=None, exclude_if=lambda v: v is None)


class WatchIn(_Msg):
    cluster: str
    jobs_revision: int
    reports_seq: int
    heartbeat_ttl: float
    max_seconds: float
    poll: float


class WatchOut(_Msg):
    jobs_revision: int
    reports_seq: int
    expired: list[str] = Field(default_factory=list)
    reason: str = ""


class ReportsIn(_Msg):
    cluster: str
    seq: int
    limit: int = 5000


class ReportsOut(_Msg):
    statuses: list[tuple[str, str]] = Field(default_factory=list)  # (workload id, status)
    last_seq: int
    nodes: dict[str, str] = Field(
        default_factory=dict, description="workload id -> the node its latest report names"
    )
    health: dict[str, bool] = Field(
        default_factory=dict,
        description="workload id -> the latest health verdict in the page (a running "
        "replica's check passed or failed); left out of the JSON when empty",
    )
    failures: dict[str, str] = Field(
        default_factory=dict,
        description="workload id -> the message of its latest report when that says "
        "it failed (its exit status); a batch job failed for good shows it; left out "
        "of the JSON when empty",
    )

    exit_codes: dict[str, int] = Field(
        default_factory=dict,
        description="workload id -> the exit status its latest report gives when that "
        "says it failed and gives one (a batch group's fail_on_exit reads it); left "
        "out of the JSON when empty",
    )

    _omit = omit_defaults("health", "failures", "exit_codes")


class MetricsIn(_Msg):
    cluster: str
    groups: list[str]
    window: float = 300.0


class MetricsOut(_Msg):
    usage: dict[str, tuple[float, float]] = Field(default_factory=dict)
    #: The groups whose agents measured their GPUs (absent: unknown, not idle); a
    #: field of its own so the histories recorded before it read as they did.
    gpu: dict[str, float] = Field(default_factory=dict)

    _omit = omit_defaults("gpu")


class GroupSpecIn(_Msg):
    """A group's task spec at a version (a revert's target)."""

    cluster: str
    job_id: str
    group: str
    version: str


class GroupSpecOut(_Msg):
    spec: TaskGroup | None = Field(default=None, description="None: the store has no such version")


def row_from_assignment(a: Assignment | AssignmentRow) -> BindRow:
    """The bind row of a validated assignment or of a store's unvalidated row (the
    same fields: the activities build rows from the latter without a model)."""
    row = (a.job, a.group, a.ordinal, a.node, tuple(a.gpu_ids), a.cpu, a.memory, str(a.status))
    if a.version:
        return (*row, a.gpu_milli, a.version)
    return (*row, a.gpu_milli) if a.gpu_milli else row


def assignment_from_row(row: BindRow, *, validate: bool) -> Assignment:
    job, group, ordinal, node, gpu_ids, cpu, memory, status = row[:8]
    milli = row[8] if len(row) > 8 else 0
    version = str(row[-1]) if len(row) == 10 else ""
    fields: dict[str, Any] = {
        "workload_id": f"{job}/{group}/{ordinal}",
        "job": job,
        "group": group,
        "ordinal": ordinal,
        "node": node,
        "gpu_ids": tuple(gpu_ids),
        "cpu": cpu,
        "memory": memory,
        "status": AssignmentStatus(status),
        "gpu_milli": milli,
        "version": version,
    }
    return Assignment.model_validate(fields) if validate else Assignment.model_construct(**fields)


def to_delta(p: PersistIn, *, validate: bool) -> Delta:
    """The store-level delta of a persist (the workflow builds it without
    validation to compute the digest it expects back)."""
    binds = [assignment_from_row(r, validate=validate) for r in p.bind]
    if validate:
        return Delta(
            bind=binds,
            release=list(p.release),
            nodes_upsert=list(p.nodes_upsert),
            nodes_remove=list(p.nodes_remove),
            status=p.status,
            complete=list(p.complete),
            queues=p.queues,
        )
    return Delta.model_construct(
        bind=binds,
        release=list(p.release),
        nodes_upsert=list(p.nodes_upsert),
        nodes_remove=list(p.nodes_remove),
        status=p.status,
        complete=list(p.complete),
        queues=p.queues,
    )
