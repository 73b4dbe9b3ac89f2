"""The cluster workflow's interface: names and payload models.

Both sides import this module and nothing else of each other: the client
(``forge.client.client``) sends these signals, updates and queries by name, and the
workflow (``workflows.cluster``) implements them. Renaming anything here is a
wire change. The read side (what the loop publishes, the views a reader gets) is
:mod:`forge.wire.published`, re-exported here.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from forge.core.autoscale import AutoscaleState
from forge.core.fields import IntAsStr
from forge.core.models import MAX_REPLICAS, Job, Name, Node
from forge.core.quota import QueueSpec
from forge.core.reconcile import FailureHistory, PendingEntry, ReconcileOptions
from forge.core.rolling import GroupRollout
from forge.serialize import omit_defaults
from forge.wire.names import workflow_id
from forge.wire.published import (
    RECENT_PREEMPTIONS,
    AssignmentsPage,
    AssignmentsQuery,
    AssignmentView,
    Explanation,
    GpuView,
    JobState,
    LoopStatus,
    NodeView,
    PendingView,
    PreemptionView,
    ResourceView,
    RolloutView,
    StatusView,
    Summary,
    job_state,
)

__all__ = [
    "MAX_JOBS_PER_UPDATE",
    "MAX_NODES_PER_SIGNAL",
    "MAX_WORKLOADS_PER_UPDATE",
    "MEMO_STALLED",
    "MEMO_SUMMARY",
    "QUERY_ASSIGNMENTS",
    "QUERY_EXPLAIN",
    "QUERY_JOB_STATE",
    "QUERY_STATUS",
    "RECENT_PREEMPTIONS",
    "SA_BOUND",
    "SA_CLUSTER",
    "SA_NODES",
    "SA_PENDING",
    "SIGNAL_LOOP_BUDGET",
    "SIGNAL_LOOP_RESET",
    "SIGNAL_NODE_LOST",
    "SIGNAL_REGISTER_NODE",
    "SIGNAL_REMOVE_NODE",
    "TASK_QUEUE",
    "UPDATE_DRAIN_NODE",
    "UPDATE_PROMOTE",
    "UPDATE_REPORT_FAILED",
    "UPDATE_SCALE",
    "UPDATE_STOP_JOB",
    "UPDATE_SUBMIT_JOB",
    "UPDATE_SUBMIT_JOBS",
    "WORKFLOW_TYPE",
    "AssignmentView",
    "AssignmentsPage",
    "AssignmentsQuery",
    "Checkpoint",
    "ClusterInput",
    "ClusterOptions",
    "DrainNode",
    "DrainOp",
    "Explanation",
    "GpuView",
    "JobResult",
    "JobState",
    "LoopBudget",
    "LoopReset",
    "LoopStatus",
    "LostOp",
    "NodeOp",
    "NodeRef",
    "NodeView",
    "PendingView",
    "PreemptionView",
    "Promote",
    "PromoteResult",
    "RegisterNodes",
    "RegisterOp",
    "RemoveOp",
    "ReportFailed",
    "ReportFailedResult",
    "ResourceView",
    "RolloutView",
    "ScaleGroup",
    "StatusView",
    "StopJob",
    "SubmitJob",
    "SubmitJobs",
    "Summary",
    "job_state",
    "workflow_id",
]

WORKFLOW_TYPE = "ClusterWorkflow"
TASK_QUEUE = "forge"

SIGNAL_REGISTER_NODE = "register_node"
SIGNAL_REMOVE_NODE = "remove_node"
SIGNAL_NODE_LOST = "node_lost"
#: The watchdog's: plan passes with a smaller work budget (after repeated deadlocks).
SIGNAL_LOOP_BUDGET = "loop_budget"
#: The watchdog's: this run is a reset of a stuck one (counted, shown by status).
SIGNAL_LOOP_RESET = "loop_reset"

UPDATE_SUBMIT_JOB = "submit_job"
UPDATE_SUBMIT_JOBS = "submit_jobs"
UPDATE_SCALE = "scale"
UPDATE_STOP_JOB = "stop_job"
UPDATE_DRAIN_NODE = "drain_node"
UPDATE_REPORT_FAILED = "report_failed"
UPDATE_PROMOTE = "promote"

QUERY_STATUS = "status"
QUERY_ASSIGNMENTS = "assignments"
QUERY_EXPLAIN = "explain"
QUERY_JOB_STATE = "job_state"

# Search attributes the workflow keeps current (registered by `forge dev` and by
# the worker at start where the server allows it).
SA_CLUSTER = "ForgeCluster"
SA_PENDING = "ForgePending"
SA_BOUND = "ForgeBound"
SA_NODES = "ForgeNodes"

#: One signal carries at most this many nodes (a history event stays well under
#: the payload limit); the client batches larger registrations.
MAX_NODES_PER_SIGNAL = 500
MAX_WORKLOADS_PER_UPDATE = 1000
#: Jobs per `submit_jobs` update: a batch of small specs stays far below the 2 MiB
#: payload limit, and bulk loads need few round trips.
MAX_JOBS_PER_UPDATE = 1000


#: The memo key under which the loop publishes its ``Summary`` (for describe()).
MEMO_SUMMARY = "forge"
#: Set while the loop waits for a failing store (``{"since", "activity", "error"}``
#: of the first failure; removed once a call succeeds): what the watchdog and
#: ``forge status`` show as "stuck since ...: store error: ...".
MEMO_STALLED = "forge-stalled"


class _Msg(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


# -- workflow input and what continue-as-new carries ----------------------------------


class ClusterOptions(_Msg):
    """Tunables of the loop. Defaults suit production; tests shrink them."""

    reconcile: ReconcileOptions = ReconcileOptions()
    heartbeat_ttl: float = Field(default=30.0, gt=0, description="node lost after this silence")
    watch: bool = Field(
        default=True, description="run the store watch (heartbeats, reports, outside writes)"
    )
    watch_seconds: float = Field(
        default=900.0, gt=0, description="longest a store watch runs before it returns"
    )
    watch_poll: float = Field(default=0.5, gt=0, description="store poll period of the watch")
    resync_seconds: float = Field(default=3600.0, gt=0, description="full job reload period")
    job_page: int = Field(default=5000, ge=1)
    snapshot_page: int = Field(default=10_000, ge=1)
    report_page: int = Field(default=5000, ge=1)
    max_passes_per_run: int = Field(
        default=0, ge=0, description="continue-as-new after this many passes (0: when suggested)"
    )
    max_replay_cost: int = Field(
        default=10_000_000,
        ge=1,
        description="continue-as-new after passes examined this many replicas",
    )
    max_replay_seconds: float = Field(
        default=2.5,
        gt=0,
        description="continue-as-new once the run's recorded workflow work took this long",
    )
    max_updates_per_run: int = Field(
        default=1000, ge=1, description="continue-as-new after this many updates (server cap 2,000)"
    )
    max_history_events: int = Field(default=20_000, ge=100)
    max_history_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    carry_backoff_limit: int = Field(default=10_000, ge=0)


class Checkpoint(_Msg):
    """What one run hands the next. Nodes, jobs and bindings are not here: they are
    in the store (written by every pass before a continue-as-new) and the new run
    reloads them in pages, so this payload does not grow with the cluster."""

    generation: int
    pending: dict[str, PendingEntry] = Field(default_factory=dict)
    failures: dict[str, FailureHistory] = Field(default_factory=dict)
    autoscale: dict[str, AutoscaleState] = Field(default_factory=dict)
    autoscale_evaluated: dict[str, float] = Field(default_factory=dict)
    reports_seq: int = 0
    last_resync: float = 0.0
    runs: int = 0
    signals_dropped: int = 0
    last_dropped: str = ""
    # rolling updates: each group's rollout, and when its replicas' health began
    rollouts: dict[str, GroupRollout] = Field(default_factory=dict)
    since: dict[str, float] = Field(default_factory=dict)
    # health checks (rollouts-3): rolling groups' replicas' check verdicts; left out
    # of the JSON when empty
    health: dict[str, bool] = Field(default_factory=dict)
    #: a pass's work budget set by the watchdog after repeated deadlocks (0: default)
    max_work: int = 0
    #: preemptions so far, and the most recent (RECENT_PREEMPTIONS)
    preemptions: int = 0
    recent_preemptions: list[PreemptionView] = Field(default_factory=list)
    #: the pass budget the last run's timings led to (forge.core.budget; 0: default)
    pass_budget: int = 0
    #: runs the watchdog reset so far, the last one's cause, and the run it left
    resets: int = 0
    last_reset: str = ""
    last_reset_run: str = ""
    #: batch gangs' members that exited 0 while the rest still run (workflows.batch):
    #: a gang completes whole, and these will not report again
    exited: dict[str, str] = Field(default_factory=dict)
    #: batch jobs failed for good: job id -> the run and why
    batch_failed: dict[str, str] = Field(default_factory=dict)
    #: of those, the ones whose runs are all stopped (workflows.batch.end)
    batch_ended: dict[str, None] = Field(default_factory=dict)
    #: batch runs failed for good within their group's max_failed: job -> group -> runs
    batch_tolerated: dict[str, dict[str, int]] = Field(default_factory=dict)
    #: when the loop first saw each batch job with an active_deadline still running
    batch_started: dict[str, float] = Field(default_factory=dict)
    #: when each batch job with a ttl_after_finished finished (workflows.batch)
    batch_finished: dict[str, float] = Field(default_factory=dict)
    #: the last state of the jobs their ttl removed, the latest REMOVED_KEPT
    batch_removed: dict[str, JobState] = Field(default_factory=dict)
    #: the cluster's queues by name (forge.core.quota)
    queues: dict[str, QueueSpec] = Field(default_factory=dict)

    _omit = omit_defaults(
        "queues",
        "exited",
        "batch_failed",
        "batch_ended",
        "batch_tolerated",
        "batch_started",
        "batch_finished",
        "batch_removed",
        "health",
        "max_work",
        "preemptions",
        "recent_preemptions",
        "pass_budget",
        "resets",
        "last_reset",
        "last_reset_run",
    )


class ClusterInput(_Msg):
    cluster: Name
    options: ClusterOptions = ClusterOptions()
    checkpoint: Checkpoint | None = None


# -- signals ------------------------------------------------------------------------


class RegisterNodes(_Msg):
    nodes: list[Node] = Field(min_length=1, max_length=MAX_NODES_PER_SIGNAL)


class NodeRef(_Msg):
    node_id: Annotated[str, IntAsStr]  # as Node.id: 7 is "7"


class LoopBudget(_Msg):
    """A pass's work budget (forge.core.reconcile.MAX_WORK units), for this run and
    the runs it continues as."""

    max_work: int = Field(ge=10_000, le=100_000_000)


class LoopReset(_Msg):
    """The watchdog reset a stuck run into this one: which run it left and why. A
    second report of the same reset (two workers raced to make it) counts once."""

    from_run: str = Field(min_length=1, max_length=100)
    cause: str = Field(max_length=300)


# -- node operations: what the signals and drain_node ask of the next pass --------------
# Queued in arrival order by the handlers and applied by a pass. They live in the
# workflow's memory only (the signals carry RegisterNodes / NodeRef), but are typed
# like the wire so that an operation is one value a pass can match on.


class RegisterOp(_Msg):
    op: Literal["register"] = "register"
    node: Node


class RemoveOp(_Msg):
    op: Literal["remove"] = "remove"
    node_id: str


class LostOp(_Msg):
    op: Literal["lost"] = "lost"
    node_id: str


class DrainOp(_Msg):
    op: Literal["drain"] = "drain"
    node_id: str


NodeOp = Annotated[RegisterOp | RemoveOp | LostOp | DrainOp, Field(discriminator="op")]


# -- updates ------------------------------------------------------------------------


class SubmitJob(_Msg):
    job: Job
    wait: bool = Field(
        default=True,
        description="return after the pass that planned it; False: once accepted (durable)",
    )


class SubmitJobs(_Msg):
    jobs: list[Job] = Field(min_length=1, max_length=MAX_JOBS_PER_UPDATE)
    wait: bool = False


class ScaleGroup(_Msg):
    job_id: str
    group: str
    count: int = Field(ge=0, le=MAX_REPLICAS)


class StopJob(_Msg):
    job_id: str


class DrainNode(_Msg):
    node_id: str


class ReportFailed(_Msg):
    workload_ids: list[str] = Field(min_length=1, max_length=MAX_WORKLOADS_PER_UPDATE)
    on: dict[str, str] = Field(
        default_factory=dict,
        description="workload id -> the node it failed on: the report then applies to "
        "that binding only (one replayed after the replica moved changes nothing)",
    )


class Promote(_Msg):
    """Release a canary's hold: the group's rollout goes on past its canaries."""

    job_id: str
    group: str | None = Field(default=None, description="None: every group of the job waiting")


class PromoteResult(_Msg):
    promoted: list[str] = Field(description="the groups promoted, as job/group")


class JobResult(_Msg):
    job_id: str
    revision: int
    desired: int
    bound: int
    pending: int


class ReportFailedResult(_Msg):
    accepted: int
