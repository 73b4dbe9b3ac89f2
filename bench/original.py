"""A faithful Python port of the original scheduler's placement (``forge-orchestration``).

The original (Rust) places one workload at a time: it filters *every* node with
``NodeResources::can_fit``, scores *every* feasible node with
``BinPackScheduler::score`` and takes the maximum, then ``allocate``s cpu, memory
and whole GPUs (the first free devices with enough memory). That is O(R x N) per
pass and this port keeps it so: every node is checked and every feasible node is
scored for every replica, in plain Python (a tight loop, no indexes, no caches).

The score, as the Rust source of ``scheduler/algorithms.rs`` computes it::

    cpu_util = cpu_allocated / cpu_capacity          # before placing the replica
    mem_util = memory_allocated / memory_capacity
    gpu_util = gpus_allocated / len(gpus)  if the node has GPUs else 0.0
    base     = (1*cpu_util + 1*mem_util + 2*gpu_util) / (1 + 1 + 2)
    headroom: cpu_free_after / cpu_capacity < 0.05  or  mem_free_after / mem_capacity < 0.05
    score    = max(0.0, base - (0.1 if headroom else 0.0))

``VARIANT_SOURCE`` ("source", the default) is exactly that. Note that the source
scores utilisation *before* placement; only the headroom term looks at the state
after placing. ``VARIANT_AFTER`` ("after") is the reading of the design notes
("utilisation after placement ... minus 0.1 when headroom after placing drops
under 5%"): utilisation *after* placing the replica, and headroom as the minimum
over the node's dimensions (cpu, memory and, on GPU nodes, GPUs) of the free
fraction after placing, penalised when < 0.05. Both keep the GPU weight 2 and,
like the source, count a GPU-less node's GPU utilisation as 0 with its weight in
the denominator.

Ties: Rust's ``Iterator::max_by`` returns the *last* of equal maxima. The
original iterates a ``HashMap`` (random order per process); this port iterates
the nodes in the order given (id order for the synthetic clusters, file order for
the trace) and, like ``max_by``, keeps the *last* maximum (``ties="last"``, the
default). That reproduces the reference figure for the Alibaba trace exactly
(6,932 of 8,152 pods); ``ties="first"`` (keep the first maximum) is available for
comparison (6,928 there). Ties are common: the score is clamped at 0, and every
empty node scores 0 under the source formula. Everything
else (fits when ``free >= request``, GPUs matched by device memory, no model
constraints, priority unused) follows the source. The one liberty: a node with
fewer free devices than a request wants is rejected before its devices are
looked at (the same answer, sooner). The original has no GPU model
constraints (``gpu_spec`` is a Forge feature): a request's ``gpu_models`` is
ignored here.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from forge.core.models import Node, NodeState, Request

__all__ = [
    "GPU_WEIGHT",
    "HEADROOM",
    "HEADROOM_PENALTY",
    "VARIANTS",
    "VARIANT_AFTER",
    "VARIANT_SOURCE",
    "OriginalNode",
    "Placement",
    "allocate",
    "can_fit",
    "place_all",
    "schedule",
    "score",
]

CPU_WEIGHT = 1.0
MEM_WEIGHT = 1.0
GPU_WEIGHT = 2.0
HEADROOM = 0.05
HEADROOM_PENALTY = 0.1

VARIANT_SOURCE = "source"
VARIANT_AFTER = "after"
VARIANTS = (VARIANT_SOURCE, VARIANT_AFTER)


@dataclass(slots=True)
class OriginalNode:
    """``NodeResources`` of the original: capacity, allocation, whole GPU devices."""

    id: str
    cpu_capacity: int
    memory_capacity: int
    gpu_ids: list[str] = field(default_factory=list)
    gpu_memory: list[int] = field(default_factory=list)
    gpu_allocated: list[bool] = field(default_factory=list)
    cpu_allocated: int = 0
    memory_allocated: int = 0
    gpus_allocated: int = 0
    schedulable: bool = True

    @classmethod
    def from_node(cls, node: Node) -> OriginalNode:
        return cls(
            id=node.id,
            cpu_capacity=node.cpu,
            memory_capacity=node.memory,
            gpu_ids=[g.id for g in node.gpus],
            gpu_memory=[g.memory for g in node.gpus],
            gpu_allocated=[False] * len(node.gpus),
            schedulable=node.state is NodeState.READY,
        )


@dataclass(frozen=True, slots=True)
class Placement:
    """Where one replica went: the node's index in the node list, and its GPU ids."""

    node: int
    gpu_ids: tuple[str, ...]


def can_fit(node: OriginalNode, req: Request) -> bool:
    """``NodeResources::can_fit``: schedulable, cpu and memory free, and at least
    ``req.gpu`` free devices with ``req.gpu_memory`` MiB or more."""
    if not node.schedulable:
        return False
    if node.cpu_capacity - node.cpu_allocated < req.cpu:
        return False
    if node.memory_capacity - node.memory_allocated < req.memory:
        return False
    if req.gpu > 0:
        free = 0
        for i, mem in enumerate(node.gpu_memory):
            if not node.gpu_allocated[i] and mem >= req.gpu_memory:
                free += 1
        if free < req.gpu:
            return False
    return True


