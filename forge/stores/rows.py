"""The rows the stores hold and the workflow exchanges with them: the errors, the
fence, a pass's delta, job changes and pages, group versions and task reports.

Plain pydantic models (frozen, no extra fields) that cross Temporal in activity
payloads; ``forge.stores.base`` re-exports every one, and that is where to import
them from.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer

from forge.core.models import Assignment, Job, Node, TaskGroup
from forge.core.quota import QueueSpec
from forge.errors import STORE_ERROR, Conflict, ForgeError

__all__ = [
    "ApplyResult",
    "AssignmentRow",
    "Delta",
    "Fence",
    "GroupUsage",
    "GroupVersion",
    "JobChange",
    "JobPage",
    "SpecPage",
    "StaleFenceError",
    "StoreError",
    "TaskReport",
]


class StoreError(ForgeError):
    """A store operation failed in a way a retry will not fix (bad data, conflict)."""

    wire_type = STORE_ERROR


class StaleFenceError(StoreError, Conflict):
    """A delta from an older pass arrived after a newer one was applied: refused."""

    wire_type = Conflict.wire_type


class Fence(NamedTuple):
    """Orders persists: ``generation`` grows with each workflow run (continue-as-new
    or restart), ``pass_no`` with each pass within a run. Tuples compare in order."""

    generation: int
    pass_no: int


class _Wire(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class JobChange(_Wire):
    revision: int
    job_id: str
    job: Job | None  # None: the job was deleted (a tombstone)


class JobPage(_Wire):
    changes: list[JobChange]
    revision: int = Field(description="the highest revision this page covers")
    more: bool


class AssignmentRow(NamedTuple):
    """An assignment as the store holds it, unvalidated (``Store.assignment_rows``)."""

    workload_id: str
    job: str
    group: str
    ordinal: int
    node: str
    gpu_ids: tuple[str, ...]
    cpu: int
    memory: int
    status: str
    gpu_milli: int
    version: str


class SpecPage(NamedTuple):
    """Job changes as the store holds them: ``(revision, job id, spec JSON or None
    for a tombstone)``, oldest first. What a new run's reload reads: the activity
    parses each distinct group once instead of every job (``JobPage`` would build
    a validated model per row)."""

    rows: list[tuple[int, str, str | None]]
    revision: int
    more: bool


class Delta(_Wire):
    """What one pass changed. ``bind`` upserts (new bindings and status changes).

    Stores apply the parts in this order: ``release``, ``bind``, ``nodes_remove``,
    ``nodes_upsert`` -- so releasing and binding one replica in the same delta moves
    it, and a node both removed and upserted ends up registered.
    """

    bind: list[Assignment] = Field(default_factory=list)
    release: list[str] = Field(default_factory=list)
    nodes_upsert: list[Node] = Field(default_factory=list)
    nodes_remove: list[str] = Field(default_factory=list)
    status: str | None = Field(
        default=None,
        description="the loop's published status (JSON, opaque to the store), replaced "
        "in the same transaction; not part of the digest",
    )
    complete: list[str] = Field(
        default_factory=list,
        description="batch replicas that completed (released in this delta too): "
        "recorded for good, until their job is deleted; not part of the digest",
    )
    queues: list[QueueSpec] | None = Field(
        default=None,
        description="the cluster's queues, all of them, replacing those stored (None: "
        "unchanged), so a run started afresh on the store gets them back; not part "
        "of the digest",
    )

    def is_empty(self) -> bool:
        return not (
            self.bind or self.release or self.nodes_upsert or self.nodes_remove or self.complete
        )


class GroupVersion(_Wire):
    """One accepted version of a group's task spec, numbered per group from 1.

    A job write whose group's tasks (``TaskGroup.version``) differ from the group's
    latest version adds one; ``changed`` says what (``forge.core.versions``)."""

    job_id: str
    group: str
    number: int
    version: str
    revision: int = Field(description="the job revision that brought it")
    changed: str
    spec: TaskGroup


class ApplyResult(_Wire):
    applied: bool = Field(description="False when this fence was already applied (a retry)")
    digest: str
    #: the persist activity's echo of ``PersistIn.plan_seconds`` (forge.core.budget):
    #: what the pass's planning took, recorded in history; absent from stores' results
    plan_seconds: float | None = Field(default=None, exclude_if=lambda v: v is None)
    #: the echo of ``PersistIn.work_seconds`` (workflows.patches.REPLAY_SECONDS)
    work_seconds: float | None = Field(default=None, exclude_if=lambda v: v is None)


class TaskReport(_Wire):
    """A task agent's report about one replica. ``seq`` is assigned by the store."""

    seq: int = 0
    workload_id: str
    status: str = Field(pattern="^(running|failed|exited)$")
    cpu: float | None = Field(default=None, ge=0, description="cpu utilisation 0..1+")
    memory: float | None = Field(default=None, ge=0, description="memory utilisation 0..1+")
    gpu: float | None = Field(
        default=None,
        ge=0,
        description="the busy fraction of the replica's GPUs 0..1+ (a share's: of its "
        "share), sent with cpu and memory by an agent that can measure its devices; None: "
        "not measured (left out of the JSON then)",
    )
    at: float
    message: str = Field(default="", max_length=1024)
    node: str = Field(
        default="",
        max_length=253,
        description="the node the replica ran on ('' = not said): a failure for a "
        "replica bound elsewhere by now is ignored",
    )
    healthy: bool | None = Field(
        default=None,
        description="a running replica's health check passed (True) or failed (False); "
        "None: its task declares no check (left out of the JSON then)",
    )
    exit_code: int | None = Field(
        default=None,
        ge=-255,
        le=255,
        description="an ended replica's exit status, from the first of its tasks to "
        "end (negative: killed by that signal); None: not ended, or not known (left "
        "out of the JSON then). A batch group's fail_on_exit reads it",
    )

    @model_serializer(mode="wrap")
    def _omit_unset(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        if isinstance(data, dict):
            for name in ("healthy", "exit_code", "gpu"):
                if data.get(name, 0) is None:
                    del data[name]
        return data


class GroupUsage(NamedTuple):
    """A group's mean utilisation: cpu and memory (0.0 when no replica said), and
    gpu, None when no replica's agent measured its devices (a group without GPUs,
    or GPUs only declared): unknown is not idle."""

    cpu: float
    memory: float
    gpu: float | None = None
