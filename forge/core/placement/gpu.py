"""The GPU-sharing baselines of the FGD paper, as Forge scorers (0..100, higher wins).

Each follows the policy the paper compares against (its simulator's scoring,
re-derived from the description in ``../shared/research/fgd.md``), normalised by
the paper's largest node (128 cores, 8 GPUs). They run through the same bounded
selector as every other scorer; ``bench/fragmentation.py`` measures them.
"""

from __future__ import annotations

import random

from forge.core.models import GPU_MILLI, Request
from forge.core.placement.state import NodeAlloc

__all__ = [
    "MAX_CPU",
    "MAX_GPU_MILLI",
    "BestFit",
    "DotProduct",
    "GpuClustering",
    "GpuPacking",
    "RandomFit",
]

MAX_CPU = 128_000  # millicores: the paper's normalisation (its largest node)
MAX_GPU_MILLI = 8 * GPU_MILLI


def _clamp(s: float) -> float:
    return 0.0 if s < 0.0 else (100.0 if s > 100.0 else s)


class BestFit:
    """The node left with the least free cpu and GPU after placing (equal weights),
    and within it the tightest device (the allocator's default for a share)."""

    name = "best-fit"

    def score(self, node: NodeAlloc, req: Request) -> float:
        cpu_left = (node.node.cpu - node.cpu_used - req.cpu) / MAX_CPU
        gpu_left = (node.milli_free - req.milli) / MAX_GPU_MILLI
        return _clamp(100.0 * (1.0 - 0.5 * cpu_left - 0.5 * gpu_left))


class DotProduct:
    """The node whose free (cpu, GPU) vector has the smallest dot product with the
    request's (Tetris-style alignment, normalised by the largest node)."""

    name = "dot-product"

    def score(self, node: NodeAlloc, req: Request) -> float:
        dot = (node.node.cpu - node.cpu_used) / MAX_CPU * req.cpu / MAX_CPU
        dot += node.milli_free / MAX_GPU_MILLI * req.milli / MAX_GPU_MILLI
        return _clamp(100.0 * (1.0 - dot / 2.0))


class GpuPacking:
    """Already-shared devices first, then free devices of a node already in use,
    then an idle node (three tiers; inside a tier the fuller the better). Work
    without GPUs scores the same everywhere (the window order decides)."""

    name = "gpu-packing"

    def score(self, node: NodeAlloc, req: Request) -> float:
        if not req.gpu:
            return 0.0
        ngpu = len(node.node.gpus)
        if not ngpu:
            return 0.0
        if node.gpus_used == 0:  # an idle node
            return _clamp(100.0 / 3.0 - ngpu)
        if req.gpu_milli:
            shared = [i for i in node.shared_gpus(req) if not node.gpu_free[i]]
            if shared:  # a device that is already shared: the least free one
                left = min(node.gpu_left[i] for i in shared)
                return _clamp(100.0 - left * 100.0 / GPU_MILLI / 10.0)
            return _clamp(50.0 - 1.0)
        return _clamp(max(100.0 / 3.0, 50.0 - req.gpu))


def _kind(req: Request) -> str:
    if not req.gpu:
        return ""
    return "shared" if req.gpu_milli else f"{req.gpu}-gpu"


class GpuClustering:
    """Nodes whose replicas are of the same kind (shared / k-GPU) first: a node
    holding only this kind, then one holding it among others, then an idle node,
    then one holding other kinds; inside a tier the less free GPU the better.

    It learns the kinds from the placements it sees (:meth:`placed`), so in a pass
    that starts with bindings already held it knows only this pass's placements.
    """

    name = "gpu-clustering"

    def __init__(self) -> None:
        self.kinds: dict[int, dict[str, int]] = {}

    def placed(self, node: NodeAlloc, req: Request) -> None:
        kind = _kind(req)
        if kind:
            k = self.kinds.setdefault(node.index, {})
            k[kind] = k.get(kind, 0) + 1

    def score(self, node: NodeAlloc, req: Request) -> float:
        kind = _kind(req)
        if not kind:
            return 0.0
        fill = 25.0 * (MAX_GPU_MILLI - node.milli_free) / MAX_GPU_MILLI
        kinds = self.kinds.get(node.index, {})
        if kinds.get(kind):
            return _clamp(fill + (75.0 if len(kinds) == 1 else 50.0))
        return _clamp(fill + (25.0 if not kinds else 0.0))


class RandomFit:
    """Any feasible node, drawn from a seeded generator (deterministic per seed and
    sequence of calls)."""

    name = "random"

    def __init__(self, seed: int = 0) -> None:
        self._rng = random.Random(seed)

    def score(self, node: NodeAlloc, req: Request) -> float:
        return 100.0 * self._rng.random()
