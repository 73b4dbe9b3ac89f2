"""Feasibility filters: can this node take this replica, and if not, why?

Each filter is a small named rule (Kubernetes' Filter extension point, Nomad's
feasibility checkers). The selector runs a fast inlined check on its hot path and
uses this chain only to explain a failure, so the reasons a user reads come from
the same rules that decided (capacity through :meth:`NodeAlloc.fits`'s own
quantities: ``cpu_room``, ``mem_room``, per-device free milli-GPU).

A reason may carry per-node detail in parentheses (``insufficient gpu share
(gpu3: 300 free < 500 asked)``); :func:`diagnose` counts reasons by the part
before it, so a cluster-wide summary stays a handful of categories.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from forge.core.models import Constraint, NodeState, Request, tolerated
from forge.core.placement.state import NodeAlloc

__all__ = [
    "DEFAULT_FILTERS",
    "INSUFFICIENT_CPU",
    "INSUFFICIENT_GPU",
    "INSUFFICIENT_MEMORY",
    "STATIC_FILTERS",
    "ConstraintFilter",
    "CpuFilter",
    "Diagnosis",
    "Filter",
    "GpuCountFilter",
    "GpuMemoryFilter",
    "GpuModelFilter",
    "MemoryFilter",
    "NodeStateFilter",
    "TaintFilter",
    "diagnose",
    "explain_node",
    "format_reasons",
    "reason_category",
]


#: The capacity rules' reasons, in the order the chain checks them.
INSUFFICIENT_GPU = "insufficient gpu"
INSUFFICIENT_CPU = "insufficient cpu"
INSUFFICIENT_MEMORY = "insufficient memory"


class Filter(Protocol):
    """Returns None when the node passes, else a short reason ("insufficient cpu")."""

    name: str

    def check(
        self, node: NodeAlloc, req: Request, constraints: Sequence[Constraint]
    ) -> str | None: ...


class NodeStateFilter:
    name = "node-state"

    def check(self, node: NodeAlloc, req: Request, constraints: Sequence[Constraint]) -> str | None:
        state = node.node.state
        return None if state is NodeState.READY else str(state.value)


class ConstraintFilter:
    name = "constraints"

    def check(self, node: NodeAlloc, req: Request, constraints: Sequence[Constraint]) -> str | None:
        for c in constraints:
            if not c.matches(node.node.labels):
                return f"constraint {c.label} {c.op} {','.join(c.values)}".rstrip()
        return None


class TaintFilter:
    name = "taints"

    def check(self, node: NodeAlloc, req: Request, constraints: Sequence[Constraint]) -> str | None:
        taint = tolerated(node.node.taints, req.tolerations)
        if taint is None:
            return None
        return f"untolerated taint ({taint.key}={taint.value}:{taint.effect})"


class GpuModelFilter:
    name = "gpu-model"

    def check(self, node: NodeAlloc, req: Request, constraints: Sequence[Constraint]) -> str | None:
        if not req.gpu or not req.gpu_models:
            return None
        have = sum(1 for g in node.node.gpus if g.model in req.gpu_models)
        return None if have >= req.gpu else "gpu model"


class GpuMemoryFilter:
    name = "gpu-memory"

    def check(self, node: NodeAlloc, req: Request, constraints: Sequence[Constraint]) -> str | None:
        if not req.gpu or not req.gpu_memory:
            return None
        have = len(node.matching_gpus(req, free_only=False))
        return None if have >= req.gpu else "insufficient gpu memory"


class GpuCountFilter:
    name = "gpu"

    def check(self, node: NodeAlloc, req: Request, constraints: Sequence[Constraint]) -> str | None:
        if not req.gpu:
            return None
        if req.gpu_milli:
            if node.shared_gpus(req):
                return None
            # the matching devices with the most room first: what a user can act on
            devs = node.matching_gpus(req, free_only=False)
            devs.sort(key=lambda i: (-node.gpu_left[i], i))
            shown = ", ".join(
                f"{node.node.gpus[i].id}: {node.gpu_left[i]} free < {req.gpu_milli} asked"
                for i in devs[:3]
            )
            more = f", +{len(devs) - 3} more" if len(devs) > 3 else ""
            return f"insufficient gpu share ({shown}{more})"
        return (
            None
            if len(node.matching_gpus(req, free_only=True)) >= req.gpu
            else ("insufficient gpu")
        )


class CpuFilter:
    name = "cpu"

    def check(self, node: NodeAlloc, req: Request, constraints: Sequence[Constraint]) -> str | None:
        if node.cpu_free < req.cpu:
            return "insufficient cpu"
        if node.cpu_room(req) < req.cpu:
            return (
                f"cpu reserved for free gpus ({node.cpu_free}m free, {node.res_cpu}m reserved "
                f"< {req.cpu}m asked)"
            )
        return None


class MemoryFilter:
    name = "memory"

    def check(self, node: NodeAlloc, req: Request, constraints: Sequence[Constraint]) -> str | None:
        if node.mem_free < req.memory:
            return "insufficient memory"
        if node.mem_room(req) < req.memory:
            return (
                f"memory reserved for free gpus ({node.mem_free}MiB free, {node.res_mem}MiB "
                f"reserved < {req.memory}MiB asked)"
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


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """Why no node took a replica, as data (Nomad's AllocMetric, Kubernetes'
    "0/N nodes available"): every node counted once, under the first rule that
    rejected it. Formatted only where a person reads it (``str``)."""

    total: int
    fit: int
    rejected: tuple[tuple[str, int], ...]  # (reason, nodes), most nodes first

    @classmethod
    def of(cls, total: int, fit: int, counts: Mapping[str, int]) -> Diagnosis:
        ordered = sorted(((r, n) for r, n in counts.items() if n), key=lambda kv: (-kv[1], kv[0]))
        return cls(total, fit, tuple(ordered))

    def __str__(self) -> str:
        return format_reasons(self.total, self.fit, Counter(dict(self.rejected)))


def explain_node(
    node: NodeAlloc,
    req: Request,
    constraints: Sequence[Constraint],
    filters: Sequence[Filter] = DEFAULT_FILTERS,
) -> str | None:
    """The first reason this node rejects the request, None if it fits."""
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
) -> tuple[int, Counter[str]]:
    """How many nodes fit, and the first rejecting reason counted over the others
    (by category: a reason's per-node detail in parentheses is left out)."""
    fit = 0
    reasons: Counter[str] = Counter()
    for n in nodes:
        reason = explain_node(n, req, constraints, filters)
        if reason is None:
            fit += 1
        else:
            reasons[reason_category(reason)] += 1
    return fit, reasons


def reason_category(reason: str) -> str:
    """``insufficient gpu share (gpu3: 300 free < 500 asked)`` -> ``insufficient gpu share``."""
    cut = reason.find(" (")
    return reason if cut < 0 else reason[:cut]


def format_reasons(total: int, fit: int, reasons: Counter[str]) -> str:
    """Kubernetes-style: ``0/1523 nodes available: 812 insufficient gpu, 3 draining``."""
    parts = [f"{n} {r}" for r, n in sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))]
    head = f"{fit}/{total} nodes available"
    return f"{head}: {', '.join(parts)}" if parts else head
