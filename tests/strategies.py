"""Shared Hypothesis strategies: nodes, jobs, worlds and event sequences.

Sizes are small on purpose: a handful of nodes and replicas makes capacity run
out, GPUs collide and constraints exclude nodes often, which is where the
reconcile pass and the placer can go wrong. Requests are sometimes larger than
any node (cpu, memory, GPU count or GPU memory) so "never fits" is exercised too.

Events refer to nodes, jobs and replicas by *index* (taken modulo what exists when
the event is applied), so an event sequence is valid for any world.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

from hypothesis import strategies as st

from forge.core.models import (
    Constraint,
    DelayFunction,
    GpuDevice,
    GpuRequest,
    Job,
    Node,
    NodeState,
    ReschedulePolicy,
    Resources,
    ScalingPolicy,
    Task,
    TaskGroup,
)
from forge.core.reconcile import ReconcileOptions

__all__ = [
    "GPU_MEMORY",
    "MODELS",
    "ZONES",
    "Advance",
    "Event",
    "JobStop",
    "JobSubmit",
    "NodeAdded",
    "NodeDrained",
    "NodeLost",
    "NodeRecovered",
    "NodeRemoved",
    "ReplicaFailed",
    "Scale",
    "World",
    "constraints",
    "events",
    "gpu_devices",
    "groups",
    "jobs",
    "node_lists",
    "nodes",
    "options",
    "requests_and_constraints",
    "reschedule_policies",
    "resources",
    "worlds",
]

MODELS = ("A100", "H100", "T4")
ZONES = ("a", "b", "c")
GPU_MEMORY = (16000, 40960, 81920)
MAX_NODE_CPU = 16_000
MAX_NODE_MEMORY = 16 * 1024


# -- nodes -------------------------------------------------------------------------
@st.composite
def gpu_devices(draw: st.DrawFn) -> tuple[GpuDevice, ...]:
    """0-8 devices (none half of the time), one model per node or mixed models."""
    if draw(st.booleans()):
        return ()
    count = draw(st.integers(1, 8))
    model = draw(st.sampled_from(MODELS))
    mixed = draw(st.booleans())
    memory = draw(st.sampled_from(GPU_MEMORY))
    devices = []
    for i in range(count):
        m = draw(st.sampled_from(MODELS)) if mixed else model
        mem = draw(st.sampled_from(GPU_MEMORY)) if mixed else memory
        devices.append(GpuDevice(id=f"gpu{i}", model=m, memory=mem))
    return tuple(devices)


@st.composite
def node_labels(draw: st.DrawFn) -> dict[str, str]:
    labels: dict[str, str] = {}
    if draw(st.integers(0, 3)):  # most nodes have a zone
        labels["zone"] = draw(st.sampled_from(ZONES))
    if draw(st.booleans()):
        labels["disk"] = "ssd"
    return labels


@st.composite
def nodes(
    draw: st.DrawFn,
    node_id: str | None = None,
    states: tuple[NodeState, ...] = (
        NodeState.READY,
        NodeState.READY,
        NodeState.READY,
        NodeState.READY,
        NodeState.DRAINING,
        NodeState.LOST,
    ),
) -> Node:
    """A node: cpu 0-16 cores, memory 0-16 GiB, 0-8 GPUs, labels, mostly ready."""
    nid = node_id if node_id is not None else draw(st.from_regex(r"n[0-9]{1,3}", fullmatch=True))
    return Node(
        id=nid,
        cpu=draw(st.integers(0, 16)) * 1000,
        memory=draw(st.integers(0, 16)) * 1024,
        gpus=draw(gpu_devices()),
        labels=draw(node_labels()),
        state=draw(st.sampled_from(states)),
    )


@st.composite
def node_lists(
    draw: st.DrawFn, min_size: int = 1, max_size: int = 6, ready_only: bool = False
) -> list[Node]:
    """Nodes with unique ids ``n0``, ``n1``, ..."""
    count = draw(st.integers(min_size, max_size))
    states = (NodeState.READY,) if ready_only else None
    out = []
    for i in range(count):
        out.append(draw(nodes(f"n{i}") if states is None else nodes(f"n{i}", states=states)))
    return out


# -- jobs --------------------------------------------------------------------------
@st.composite
def constraints(draw: st.DrawFn) -> tuple[Constraint, ...]:
    one = st.one_of(
        st.sampled_from(ZONES).map(lambda z: Constraint(label="zone", op="=", values=(z,))),
        st.sampled_from(ZONES).map(lambda z: Constraint(label="zone", op="!=", values=(z,))),
        st.lists(st.sampled_from(ZONES), min_size=1, max_size=2, unique=True).map(
            lambda zs: Constraint(label="zone", op="in", values=tuple(zs))
        ),
        st.lists(st.sampled_from(ZONES), min_size=1, max_size=2, unique=True).map(
            lambda zs: Constraint(label="zone", op="not_in", values=tuple(zs))
        ),
        st.just(Constraint(label="disk", op="exists")),
        st.just(Constraint(label="disk", op="not_exists")),
    )
    if draw(st.integers(0, 2)):  # two thirds have no constraint
        return ()
    return tuple(draw(st.lists(one, min_size=1, max_size=2)))


@st.composite
def resources(draw: st.DrawFn, models: tuple[str, ...] = ()) -> Resources:
    """Usually small; sometimes bigger than any node (cpu, memory, gpus)."""
    too_big = draw(st.integers(0, 9)) == 0
    cpu = (
        draw(st.sampled_from([MAX_NODE_CPU + 1, 64_000]))
        if too_big
        else draw(st.integers(1, 12)) * 500
    )
    memory = (
        MAX_NODE_MEMORY + 1 if draw(st.integers(0, 19)) == 0 else draw(st.integers(1, 12)) * 512
    )
    gpu = GpuRequest()
    if draw(st.integers(0, 2)) == 0:  # a third want GPUs
        gpu = GpuRequest(
            count=draw(st.sampled_from([1, 1, 2, 4, 9])),
            memory=draw(st.sampled_from([0, 0, 0, 16000, 40960, 100_000])),
            models=models if draw(st.integers(0, 2)) == 0 else (),
        )
    return Resources(cpu=cpu, memory=memory, gpu=gpu)


@st.composite
def reschedule_policies(draw: st.DrawFn) -> ReschedulePolicy:
    delay = draw(st.sampled_from([0.0, 1.0, 5.0, 15.0]))
    return ReschedulePolicy(
        attempts=draw(st.integers(0, 3)),
        interval=draw(st.sampled_from([30.0, 600.0, 3600.0])),
        delay=delay,
        delay_function=draw(st.sampled_from(list(DelayFunction))),
        max_delay=delay + draw(st.sampled_from([0.0, 10.0, 300.0])),
        unlimited=draw(st.integers(0, 4)) == 0,
    )


@st.composite
def groups(draw: st.DrawFn, name: str, max_desired: int = 8) -> TaskGroup:
    """1-2 tasks; the tasks' GPU model lists, when given, share the group's list."""
    models = tuple(draw(st.lists(st.sampled_from(MODELS), min_size=1, max_size=2, unique=True)))
    n_tasks = draw(st.integers(1, 2))
    tasks = tuple(Task(name=f"t{i}", resources=draw(resources(models))) for i in range(n_tasks))
    desired = draw(st.integers(0, max_desired))
    return TaskGroup(
        name=name,
        tasks=tasks,
        scaling=ScalingPolicy(min=0, max=max(desired, 8), desired=desired),
        constraints=draw(constraints()),
        reschedule=draw(reschedule_policies()),
    )


@st.composite
def jobs(draw: st.DrawFn, job_id: str = "job", max_desired: int = 8) -> Job:
    """1-3 groups, priorities with frequent ties, desired 0-8 per group."""
    n_groups = draw(st.integers(1, 3))
    return Job(
        id=job_id,
        name=job_id,
        priority=draw(st.one_of(st.sampled_from([10, 50, 90]), st.integers(1, 100))),
        groups=tuple(draw(groups(f"g{i}", max_desired)) for i in range(n_groups)),
    )


@st.composite
def requests_and_constraints(draw: st.DrawFn) -> tuple[TaskGroup, tuple[Constraint, ...]]:
    """A one-replica group (its request via ``.request()``) and its constraints."""
    g = draw(groups("g", max_desired=1))
    return g, g.constraints


# -- worlds ------------------------------------------------------------------------
@dataclass
class World:
    nodes: dict[str, Node]
    jobs: dict[str, Job]


@st.composite
def worlds(draw: st.DrawFn, max_nodes: int = 6, max_jobs: int = 4) -> World:
    ns = draw(node_lists(1, max_nodes))
    n_jobs = draw(st.integers(1, max_jobs))
    js = [draw(jobs(f"j{i}")) for i in range(n_jobs)]
    return World(nodes={n.id: n for n in ns}, jobs={j.id: j for j in js})


@st.composite
def options(draw: st.DrawFn) -> ReconcileOptions:
    """Pass options for the simulators, whose invariant checks are independent of
    forge.core.placement and model no GPU reservation (whether it holds depends on
    GPU work some node could take, which the checks would have to re-derive): the
    reservation is off here and has its own property tests
    (tests/core/placement/test_gpu_placement.py, test_placement_v2_carry.py)."""
    return ReconcileOptions(
        gpu_reserve=0,
        algorithm=draw(st.sampled_from(["binpack", "spread"])),
        candidates=draw(st.sampled_from([0, 1, 2, 8])),
        backoff_base=draw(st.sampled_from([1.0, 0.5])),
        backoff_cap=draw(st.sampled_from([300.0, 4.0])),
        max_placements=draw(st.sampled_from([1, 3, 20_000, 20_000])),
        max_work=draw(st.sampled_from([0, 0, 1, 40, 400])),
        pending_units=draw(st.sampled_from([1, 1, 8])),
        seed=draw(st.integers(0, 3)),
    )


# -- events ------------------------------------------------------------------------
@dataclass(frozen=True)
class NodeLost:
    index: int


@dataclass(frozen=True)
class NodeDrained:
    index: int


@dataclass(frozen=True)
class NodeRemoved:
    index: int


@dataclass(frozen=True)
class NodeRecovered:
    """A draining or lost node is ready again (a capacity change)."""

    index: int


@dataclass(frozen=True)
class NodeAdded:
    """A new node joins; the harness gives it a fresh id (a capacity change)."""

    node: Node


@dataclass(frozen=True)
class Scale:
    job_index: int
    group_index: int
    desired: int


@dataclass(frozen=True)
class JobStop:
    index: int


@dataclass(frozen=True)
class JobSubmit:
    """A new job; the harness gives it a fresh id."""

    job: Job


@dataclass(frozen=True)
class ReplicaFailed:
    """The index-th bound replica (in workload-id order) reports a failure."""

    index: int


@dataclass(frozen=True)
class Advance:
    seconds: float


Event: TypeAlias = (
    NodeLost
    | NodeDrained
    | NodeRemoved
    | NodeRecovered
    | NodeAdded
    | Scale
    | JobStop
    | JobSubmit
    | ReplicaFailed
    | Advance
)

_index = st.integers(0, 63)


def events() -> st.SearchStrategy[Event]:
    return st.one_of(
        st.builds(NodeLost, _index),
        st.builds(NodeDrained, _index),
        st.builds(NodeRemoved, _index),
        st.builds(NodeRecovered, _index),
        st.builds(NodeAdded, nodes(node_id="new", states=(NodeState.READY,))),
        st.builds(Scale, _index, _index, st.integers(0, 8)),
        st.builds(JobStop, _index),
        st.builds(JobSubmit, jobs("new")),
        st.builds(ReplicaFailed, _index),
        st.builds(Advance, st.sampled_from([0.5, 1.0, 2.0, 5.0, 30.0, 300.0, 4000.0])),
    )
