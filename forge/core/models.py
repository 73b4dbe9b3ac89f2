"""The vocabulary of Forge: jobs, nodes, assignments and the plan of a pass.

Every model is strict (no silent coercion of ``"500"`` into 500) and forbids
unknown fields, so a typo in a job file is an error that names the field instead
of a setting that silently does nothing. All models export JSON Schema
(``Job.model_json_schema()``).

Units: cpu in millicores, memory in MiB, GPU memory in MiB, times in seconds.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from enum import StrEnum
from functools import cached_property
from typing import Annotated, Any, ClassVar, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    Strict,
    field_validator,
    model_serializer,
    model_validator,
)

from forge.core.rollout import UpdatePolicy

__all__ = [
    "GPU_MILLI",
    "MAX_BATCH_BYTES",
    "MAX_CPU",
    "MAX_GPUS",
    "MAX_GROUPS",
    "MAX_JOB_BYTES",
    "MAX_MEMORY",
    "MAX_REPLICAS",
    "MAX_TASKS",
    "NAME_PATTERN",
    "STOP_GRACE",
    "Assignment",
    "AssignmentStatus",
    "AutoscalePolicy",
    "Constraint",
    "DelayFunction",
    "GpuDevice",
    "GpuRequest",
    "Job",
    "Name",
    "Node",
    "NodeState",
    "Pending",
    "Request",
    "ReschedulePolicy",
    "Resources",
    "ScalingPolicy",
    "Taint",
    "Task",
    "TaskGroup",
    "Toleration",
    "UpdatePolicy",
    "tolerated",
    "workload_id",
]

# Size limits. They keep one job spec, one node and one pass bounded, so nothing a
# user sends can grow a Temporal payload past its limit (see README "Limits").
MAX_CPU = 10_000_000  # 10,000 cores in millicores
MAX_MEMORY = 1 << 30  # 1 PiB in MiB
MAX_GPUS = 64
MAX_GROUPS = 64
MAX_TASKS = 64
MAX_REPLICAS = 100_000
MAX_LABELS = 64
MAX_ENV = 256
MAX_ARGS = 256
MAX_STRING = 4096
MAX_TAINTS = 32
#: One GPU device in milli-GPU: a shared (fractional) request asks 1..999 of it.
GPU_MILLI = 1000
#: One job spec, as JSON. The field limits above allow specs of gigabytes (64 groups
#: x 64 tasks x 256 args of 4 KiB), and one over Temporal's 2 MiB payload limit
#: wedges the cluster workflow (every workflow task that carries it fails).
MAX_JOB_BYTES = 128 * 1024
#: Jobs or nodes carried by one update or signal, as JSON: the client splits bigger
#: batches, the workflow's validators refuse them and queue at most this much job
#: data for one store write.
MAX_BATCH_BYTES = 1024 * 1024

#: Names are path segments of a workload id (``job/group/ordinal``): no ``/``, no
#: whitespace or control characters, at most 63 characters (a DNS label's length).
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"
_NAME_RE = re.compile(NAME_PATTERN)

Name = Annotated[str, Field(pattern=NAME_PATTERN, description="1-63 of [A-Za-z0-9._-]")]
# Numbers and booleans are strict (``"500"`` or ``"yes"`` is an error, not a
# coercion); containers are lax so YAML lists fill tuple fields and strings fill
# enums.
Int = Annotated[int, Strict()]
Float = Annotated[float, Strict()]
Bool = Annotated[bool, Strict()]
Cpu = Annotated[int, Strict(), Field(ge=0, le=MAX_CPU, description="millicores")]
Memory = Annotated[int, Strict(), Field(ge=0, le=MAX_MEMORY, description="MiB")]
ShortStr = Annotated[str, Field(max_length=MAX_STRING)]
Seconds = Annotated[float, Strict(), Field(ge=0, le=365 * 24 * 3600)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Evolving(_Model):
    """A model that gained fields after workflow histories were recorded with it.

    Fields named in ``_new_fields`` are left out of a dump while they hold their
    default, so a model that does not use them dumps exactly as before: the
    workflow hashes node dumps (the persist digest) and measures job dumps (batch
    sizes), and a replayed history must see the same bytes.
    """

    _new_fields: ClassVar[tuple[str, ...]] = ()

    @model_serializer(mode="wrap")
    def _omit_unused_new_fields(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        if isinstance(data, dict):
            for name in self._new_fields:
                if name in data and getattr(self, name) == type(self).model_fields[name].default:
                    del data[name]
        return data


def _no_control(value: str, what: str) -> str:
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise ValueError(f"{what} must not contain control characters")
    return value


class GpuRequest(_Evolving):
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


class Resources(_Model):
    cpu: Cpu = Field(gt=0)
    memory: Memory = Field(gt=0)
    gpu: GpuRequest = GpuRequest()


#: A named port a task asks for: it becomes ``FORGE_PORT_<NAME>`` (upper-cased).
PortName = Annotated[
    str, Field(pattern=r"^[A-Za-z][A-Za-z0-9_]{0,31}$", description="1-32 of [A-Za-z0-9_]")
]
#: The default time a task gets between SIGTERM and SIGKILL when it is stopped.
STOP_GRACE = 10.0


class Task(_Evolving):
    """One process of a replica. ``ports`` and ``stop_grace`` came after recorded
    histories and stored jobs: left at their defaults they are not dumped, so an
    existing job's JSON (and every digest over it) stays byte-identical."""

    _new_fields = ("ports", "stop_grace")

    name: Name
    command: tuple[ShortStr, ...] | None = Field(default=None, max_length=MAX_ARGS)
    args: tuple[ShortStr, ...] = Field(default=(), max_length=MAX_ARGS)
    env: dict[ShortStr, ShortStr] = Field(default_factory=dict, max_length=MAX_ENV)
    resources: Resources
    ports: tuple[PortName, ...] = Field(default=(), max_length=32)
    stop_grace: Annotated[float, Strict(), Field(ge=0, le=3600)] = STOP_GRACE

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


