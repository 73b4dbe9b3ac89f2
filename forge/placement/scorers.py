"""Scorers: how good is this (feasible) node for this replica?

Each scorer returns a bounded score in 0..100 (Kubernetes' NormalizeScore range);
the selector combines them as a weighted mean, so adding a rule is one small
class and one weight, and no scorer can drown the others.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from forge.models import Request
from forge.placement.state import NodeAlloc

__all__ = [
    "ALGORITHMS",
    "BinPack",
    "GpuPreserve",
    "Scorer",
    "Spread",
    "Weighted",
    "combined",
    "scorers_for",
    "utilisation_after",
]

GPU_WEIGHT = 2.0  # the original weighs GPU utilisation double: GPUs are the scarce part


class Scorer(Protocol):
    name: str

    def score(self, node: NodeAlloc, req: Request) -> float: ...


def utilisation_after(node: NodeAlloc, req: Request) -> float:
    """Weighted mean utilisation (0..1) of the node if the replica were placed."""
    n = node.node
    total = (node.cpu_used + req.cpu) / n.cpu if n.cpu else 1.0
    total += (node.mem_used + req.memory) / n.memory if n.memory else 1.0
    weights = 2.0
    if n.gpus:
        total += GPU_WEIGHT * (node.gpus_used + req.gpu) / len(n.gpus)
        weights += GPU_WEIGHT
    return total / weights


class BinPack:
    """Prefer the fullest node that fits: fewer nodes used, big holes kept whole."""

    name = "binpack"

    def score(self, node: NodeAlloc, req: Request) -> float:
        return 100.0 * min(1.0, utilisation_after(node, req))


class Spread:
    """Prefer the emptiest node: replicas far apart, headroom everywhere."""

    name = "spread"

    def score(self, node: NodeAlloc, req: Request) -> float:
        return 100.0 * (1.0 - min(1.0, utilisation_after(node, req)))


class GpuPreserve:
    """Keep GPU nodes for GPU work: a replica that needs no GPU scores lower on a
    node that has free GPUs (the fragmentation the Alibaba trace paper measures)."""

    name = "gpu-preserve"

    def score(self, node: NodeAlloc, req: Request) -> float:
        if req.gpu or not node.node.gpus:
            return 100.0
        return 100.0 * node.gpus_used / len(node.node.gpus)


@dataclass(frozen=True, slots=True)
class Weighted:
    scorer: Scorer
    weight: float


ALGORITHMS = ("binpack", "spread")


def scorers_for(algorithm: str) -> tuple[Weighted, ...]:
    if algorithm == "binpack":
        return (Weighted(BinPack(), 1.0), Weighted(GpuPreserve(), 1.0))
    if algorithm == "spread":
        return (Weighted(Spread(), 1.0), Weighted(GpuPreserve(), 1.0))
    raise ValueError(f"unknown algorithm {algorithm!r}; choose one of {', '.join(ALGORITHMS)}")


def combined(node: NodeAlloc, req: Request, scorers: Sequence[Weighted]) -> float:
    total = 0.0
    weights = 0.0
    for w in scorers:
        total += w.weight * w.scorer.score(node, req)
        weights += w.weight
    return total / weights if weights else 0.0
