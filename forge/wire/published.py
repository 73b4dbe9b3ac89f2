"""The read side of the cluster workflow's interface: what the loop publishes and
what a reader gets back.

Each pass that changes something publishes a :class:`LoopStatus` (to the store,
with its delta) and a :class:`Summary` (to the memo); ``forge status``, ``explain``
and :class:`~forge.client.client.ForgeClient` read them there and build the views
below, as the workflow's queries do for an operator. Kept apart from
:mod:`forge.wire.contract` (which re-exports every name) so that the requests and
the state a run carries read in one screen; renaming anything here is a wire
change as well.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from forge.core.kinds import phase
from forge.core.models import Job
from forge.serialize import omit_defaults
from forge.wire.queues import QueueView

__all__ = [
    "RECENT_PREEMPTIONS",
    "AssignmentView",
    "AssignmentsPage",
    "AssignmentsQuery",
    "Explanation",
    "GpuView",
    "JobState",
    "LoopStatus",
    "NodeView",
    "PendingView",
    "PreemptionView",
    "ResourceView",
    "RolloutView",
    "StatusView",
    "Summary",
    "job_state",
]


class _Msg(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class PreemptionView(_Msg):
    """One preemption: ``preemptor`` bound to ``node`` in place of ``victims``."""

    preemptor: str
    node: str
    victims: list[str]
    at: float


#: The preemptions the loop keeps (status, explain): the most recent.
RECENT_PREEMPTIONS = 50


class Summary(_Msg):
    desired: int
    bound: int
    pending: int
    nodes: int
    jobs: int
    passes: int
    generation: int
    last_pass_at: float | None
    last_pass: str

    @classmethod
    def empty(cls) -> Summary:
        """Before the loop has published anything."""
        return cls(
            desired=0,
            bound=0,
            pending=0,
            nodes=0,
            jobs=0,
            passes=0,
            generation=0,
            last_pass_at=None,
            last_pass="nothing published yet",
        )


class ResourceView(_Msg):
    capacity: int
    allocated: int


class GpuView(_Msg):
    total: int
    allocated: int


class NodeView(_Msg):
    id: str
    state: str
    cpu: ResourceView
    memory: ResourceView
    gpus: GpuView
    replicas: int


class AssignmentView(_Msg):
    workload_id: str
    node: str
    gpu_ids: list[str]
    status: str


class PendingView(_Msg):
    workload_id: str
    reasons: list[str]
    kind: str
    attempts: int
    not_before: float


class StatusView(_Msg):
    summary: Summary
    nodes: list[NodeView]
    pending: list[PendingView]
    pending_truncated: int = 0
    notices: list[str] = Field(
        default_factory=list, description="what needs an operator (a stuck run, dropped input)"
    )
    preemptions: int = Field(default=0, description="replicas preempted since the start")
    resets: int = Field(default=0, description="runs the workers' watchdog reset (stuck)")
    last_reset: str = Field(default="", description="why the last reset happened")
    queues: list[QueueView] = Field(
        default_factory=list, description="each queue's quota, usage and waiting replicas"
    )


class RolloutView(_Msg):
    """One group's rollout as the loop last planned it."""

    group: str = Field(description="job/group")
    version: str = Field(description="the version the group moves to")
    previous: str = Field(description="the last version that was healthy (revert target)")
    phase: str = Field(description="rolling, awaiting-promotion, failed, revert")
    waiting: str = Field(default="", description="why nothing more happens now")
    promoted: bool = False
    healthy: int = Field(default=0, description="replicas healthy now, any version")
    updated: int = Field(default=0, description="replicas on the new version counted healthy")


class JobState(_Msg):
    """The ``job_state`` query's answer: where a job stands as the loop holds it, for
    clients without the store (a TypeScript service waiting for a batch job)."""

    job_id: str
    type: str
    state: Literal["running", "complete", "failed", "service"] = Field(
        description="a batch job's phase; 'service' for work that runs until stopped"
    )
    desired: int = Field(description="runs (a batch job) or replicas wanted")
    complete: int = Field(description="runs complete (0 for a service)")
    bound: int = Field(description="replicas bound now")
    what: str = Field(description="the line forge job wait prints")