class ScalingPolicy(_Model):
    min: Int = Field(default=0, ge=0, le=MAX_REPLICAS)
    max: Int = Field(default=1, ge=0, le=MAX_REPLICAS)
    desired: Int = Field(default=1, ge=0, le=MAX_REPLICAS)

    @model_validator(mode="after")
    def _bounds(self) -> Self:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) must be <= max ({self.max})")
        if not self.min <= self.desired <= self.max:
            raise ValueError(
                f"desired ({self.desired}) must be within [min, max] = [{self.min}, {self.max}]"
            )
        return self


class DelayFunction(StrEnum):
    CONSTANT = "constant"
    EXPONENTIAL = "exponential"
    FIBONACCI = "fibonacci"


class ReschedulePolicy(_Model):
    """What happens to a replica that failed (Nomad's ``reschedule`` block).

    At most ``attempts`` reschedules within ``interval`` seconds (``unlimited``
    lifts the cap); each waits ``delay`` grown by ``delay_function`` up to
    ``max_delay``.
    """

    attempts: Int = Field(default=3, ge=0, le=1000)
    interval: Seconds = 3600.0
    delay: Seconds = 15.0
    delay_function: DelayFunction = DelayFunction.EXPONENTIAL
    max_delay: Seconds = 300.0
    unlimited: Bool = False

    @model_validator(mode="after")
    def _delays(self) -> Self:
        if self.max_delay < self.delay:
            raise ValueError(f"max_delay ({self.max_delay}) must be >= delay ({self.delay})")
        return self


class Constraint(_Model):
    """A filter on node labels, e.g. ``{label: zone, op: in, values: [a, b]}``."""

    label: Annotated[str, Field(min_length=1, max_length=253)]
    op: Literal["=", "!=", "in", "not_in", "exists", "not_exists"] = "="
    values: tuple[ShortStr, ...] = Field(default=(), max_length=64)

    @model_validator(mode="after")
    def _arity(self) -> Self:
        if self.op in ("=", "!=") and len(self.values) != 1:
            raise ValueError(f"op {self.op!r} takes exactly one value")
        if self.op in ("in", "not_in") and not self.values:
            raise ValueError(f"op {self.op!r} takes at least one value")
        if self.op in ("exists", "not_exists") and self.values:
            raise ValueError(f"op {self.op!r} takes no values")
        return self

    def matches(self, labels: dict[str, str]) -> bool:
        value = labels.get(self.label)
        if self.op == "exists":
            return value is not None
        if self.op == "not_exists":
            return value is None
        if self.op in ("=", "in"):
            return value is not None and value in self.values
        return value is None or value not in self.values


