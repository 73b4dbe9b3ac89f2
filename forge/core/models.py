"""The vocabulary of Forge: jobs, nodes, assignments and the plan of a pass.

Jobs (groups, tasks, their resources and policies) and a replica's request are
defined here; nodes (:mod:`forge.core.nodes`), placement rules
(:mod:`forge.core.constraints`), bindings (:mod:`forge.core.assignments`), field
types (:mod:`forge.core.fields`) and limits (:mod:`forge.core.limits`) live beside
them and are importable from here. Every model is strict (no coercion of ``"500"``
into 500) and forbids unknown fields: a typo in a job file is an error naming the
field, not a setting that silently does nothing. All export JSON Schema.

Units: cpu in millicores, memory in MiB, GPU memory in MiB, times in seconds.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from functools import cached_property
from typing import Annotated, Any, Literal, Self

from pydantic import Field, Strict, field_validator, model_validator

from forge.core.assignments import Assignment, AssignmentStatus, Pending, workload_id
from forge.core.checks import STOP_GRACE, HealthCheck, HttpCheck, PortName, TcpCheck
from forge.core.constraints import Constraint, SpreadRule
from forge.core.fields import (
    Bool,
    Cpu,
    Evolving,
    Float,
    Int,
    Memory,
    Model,
    Name,
    Seconds,
    ShortStr,
)
from forge.core.kinds import JobType, check_kind, kind_defaults
from forge.core.limits import (
    GPU_MILLI,
    MAX_ARGS,
    MAX_BATCH_BYTES,
    MAX_CPU,
    MAX_ENV,
    MAX_GPUS,
    MAX_GROUPS,
    MAX_JOB_BYTES,
    MAX_LABELS,
    MAX_MEMORY,
    MAX_REPLICAS,
    MAX_STRING,
    MAX_TAINTS,
    MAX_TASKS,
    NAME_PATTERN,
    is_valid_name,
)
from forge.core.nodes import GpuDevice, Node, NodeState, Taint, Toleration, tolerated
from forge.core.periodic import Schedule, check_periodic
from forge.core.policies import (
    AutoscalePolicy,
    DelayFunction,
    DisruptionBudget,
    ReschedulePolicy,
    ScalingPolicy,
)
from forge.core.quota import DEFAULT_QUEUE
from forge.core.request import Request
from forge.core.rollout import UpdatePolicy

__all__ = [
    "GPU_MILLI",
    "MAX_ARGS",
    "MAX_BATCH_BYTES",
    "MAX_CPU",
    "MAX_ENV",
    "MAX_GPUS",
    "MAX_GROUPS",
    "MAX_JOB_BYTES",
    "MAX_LABELS",
    "MAX_MEMORY",
    "MAX_REPLICAS",
    "MAX_STRING",
    "MAX_TAINTS",
    "MAX_TASKS",
    "NAME_PATTERN",
    "STOP_GRACE",
    "Assignment",
    "AssignmentStatus",
    "AutoscalePolicy",
    "Bool",
    "Constraint",
    "Cpu",
    "DelayFunction",
    "DisruptionBudget",
    "Float",
    "GpuDevice",
    "GpuRequest",
    "HealthCheck",
    "HttpCheck",
    "Int",
    "Job",
    "Memory",
    "Name",
    "Node",
    "NodeState",
    "Pending",
    "Request",
    "ReschedulePolicy",
    "Resources",
    "ScalingPolicy",
    "Seconds",
    "ShortStr",
    "SpreadRule",
    "Taint",
    "Task",
    "TaskGroup",
    "TcpCheck",
    "Toleration",
    "UpdatePolicy",
    "is_valid_name",
    "tolerated",
    "workload_id",
]


class GpuRequest(Evolving):
    """GPUs one task needs: whole devices, each with at least ``memory`` MiB.

    ``milli`` asks a share of one device instead (``{count: 1, milli: 300}``: 30%
    of one GPU, the Alibaba trace's ``gpu_milli``); several shared tasks then fit
    on one device as long as their shares sum to at most 1000. 0 (the default) and
    1000 both mean whole devices, so a spec written before sharing existed keeps
    its meaning.
    """

    _new_fields = ("milli",)

    count: Int = Field(default=0, ge=0, le=MAX_GPUS)
    milli: Int = Field(default=0, ge=0, le=GPU_MILLI)
    memory: Memory = 0
    models: tuple[Name, ...] = Field(default=(), max_length=32)

    @model_validator(mode="after")
    def _share_of_one(self) -> Self:
        if 0 < self.milli < GPU_MILLI and self.count != 1:
            raise ValueError(
                f"a GPU share (milli {self.milli}) is a share of one device: count must be 1, "
                f"got {self.count}"
            )
        return self

    @property
    def shared(self) -> int:
        """The share of one device this task asks (1..999), 0 for whole devices."""
        return self.milli if 0 < self.milli < GPU_MILLI else 0


class Resources(Model):
    cpu: Cpu = Field(gt=0)
    memory: Memory = Field(gt=0)
    gpu: GpuRequest = GpuRequest()


class Task(Evolving):
    """One process of a replica. ``ports`` and ``stop_grace`` came after recorded
    histories and stored jobs: left at their defaults they are not dumped, so an
    existing job's JSON (and every digest over it) stays byte-identical."""

    _new_fields = ("ports", "stop_grace", "check")

    name: Name
    command: tuple[ShortStr, ...] | None = Field(default=None, max_length=MAX_ARGS)
    args: tuple[ShortStr, ...] = Field(default=(), max_length=MAX_ARGS)
    env: dict[ShortStr, ShortStr] = Field(default_factory=dict, max_length=MAX_ENV)
    resources: Resources
    ports: tuple[PortName, ...] = Field(default=(), max_length=32)
    stop_grace: Annotated[float, Strict(), Field(ge=0, le=3600)] = STOP_GRACE
    check: HealthCheck | None = None

    @model_validator(mode="after")
    def _check_port_named(self) -> Self:
        if self.check is None:
            return self
        probe = self.check.http or self.check.tcp
        port = probe.port if probe is not None else None
        if isinstance(port, str) and port.upper() not in {p.upper() for p in self.ports}:
            raise ValueError(f"check port {port!r} is not one of the task's ports")
        return self

    @field_validator("ports")
    @classmethod
    def _unique_ports(cls, ports: tuple[str, ...]) -> tuple[str, ...]:
        upper = [p.upper() for p in ports]
        dupes = sorted({p for p in upper if upper.count(p) > 1})
        if dupes:
            raise ValueError(f"port names must be unique (ignoring case): {', '.join(dupes)}")
        return ports

    @field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, str]) -> dict[str, str]:
        for key in env:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                raise ValueError(f"env name {key!r} is not a valid variable name")
        return env


