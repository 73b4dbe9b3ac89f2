"""Scorers: how good is this (feasible) node for this replica?

Each scorer returns a bounded score in 0..100 (Kubernetes' NormalizeScore range);
the selector combines them as a weighted mean, so adding a rule is one small
class and one weight, and no scorer can drown the others.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, get_args

from forge.core.models import Request
from forge.core.placement.fragmentation import Fgd
from forge.core.placement.gpu import BestFit, DotProduct, GpuClustering, GpuPacking, RandomFit
from forge.core.placement.kernel import GPU_WEIGHT, default_score, utilisation_after
from forge.core.placement.state import NodeAlloc

__all__ = [
    "ALGORITHMS",
    "GPU_WEIGHT",
    "Algorithm",
    "BinPack",
    "FastScore",
    "Scorer",
    "Spread",
    "Weighted",
    "combined",
    "fast_scorer",
    "scorers_for",
    "utilisation_after",
]


class Scorer(Protocol):
    name: str

    def score(self, node: NodeAlloc, req: Request) -> float: ...


class BinPack:
    """Prefer the fullest node that fits, and a node already in use to every empty
    one; when a node must be opened, the largest. Scoring utilisation alone opens
    the smallest empty node (a small replica fills it most), which costs nodes; the
    original's exhaustive bin-pack avoided that by scoring utilisation before
    placing. GPU nodes are kept for GPU work by the fit kernel's reservation, not
    by a score (a preference for GPU-less nodes cost nodes and placed no more GPU
    work)."""

    name = "binpack"

    def score(self, node: NodeAlloc, req: Request) -> float:
        util = 100.0 * min(1.0, utilisation_after(node, req))
        if node.cpu_used or node.mem_used or node.gpus_used:
            return 50.0 + util / 2.0
        return (100.0 - util) / 2.0


class Spread:
    """Prefer the emptiest node: replicas far apart, headroom everywhere."""

    name = "spread"

    def score(self, node: NodeAlloc, req: Request) -> float:
        return 100.0 * (1.0 - min(1.0, utilisation_after(node, req)))


@dataclass(frozen=True, slots=True)
class Weighted:
    scorer: Scorer
    weight: float


Algorithm = Literal[
    "binpack",
    "spread",
    "fgd",
    "fgd2",
    "best-fit",
    "dot-product",
    "gpu-packing",
    "gpu-clustering",
    "random",
]
ALGORITHMS: tuple[str, ...] = get_args(Algorithm)


def scorers_for(
    algorithm: str,
    *,
    workload: Sequence[tuple[Request, float]] = (),
    seed: int = 0,
) -> tuple[Weighted, ...]:
    """The scorer chain of an algorithm. ``workload`` (requests with their weights) is what
    :class:`forge.core.placement.fragmentation.Fgd` expects to arrive (fgd and fgd2);
    ``seed`` seeds ``random``.
    """
    if algorithm == "binpack":
        return (Weighted(BinPack(), 1.0),)
    if algorithm == "spread":
        return (Weighted(Spread(), 1.0),)
    if algorithm == "fgd":
        return (Weighted(Fgd(workload), 1.0),)
    if algorithm == "fgd2":
        return (Weighted(Fgd(workload, memory=True), 1.0),)
    if algorithm == "best-fit":
        return (Weighted(BestFit(), 1.0),)
    if algorithm == "dot-product":
        return (Weighted(DotProduct(), 1.0),)
    if algorithm == "gpu-packing":
        return (Weighted(GpuPacking(), 1.0),)
    if algorithm == "gpu-clustering":
        return (Weighted(GpuClustering(), 1.0),)
    if algorithm == "random":
        return (Weighted(RandomFit(seed), 1.0),)
    raise ValueError(f"unknown algorithm {algorithm!r}; choose one of {', '.join(ALGORITHMS)}")


def combined(node: NodeAlloc, req: Request, scorers: Sequence[Weighted]) -> float:
    total = 0.0
    weights = 0.0
    for w in scorers:
        total += w.weight * w.scorer.score(node, req)
        weights += w.weight
    return total / weights if weights else 0.0


def fast_scorer(scorers: Sequence[Weighted]) -> FastScore | None:
    """The score kernel in place of the default scorer chains (same numbers, ~5x
    less call overhead on the hot path). Any other chain uses the generic path."""
    names = tuple((w.scorer.name, w.weight) for w in scorers)
    if names == (("binpack", 1.0),):
        return FastScore(spread=False)
    if names == (("spread", 1.0),):
        return FastScore(spread=True)
    return None


class FastScore:
    """A default chain, as :func:`forge.core.placement.kernel.default_score`'s flags."""

    __slots__ = ("spread",)

    def __init__(self, *, spread: bool) -> None:
        self.spread = spread

    def __call__(self, node: NodeAlloc, req: Request) -> float:
        return default_score(node, req, self.spread)