class AutoscalePolicy(_Model):
    """How a group scales from utilisation (see ``forge.core.autoscale``).

    ``threshold``: the original's policy (>= ``scale_up`` adds ``step``, <=
    ``scale_down`` removes ``step``, then ``cooldown`` seconds of quiet).
    ``target``: Kubernetes HPA (``ceil(current * util / target)`` with a tolerance
    and a scale-down stabilisation window).
    """

    policy: Literal["threshold", "target"] = "threshold"
    scale_up: Float = Field(default=0.8, gt=0, le=1)
    scale_down: Float = Field(default=0.3, ge=0, lt=1)
    step: Int = Field(default=1, ge=1, le=MAX_REPLICAS)
    cooldown: Seconds = 300.0
    target: Float = Field(default=0.6, gt=0, le=1)
    tolerance: Float = Field(default=0.1, ge=0, lt=1)
    stabilization_window: Seconds = 300.0
    # not ``Seconds = Field(ge=1)``: the annotation's own ``ge=0`` wins over a ``ge``
    # given again, and an interval of 0 would evaluate metrics on every pass
    interval: Annotated[float, Strict(), Field(ge=1, le=365 * 24 * 3600)] = 60.0

    @model_validator(mode="after")
    def _thresholds(self) -> Self:
        if self.scale_down >= self.scale_up:
            raise ValueError(f"scale_down ({self.scale_down}) must be < scale_up ({self.scale_up})")
        return self


class Taint(_Model):
    """A Kubernetes-style ``NoSchedule`` taint: only replicas whose group tolerates
    it are placed on the node (a hard pool, e.g. ``{key: gpu, value: "true"}``).
    Replicas already bound stay (``NoSchedule`` does not evict)."""

    key: Annotated[str, Field(min_length=1, max_length=253)]
    value: Annotated[str, Field(max_length=253)] = ""
    effect: Literal["NoSchedule"] = "NoSchedule"


class Toleration(_Model):
    """Lets a group's replicas onto nodes with a matching taint (``Equal``: same key
    and value; ``Exists``: any value of the key, or every taint when key is empty)."""

    key: Annotated[str, Field(max_length=253)] = ""
    operator: Literal["Equal", "Exists"] = "Equal"
    value: Annotated[str, Field(max_length=253)] = ""

    @model_validator(mode="after")
    def _shape(self) -> Self:
        if self.operator == "Equal" and not self.key:
            raise ValueError("operator Equal needs a key")
        if self.operator == "Exists" and self.value:
            raise ValueError("operator Exists takes no value")
        return self

    def tolerates(self, taint: Taint) -> bool:
        if self.operator == "Exists":
            return not self.key or self.key == taint.key
        return self.key == taint.key and self.value == taint.value


def tolerated(taints: tuple[Taint, ...], tolerations: tuple[Toleration, ...]) -> Taint | None:
    """The first taint no toleration matches, None when all are tolerated."""
    for t in taints:
        if not any(tol.tolerates(t) for tol in tolerations):
            return t
    return None


class TaskGroup(_Evolving):
    _new_fields = ("tolerations", "update")

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


class Job(_Model):
    id: Name = Field(default="", validate_default=False)
    name: Name
    priority: Int = Field(default=50, ge=1, le=100)
    groups: tuple[TaskGroup, ...] = Field(min_length=1, max_length=MAX_GROUPS)

    @model_validator(mode="before")
    @classmethod
    def _default_id(cls, data: object) -> object:
        # only an absent / empty id defaults to the name: ``id: 0`` stays an error
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

    def with_desired(self, group: str, desired: int) -> Job:
        """A copy with one group's desired count changed (bounds widened to fit)."""
        groups = []
        for g in self.groups:
            if g.name == group:
                s = g.scaling
                scaling = ScalingPolicy(
                    min=min(s.min, desired), max=max(s.max, desired), desired=desired
                )
                g = g.model_copy(update={"scaling": scaling})
            groups.append(g)
        return self.model_copy(update={"groups": tuple(groups)})