class LoopStatus(_Msg):
    """What the loop publishes each pass that changed something: written to the
    store in the same transaction as the pass's delta, so a reader of the store
    sees bindings, nodes and this status from one and the same pass. Forge's own
    readers (``forge status``, ``explain``, the client) use it instead of a query
    (a query during a worker takeover can wedge replay: see RELIABILITY.md)."""

    summary: Summary
    pending: list[PendingView] = Field(default_factory=list, description="the first few")
    pending_truncated: int = 0
    reasons: list[tuple[str, int]] = Field(
        default_factory=list, description="why replicas wait: reason, replicas (top few)"
    )
    deferred: int = Field(default=0, description="replicas the work budget left for next pass")
    notices: list[str] = Field(
        default_factory=list, description="what an operator should know: dropped signals ..."
    )
    state_digest: str = Field(
        default="",
        description="forge.stores.base.state_digest of the workflow's bindings after the "
        "pass: equal to the store's own when the store holds exactly those bindings",
    )
    rollouts: list[RolloutView] = Field(
        default_factory=list,
        description="rolling updates in progress (left out of the JSON when there are none: "
        "the status is in the persist digest, which recorded histories must reproduce)",
    )
    preemptions: int = Field(default=0, description="preemptions since the cluster started")
    recent_preemptions: list[PreemptionView] = Field(
        default_factory=list, description="the most recent preemptions, oldest first"
    )
    resets: int = Field(
        default=0, description="runs the workers' watchdog reset since the cluster started"
    )
    last_reset: str = Field(default="", description="the last reset's cause")
    failed_jobs: dict[str, str] = Field(
        default_factory=dict,
        description="batch jobs that failed for good (a run's reschedule attempts "
        "exhausted): job id -> the run and why (forge job wait reads it)",
    )
    tolerated_failures: dict[str, int] = Field(
        default_factory=dict,
        description="batch jobs' runs failed for good within their groups' "
        "scaling.max_failed: job id -> runs (the job completes without them)",
    )

    removed_jobs: dict[str, JobState] = Field(
        default_factory=dict,
        description="batch jobs their ttl_after_finished removed (the latest 100): job id "
        "-> its last state (forge job wait reads it once the job is gone)",
    )
    queues: list[QueueView] = Field(
        default_factory=list,
        description="each queue's quota, what its bound replicas hold and how many the "
        "pass left queued (left out when the cluster has no queues)",
    )

    _omit = omit_defaults(
        "rollouts",
        "preemptions",
        "recent_preemptions",
        "resets",
        "last_reset",
        "failed_jobs",
        "tolerated_failures",
        "removed_jobs",
        "queues",
    )


class AssignmentsQuery(_Msg):
    after: str = ""
    limit: int = Field(default=1000, ge=1, le=10_000)
    node: str | None = None


class AssignmentsPage(_Msg):
    items: list[AssignmentView]
    next_after: str | None


class Explanation(_Msg):
    workload_id: str
    state: Literal["bound", "pending", "complete", "unknown"]
    node: str | None = None
    gpu_ids: list[str] = Field(default_factory=list)
    reasons: list[str] = Field(default_factory=list)
    nodes: list[str] = Field(default_factory=list, description="per-node verdicts (top few)")


def job_state(
    job: Job, *, complete: int, bound: int, failed: str | None, tolerated: int
) -> JobState:
    """A job's :class:`JobState` from its counts, one rule whoever counted them (the
    loop for the query, the store for ``forge job wait``): a service says so; a batch
    job's phase is :func:`forge.core.kinds.phase`'s."""
    desired = sum(g.scaling.desired for g in job.groups)
    if job.type != "batch":
        state, what = "service", f"job {job.id} is a {job.type} job: it runs until stopped"
        complete = 0
    else:
        state, what = phase(desired, complete, failed, tolerated)
    return JobState(
        job_id=job.id, type=job.type, state=state, desired=desired, complete=complete,
        bound=bound, what=what,
    )  # fmt: skip
