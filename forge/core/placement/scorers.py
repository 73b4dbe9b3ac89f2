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
    "GpuPreserve",
    "PackUsed",
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
    """Prefer the fullest node that fits: fewer nodes used, big holes kept whole."""

    name = "binpack"

    def score(self, node: NodeAlloc, req: Request) -> float:
        return 100.0 * min(1.0, utilisation_after(node, req))


class PackUsed:
    """binpack from placement version 2: a node already in use beats every empty
    node (the fuller the better, as :class:`BinPack`), and when a node must be
    opened, the largest one. Scoring utilisation alone opens the smallest empty
    node (a small replica fills it most), which costs nodes; the original's
    exhaustive bin-pack avoided that by scoring utilisation before placing."""

    name = "binpack-v2"

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
    version: int = 1,
    workload: Sequence[tuple[Request, float]] = (),
    seed: int = 0,
) -> tuple[Weighted, ...]:
    """The scorer chain of an algorithm.

    ``version`` 1 is the chain old workflow histories were made with (binpack and
    spread with :class:`GpuPreserve`); from 2 the GPU reservation in the fit kernel
    keeps GPU nodes for GPU work, so the preference is dropped (it cost nodes and
    placed no more GPU work) and binpack fills nodes in use before it opens one
    (:class:`PackUsed`). ``workload`` (requests with their weights) is what
    :class:`forge.core.placement.fragmentation.Fgd` expects to arrive (fgd and fgd2);
    ``seed`` seeds ``random``.
    """
    if algorithm == "binpack":
        if version >= 2:
            return (Weighted(PackUsed(), 1.0),)
        return (Weighted(BinPack(), 1.0), Weighted(GpuPreserve(), 1.0))
    if algorithm == "spread":
        if version >= 2:
            return (Weighted(Spread(), 1.0),)
        return (Weighted(Spread(), 1.0), Weighted(GpuPreserve(), 1.0))
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
    if names == (("binpack", 1.0), ("gpu-preserve", 1.0)):
        return FastScore(spread=False)
    if names == (("spread", 1.0), ("gpu-preserve", 1.0)):
        return FastScore(spread=True)
    if names == (("binpack-v2", 1.0),):
        return FastScore(spread=False, preserve=False)
    if names == (("spread", 1.0),):
        return FastScore(spread=True, preserve=False)
    return None


class FastScore:
    """A default chain, as :func:`forge.core.placement.kernel.default_score`'s flags."""

    __slots__ = ("preserve", "spread")

    def __init__(self, *, spread: bool, preserve: bool = True) -> None:
        self.spread = spread
        self.preserve = preserve

    def __call__(self, node: NodeAlloc, req: Request) -> float:
        return default_score(node, req, self.spread, self.preserve)