def score(node: OriginalNode, req: Request, variant: str = VARIANT_SOURCE) -> float:
    """``BinPackScheduler::score`` (see the module docstring for both variants)."""
    ngpu = len(node.gpu_ids)
    cpu_free_after = (node.cpu_capacity - node.cpu_allocated - req.cpu) / node.cpu_capacity
    mem_free_after = (
        node.memory_capacity - node.memory_allocated - req.memory
    ) / node.memory_capacity
    if variant == VARIANT_SOURCE:
        cpu_util = node.cpu_allocated / node.cpu_capacity
        mem_util = node.memory_allocated / node.memory_capacity
        gpu_util = node.gpus_allocated / ngpu if ngpu else 0.0
        tight = cpu_free_after < HEADROOM or mem_free_after < HEADROOM
    elif variant == VARIANT_AFTER:
        cpu_util = 1.0 - cpu_free_after
        mem_util = 1.0 - mem_free_after
        gpu_util = (node.gpus_allocated + req.gpu) / ngpu if ngpu else 0.0
        headroom = min(cpu_free_after, mem_free_after)
        if ngpu:
            headroom = min(headroom, 1.0 - gpu_util)
        tight = headroom < HEADROOM
    else:
        raise ValueError(f"unknown variant {variant!r}; choose one of {', '.join(VARIANTS)}")
    base = (CPU_WEIGHT * cpu_util + MEM_WEIGHT * mem_util + GPU_WEIGHT * gpu_util) / (
        CPU_WEIGHT + MEM_WEIGHT + GPU_WEIGHT
    )
    return max(0.0, base - (HEADROOM_PENALTY if tight else 0.0))


def allocate(node: OriginalNode, req: Request) -> tuple[str, ...]:
    """``NodeResources::allocate``: take cpu and memory, and for each GPU wanted the
    first free device with enough memory. Returns the device ids taken."""
    node.cpu_allocated += req.cpu
    node.memory_allocated += req.memory
    taken: list[str] = []
    for _ in range(req.gpu):
        for i, mem in enumerate(node.gpu_memory):
            if not node.gpu_allocated[i] and mem >= req.gpu_memory:
                node.gpu_allocated[i] = True
                taken.append(node.gpu_ids[i])
                break
    node.gpus_allocated += len(taken)
    return tuple(taken)


def schedule(
    nodes: Sequence[OriginalNode],
    req: Request,
    variant: str = VARIANT_SOURCE,
    ties: str = "last",
) -> int | None:
    """``Scheduler::schedule`` for one replica: check every node, score every
    feasible one, return the index of the best (on a tie the last in node order,
    as Rust's ``max_by``; the first with ``ties="first"``) or None. Does not
    allocate.

    The body is :func:`can_fit` and :func:`score` written out inline (a call per
    node would double the run time without changing a single decision; the tests
    check the inline copy against the functions).
    """
    cpu, mem, gpu, gpu_mem = req.cpu, req.memory, req.gpu, req.gpu_memory
    after = variant == VARIANT_AFTER
    if not after and variant != VARIANT_SOURCE:
        raise ValueError(f"unknown variant {variant!r}; choose one of {', '.join(VARIANTS)}")
    if ties not in ("last", "first"):
        raise ValueError(f"unknown ties {ties!r}; choose last or first")
    last = ties == "last"
    best = -1
    best_score = -1.0
    wsum = CPU_WEIGHT + MEM_WEIGHT + GPU_WEIGHT
    for index, node in enumerate(nodes):
        # -- can_fit --
        if not node.schedulable:
            continue
        cpu_cap, mem_cap = node.cpu_capacity, node.memory_capacity
        cpu_left = cpu_cap - node.cpu_allocated - cpu
        if cpu_left < 0:
            continue
        mem_left = mem_cap - node.memory_allocated - mem
        if mem_left < 0:
            continue
        ngpu = len(node.gpu_ids)
        if gpu:
            if ngpu - node.gpus_allocated < gpu:  # cannot have enough free devices
                continue
            free = 0
            allocated = node.gpu_allocated
            for i, dmem in enumerate(node.gpu_memory):
                if not allocated[i] and dmem >= gpu_mem:
                    free += 1
            if free < gpu:
                continue
        # -- score --
        cpu_free_after = cpu_left / cpu_cap
        mem_free_after = mem_left / mem_cap
        if after:
            gpu_util = (node.gpus_allocated + gpu) / ngpu if ngpu else 0.0
            base = (
                CPU_WEIGHT * (1.0 - cpu_free_after)
                + MEM_WEIGHT * (1.0 - mem_free_after)
                + GPU_WEIGHT * gpu_util
            ) / wsum
            headroom = cpu_free_after if cpu_free_after < mem_free_after else mem_free_after
            if ngpu and 1.0 - gpu_util < headroom:
                headroom = 1.0 - gpu_util
            tight = headroom < HEADROOM
        else:
            gpu_util = node.gpus_allocated / ngpu if ngpu else 0.0
            base = (
                CPU_WEIGHT * node.cpu_allocated / cpu_cap
                + MEM_WEIGHT * node.memory_allocated / mem_cap
                + GPU_WEIGHT * gpu_util
            ) / wsum
            tight = cpu_free_after < HEADROOM or mem_free_after < HEADROOM
        s = base - HEADROOM_PENALTY if tight else base
        if s < 0.0:
            s = 0.0
        if s > best_score or (last and s == best_score):
            best, best_score = index, s
    return best if best >= 0 else None


def place_all(
    nodes: Iterable[Node],
    requests: Iterable[Request],
    variant: str = VARIANT_SOURCE,
    ties: str = "last",
) -> tuple[list[OriginalNode], list[Placement | None]]:
    """Place every request in order; returns the final node state (in the given
    node order) and, per request, its placement or None when no node could take it."""
    state = [OriginalNode.from_node(n) for n in nodes]
    out: list[Placement | None] = []
    for req in requests:
        index = schedule(state, req, variant, ties)
        if index is None:
            out.append(None)
            continue
        out.append(Placement(index, allocate(state[index], req)))
    return state, out