class TaskGroup(Evolving):
    _new_fields = (
        "tolerations", "update", "disruption", "distinct_hosts", "spread", "gang",
        "on_member_loss", "rendezvous",
    )  # fmt: skip

    name: Name
    tasks: tuple[Task, ...] = Field(min_length=1, max_length=MAX_TASKS)
    scaling: ScalingPolicy = ScalingPolicy()
    constraints: tuple[Constraint, ...] = Field(default=(), max_length=64)
    tolerations: tuple[Toleration, ...] = Field(default=(), max_length=MAX_TAINTS)
    reschedule: ReschedulePolicy = ReschedulePolicy()
    autoscale: AutoscalePolicy | None = None
    #: How a new version replaces running replicas (forge.core.rollout); None keeps
    #: the defaults (UpdatePolicy()) once rolling updates are on.
    update: UpdatePolicy | None = None
    #: How many replicas preemption may take below ``desired`` at once; None: no
    #: budget (any replica of a low enough priority may be preempted).
    disruption: DisruptionBudget | None = None
    #: No two of the group's replicas on one node (Nomad's ``distinct_hosts``).
    distinct_hosts: Bool = False
    #: Spread the replicas over node label values (forge.core.placement.topology).
    spread: tuple[SpreadRule, ...] = Field(default=(), max_length=8)
    #: All or nothing: the missing replicas are bound together or not at all
    #: (Kueue, Volcano's PodGroup, the coscheduling plugin; forge.core.placing).
    gang: Bool = False
    #: A gang that loses a member (node lost, drained or removed, a task failed)
    #: releases the rest and is placed again together; ``keep`` leaves the rest.
    on_member_loss: Literal["restart_all", "keep"] = "restart_all"
    #: Tell each replica its rank and its peers' addresses (forge.core.taskenv), as a
    #: gang's members always are, for groups that need not start together.
    rendezvous: Bool = False

    @model_validator(mode="after")
    def _one_spread_per_label(self) -> Self:
        labels = [r.label for r in self.spread]
        dupes = sorted({x for x in labels if labels.count(x) > 1})
        if dupes:
            raise ValueError(f"spread names a label more than once: {', '.join(dupes)}")
        return self

    @property
    def topology(self) -> bool:
        """Whether the group's placement depends on where its own replicas are."""
        return self.distinct_hosts or bool(self.spread)

    @model_validator(mode="after")
    def _update_fits(self) -> Self:
        if self.update is not None:
            self.update.check_against(self.scaling.desired)
        return self

    @model_validator(mode="after")
    def _unique_tasks(self) -> Self:
        names = [t.name for t in self.tasks]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate task names: {', '.join(dupes)}")
        model_sets = [set(t.resources.gpu.models) for t in self.tasks if t.resources.gpu.models]
        if model_sets and not set.intersection(*model_sets):
            raise ValueError("the tasks' gpu models have no model in common")
        return self

    def request(self) -> Request:
        """One replica's needs: the sum of its tasks (GPU memory: the largest).

        Shared GPU tasks of one replica share one device when their shares sum to
        less than a device and the replica asks no whole device; otherwise each
        share is rounded up to whole devices (a replica's tasks run together, so a
        share beside whole devices would only fragment a further device).

        Cached on the (immutable) group: a pass asks every group for it, and the
        workflow keeps its jobs across passes.
        """
        return self._request

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A copy without the cached request: an update may change the tasks."""
        copy = super().model_copy(update=update, deep=deep)
        copy.__dict__.pop("_request", None)
        copy.__dict__.pop("version", None)
        return copy

    @cached_property
    def version(self) -> str:
        """The version of the group's task spec: a digest of its tasks (what a
        replica runs), so scaling or policy changes make no new version and a spec
        submitted again is the version it was (see forge.core.versions)."""
        body = json.dumps(
            [t.model_dump(mode="json") for t in self.tasks], sort_keys=True, separators=(",", ":")
        )
        return hashlib.sha256(body.encode()).hexdigest()[:12]

    @cached_property
    def _request(self) -> Request:
        whole = sum(t.resources.gpu.count for t in self.tasks if not t.resources.gpu.shared)
        share = sum(t.resources.gpu.shared for t in self.tasks)
        gpu_milli = 0
        if share and not whole and share < GPU_MILLI:
            gpu_count, gpu_milli = 1, share
        else:
            gpu_count = whole + -(-share // GPU_MILLI)
        gpu_memory = max(t.resources.gpu.memory for t in self.tasks)
        allowed: set[str] | None = None  # None: no task restricts the model
        for task in self.tasks:
            m = task.resources.gpu.models
            if m:
                allowed = set(m) if allowed is None else allowed & set(m)
        return Request(
            cpu=sum(t.resources.cpu for t in self.tasks),
            memory=sum(t.resources.memory for t in self.tasks),
            gpu=gpu_count,
            gpu_memory=gpu_memory,
            gpu_models=tuple(sorted(allowed or ())),
            gpu_milli=gpu_milli,
            tolerations=self.tolerations,
        )


class Job(Evolving):
    _new_fields = (
        "preemption", "type", "schedule", "active_deadline", "ttl_after_finished", "queue",
    )  # fmt: skip

    id: Name = Field(default="", validate_default=False)
    name: Name
    priority: Int = Field(default=50, ge=1, le=100)
    #: ``never``: wait for capacity rather than preempt (but may be preempted).
    preemption: Literal["allowed", "never"] = "allowed"
    #: What a replica's end means (forge.core.kinds): a service's is a failure.
    type: JobType = "service"
    groups: tuple[TaskGroup, ...] = Field(min_length=1, max_length=MAX_GROUPS)
    #: A batch job run by a Temporal Schedule, an instance per firing (forge.core.periodic).
    schedule: Schedule | None = None
    #: batch only (kinds): seconds from the loop's first sight until it fails; seconds
    #: from its end (complete or failed) until the loop removes it and its records
    active_deadline: Seconds | None = None
    ttl_after_finished: Seconds | None = None
    queue: Name = DEFAULT_QUEUE  # whose quota its replicas count against (forge.core.quota)

    @model_validator(mode="before")
    @classmethod
    def _defaults(cls, data: object) -> object:
        # only an absent / empty id defaults to the name: ``id: 0`` stays an error
        data = kind_defaults(data)
        if isinstance(data, dict) and data.get("id") in (None, "") and "name" in data:
            return {**data, "id": data["name"]}
        return data

    @model_validator(mode="after")
    def _unique_groups(self) -> Self:
        names = [g.name for g in self.groups]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate group names: {', '.join(dupes)}")
        return self

    @model_validator(mode="after")
    def _kind_rules(self) -> Self:
        check_kind(self.type, self.groups, self.active_deadline, self.ttl_after_finished)
        check_periodic(self.name, self.type, self.schedule)
        return self

    @model_validator(mode="after")
    def _size(self) -> Self:
        # Serialise only when a cheap upper bound says the spec could be too big.
        if _json_bound(self) > MAX_JOB_BYTES:
            size = len(self.model_dump_json())
            if size > MAX_JOB_BYTES:
                raise ValueError(
                    f"the job spec is {size / 1024:,.0f} KiB as JSON; the limit is "
                    f"{MAX_JOB_BYTES // 1024} KiB (keep large data such as files out of "
                    "args and env)"
                )
        return self

    def group(self, name: str) -> TaskGroup | None:
        for g in self.groups:
            if g.name == name:
                return g
        return None

    def with_desired(self, group: str, desired: int, *, keep: bool = True) -> Job:
        """A copy with one group's desired count changed (bounds widened to fit); the
        rest of its scaling policy kept (``keep=False``: ``max_failed`` dropped, as
        scaling did before it kept it)."""
        groups = []
        for g in self.groups:
            if g.name == group:
                lo, hi = min(g.scaling.min, desired), max(g.scaling.max, desired)
                new = {"min": lo, "max": hi, "desired": desired}
                new |= {} if keep else {"max_failed": 0}
                scaling = g.scaling.model_copy(update=new)
                g = g.model_copy(update={"scaling": scaling})
            groups.append(g)
        return self.model_copy(update={"groups": tuple(groups)})


def _json_bound(job: Job) -> int:
    """An upper bound on ``len(job.model_dump_json())``: every user string at its
    worst JSON escaping (6 bytes a character) plus a generous fixed cost for the
    rest of each group, constraint and task."""
    chars, fixed = 0, 1024
    for g in job.groups:
        fixed += 2048
        for con in g.constraints:
            fixed += 64 + 8 * len(con.values)
            chars += len(con.label) + sum(map(len, con.values))
        for tol in g.tolerations:
            fixed += 64
            chars += len(tol.key) + len(tol.value)
        for t in g.tasks:
            words = (*(t.command or ()), *t.args, *t.env, *t.env.values(), *t.resources.gpu.models)
            fixed += 512 + 8 * len(words)
            chars += sum(map(len, words))
    return fixed + 6 * chars