def _json_bound(job: Job) -> int:
    """An upper bound on ``len(job.model_dump_json())``: every user string at its
    worst JSON escaping (6 bytes a character) plus a generous fixed cost for the
    rest of each group, constraint and task."""
    chars = 0
    fixed = 1024
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


class Request(_Model):
    """What one replica of a group needs from a node (derived, never user-written).

    ``gpu_milli`` 1..999 (with ``gpu`` 1) asks a share of one device; 0 asks
    ``gpu`` whole devices. ``tolerations`` are the group's: taints are a static
    rule like GPU models, so they belong to the equivalence class.
    """

    cpu: Int
    memory: Int
    gpu: Int = 0
    gpu_memory: Int = 0
    gpu_models: tuple[str, ...] = ()
    gpu_milli: Int = 0
    tolerations: tuple[Toleration, ...] = ()

    @property
    def milli(self) -> int:
        """Milli-GPU asked in all: a share, or 1000 per whole device."""
        return self.gpu_milli if self.gpu_milli else GPU_MILLI * self.gpu


class GpuDevice(_Model):
    id: Name
    model: Name
    memory: Memory


class NodeState(StrEnum):
    READY = "ready"
    DRAINING = "draining"
    LOST = "lost"


class Node(_Evolving):
    _new_fields = ("taints",)

    id: Name
    cpu: Cpu
    memory: Memory
    gpus: tuple[GpuDevice, ...] = Field(default=(), max_length=MAX_GPUS)
    labels: dict[Annotated[str, Field(min_length=1, max_length=253)], ShortStr] = Field(
        default_factory=dict, max_length=MAX_LABELS
    )
    taints: tuple[Taint, ...] = Field(default=(), max_length=MAX_TAINTS)
    state: NodeState = NodeState.READY

    @model_validator(mode="after")
    def _unique_gpu_ids(self) -> Self:
        ids = [g.id for g in self.gpus]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise ValueError(f"duplicate gpu ids: {', '.join(dupes)}")
        for k, v in self.labels.items():
            _no_control(k, "label name")
            _no_control(v, "label value")
        return self


class AssignmentStatus(StrEnum):
    PENDING = "pending"  # bound to a node, not yet reported running
    RUNNING = "running"
    FAILED = "failed"


def workload_id(job: str, group: str, ordinal: int) -> str:
    return f"{job}/{group}/{ordinal}"


class Assignment(_Evolving):
    """One replica bound to one node (and, for GPU work, to exact device ids)."""

    _new_fields = ("gpu_milli", "version")

    workload_id: str
    job: str
    group: str
    ordinal: Int = Field(ge=0)
    node: str
    gpu_ids: tuple[str, ...] = ()
    cpu: Int
    memory: Int
    status: AssignmentStatus = AssignmentStatus.PENDING
    #: The share of its one device a shared replica holds (1..999); 0 = whole devices.
    gpu_milli: Int = Field(default=0, ge=0, lt=GPU_MILLI)
    #: The group version (TaskGroup.version) the replica runs; "" = bound before
    #: versions existed.
    version: Annotated[str, Field(max_length=64)] = ""

    @model_validator(mode="after")
    def _id_matches(self) -> Self:
        if self.workload_id != workload_id(self.job, self.group, self.ordinal):
            raise ValueError(f"workload_id {self.workload_id!r} does not match job/group/ordinal")
        return self


class Pending(_Model):
    """A desired replica that is not bound, and why."""

    workload_id: str
    reasons: tuple[str, ...]
    attempts: Int = 0
    not_before: Float = 0.0


def is_valid_name(value: str) -> bool:
    return bool(_NAME_RE.fullmatch(value))  # not match: "$" also matches before a final "\n"
