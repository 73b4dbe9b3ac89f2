"""Feasibility filters: can this node take this replica, and if not, why?

Each filter is a small named rule (Kubernetes' Filter extension point, Nomad's
feasibility checkers) that returns a :class:`Rejection` (data: the rule, the
dimension's asked / free / reserved amounts) or None. The selector runs the fit
kernel (:func:`forge.core.placement.kernel.fits`) on its hot path and uses this
chain only to explain a failure; the capacity rules read the same quantities the
kernel does (``cpu_room``, ``mem_room``, per-device free milli-GPU), so the
reasons a user reads come from the rules that decided. Text is made only in
:mod:`forge.core.placement.reasons`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from forge.core.models import Constraint, NodeState, Request, tolerated
from forge.core.placement.diagnosis import Diagnosis, Rejection, Rule
from forge.core.placement.state import NodeAlloc

__all__ = [
    "DEFAULT_FILTERS",
    "STATIC_FILTERS",
    "ConstraintFilter",
    "CpuFilter",
    "Filter",
    "GpuCountFilter",
    "GpuMemoryFilter",
    "GpuModelFilter",
    "MemoryFilter",
    "NodeStateFilter",
    "TaintFilter",
    "diagnose",
    "explain_node",
]

_SHOWN_DEVICES = 3  # a gpu-share verdict lists the devices with the most room


class Filter(Protocol):
    """Returns None when the node passes, else why not."""

    name: str

    def check(
        self, node: NodeAlloc, req: Request, constraints: Sequence[Constraint]
    ) -> Rejection | None: ...


class NodeStateFilter:
    name = "node-state"

    def check(
        self, node: NodeAlloc, req: Request, constraints: Sequence[Constraint]
    ) -> Rejection | None:
        state = node.node.state
        return None if state is NodeState.READY else Rejection(Rule.STATE, state=str(state.value))


class ConstraintFilter:
    name = "constraints"

    def check(
        self, node: NodeAlloc, req: Request, constraints: Sequence[Constraint]
    ) -> Rejection | None:
        for c in constraints:
            if not c.matches(node.node.labels):
                return Rejection(Rule.CONSTRAINT, constraint=c)
        return None


class TaintFilter:
    name = "taints"

    def check(
        self, node: NodeAlloc, req: Request, constraints: Sequence[Constraint]
    ) -> Rejection | None:
        taint = tolerated(node.node.taints, req.tolerations)
        return None if taint is None else Rejection(Rule.TAINT, taint=taint)


class GpuModelFilter:
    name = "gpu-model"

    def check(
        self, node: NodeAlloc, req: Request, constraints: Sequence[Constraint]
    ) -> Rejection | None:
        if not req.gpu or not req.gpu_models:
            return None
        have = sum(1 for g in node.node.gpus if g.model in req.gpu_models)
        return None if have >= req.gpu else Rejection(Rule.GPU_MODEL)


class GpuMemoryFilter:
    name = "gpu-memory"

    def check(
        self, node: NodeAlloc, req: Request, constraints: Sequence[Constraint]
    ) -> Rejection | None:
        if not req.gpu or not req.gpu_memory:
            return None
        have = len(node.matching_gpus(req, free_only=False))
        return None if have >= req.gpu else Rejection(Rule.GPU_MEMORY)


class GpuCountFilter:
    name = "gpu"

    def check(
        self, node: NodeAlloc, req: Request, constraints: Sequence[Constraint]
    ) -> Rejection | None:
        if not req.gpu:
            return None
        if req.gpu_milli:
            if node.shared_gpus(req):
                return None
            # the matching devices with the most room first: what a user can act on
            devs = node.matching_gpus(req, free_only=False)
            devs.sort(key=lambda i: (-node.gpu_left[i], i))
            return Rejection(
                Rule.GPU_SHARE,
                asked=req.gpu_milli,
                devices=tuple(
                    (node.node.gpus[i].id, node.gpu_left[i]) for i in devs[:_SHOWN_DEVICES]
                ),
                more=max(0, len(devs) - _SHOWN_DEVICES),
            )
        free = len(node.matching_gpus(req, free_only=True))
        return None if free >= req.gpu else Rejection(Rule.GPU, asked=req.gpu, free=free)


class CpuFilter:
    name = "cpu"

    def check(
        self, node: NodeAlloc, req: Request, constraints: Sequence[Constraint]
    ) -> Rejection | None:
        free = node.cpu_free
        if free < req.cpu:
            return Rejection(Rule.CPU, asked=req.cpu, free=free)
        if node.cpu_room(req) < req.cpu:
            return Rejection(Rule.CPU_RESERVED, asked=req.cpu, free=free, reserved=node.res_cpu)
        return None


class MemoryFilter:
    name = "memory"

    def check(
        self, node: NodeAlloc, req: Request, constraints: Sequence[Constraint]
    ) -> Rejection | None:
        free = node.mem_free
        if free < req.memory:
            return Rejection(Rule.MEMORY, asked=req.memory, free=free)
        if node.mem_room(req) < req.memory:
            return Rejection(
                Rule.MEMORY_RESERVED, asked=req.memory, free=free, reserved=node.res_mem
            )
        return None


#: Static rules first (they never change within a pass), then capacity.
DEFAULT_FILTERS: tuple[Filter, ...] = (
    NodeStateFilter(),
    ConstraintFilter(),
    TaintFilter(),
    GpuModelFilter(),
    GpuMemoryFilter(),
    GpuCountFilter(),
    CpuFilter(),
    MemoryFilter(),
)


#: The rules that cannot change within a pass (no capacity in them): a node they
#: reject is out for every replica with the same rules, whatever is placed.
STATIC_FILTERS: tuple[Filter, ...] = DEFAULT_FILTERS[:5]


def explain_node(
    node: NodeAlloc,
    req: Request,
    constraints: Sequence[Constraint],
    filters: Sequence[Filter] = DEFAULT_FILTERS,
) -> Rejection | None:
    """The first rule that rejects the request on this node, None if it fits."""
    for f in filters:
        reason = f.check(node, req, constraints)
        if reason is not None:
            return reason
    return None


def diagnose(
    nodes: Sequence[NodeAlloc],
    req: Request,
    constraints: Sequence[Constraint],
    filters: Sequence[Filter] = DEFAULT_FILTERS,
) -> Diagnosis:
    """Every node's first rejecting rule, counted by cause (a verdict's per-node
    detail is left out), and how many fit."""
    return Diagnosis.count(len(nodes), (explain_node(n, req, constraints, filters) for n in nodes))
