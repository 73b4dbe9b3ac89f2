"""The fit kernel and the score kernel: the one definition of "does it fit" and
"how good is it" that the selector, the filters, the reconcile pass and
``forge explain`` all share.

A node's room for a request is not just its free capacity: work that asks no GPU
may not use what the node's free GPUs reserve (``NodeAlloc.res_cpu`` /
``res_mem``, see :mod:`forge.core.placement.state`). Writing that rule once keeps
"the selector placed it" and "explain says it fits" from drifting apart.

These are plain functions over :class:`NodeAlloc`'s slots, written for the hot
path: the selector calls them once per node checked or scored (a 50,000-replica
pass makes about a million such calls), so they read attributes directly rather
than through properties.
"""

from __future__ import annotations

from typing import Protocol

from forge.core.models import GPU_MILLI, Node, Request

__all__ = [
    "GPU_WEIGHT",
    "Alloc",
    "Shortfall",
    "default_score",
    "fits",
    "shortfall",
    "utilisation_after",
]

GPU_WEIGHT = 2.0  # the original weighs GPU utilisation double: GPUs are the scarce part


class Alloc(Protocol):
    """What the kernel reads of a node's allocation during a pass: the slots of
    :class:`forge.core.placement.state.NodeAlloc` (declared here, so the kernel
    depends on no module above it)."""

    node: Node
    cpu_used: int
    mem_used: int
    gpus_used: int
    milli_free: int
    res_cpu: int
    res_mem: int

    def matching_gpus(self, req: Request, *, free_only: bool) -> list[int]: ...

    def shared_gpus(self, req: Request) -> list[int]: ...


class Shortfall:
    """Which dimension a node came up short in, as small ints (a class tallies one
    per node it drops, so these stay cheap): :func:`shortfall`'s answers."""

    GPU = 0  # too few free devices (or no device with room for a share), or a device rule
    CPU = 1
    MEMORY = 2
    RESERVED = 3  # cpu or memory held for the node's free GPUs


def fits(node: Alloc, req: Request) -> bool:
    """Can the node take the request now: cpu, memory (net of the GPU reservation
    for work that asks no GPU), then wholly free devices or one device with room
    for a share."""
    n = node.node
    if req.gpu:
        if n.cpu - node.cpu_used < req.cpu or n.memory - node.mem_used < req.memory:
            return False
        if req.gpu_milli:
            if node.milli_free < req.gpu_milli:
                return False
            return bool(node.shared_gpus(req))
        if len(n.gpus) - node.gpus_used < req.gpu:
            return False
        if not (req.gpu_models or req.gpu_memory):
            return True  # every device matches: the free count says it all
        return len(node.matching_gpus(req, free_only=True)) >= req.gpu
    return (
        n.cpu - node.cpu_used - node.res_cpu >= req.cpu
        and n.memory - node.mem_used - node.res_mem >= req.memory
    )


def shortfall(node: Alloc, req: Request) -> int:
    """The first dimension in which a node that does not :func:`fits` falls short,
    in the filter chain's order (GPU, cpu, memory, then the reservation)."""
    n = node.node
    if req.gpu and not (
        bool(node.shared_gpus(req)) if req.gpu_milli else len(n.gpus) - node.gpus_used >= req.gpu
    ):
        return Shortfall.GPU
    if n.cpu - node.cpu_used < req.cpu:
        return Shortfall.CPU
    if n.memory - node.mem_used < req.memory:
        return Shortfall.MEMORY
    if req.gpu:
        return Shortfall.GPU  # a device rule (model, memory) on the free ones
    return Shortfall.RESERVED


def utilisation_after(node: Alloc, req: Request) -> float:
    """Weighted mean utilisation (0..1) of the node if the replica were placed."""
    n = node.node
    total = (node.cpu_used + req.cpu) / n.cpu if n.cpu else 1.0
    total += (node.mem_used + req.memory) / n.memory if n.memory else 1.0
    if n.gpus:
        # in milli-GPU: the same quotient as whole devices when nothing is shared
        cap = GPU_MILLI * len(n.gpus)
        return (total + GPU_WEIGHT * ((cap - node.milli_free + req.milli) / cap)) / (
            2.0 + GPU_WEIGHT
        )
    return total / 2.0


def default_score(node: Alloc, req: Request, spread: bool) -> float:
    """The default chains' score (0..100) in one call: spread (``spread``) or
    binpack, whose "a node in use first" is written out here. The same numbers as
    the weighted mean :func:`forge.core.placement.scorers.combined` computes over
    the scorer objects (a property test holds them equal), with
    :func:`utilisation_after` written out. The hot path of a pass,
    :func:`forge.core.placement.scan.best_in_window`, writes this out in turn (a
    property test holds the two exactly equal): change both or neither."""
    n = node.node
    total = (node.cpu_used + req.cpu) / n.cpu if n.cpu else 1.0
    total += (node.mem_used + req.memory) / n.memory if n.memory else 1.0
    if n.gpus:
        cap = GPU_MILLI * len(n.gpus)
        total = (total + GPU_WEIGHT * ((cap - node.milli_free + req.milli) / cap)) / (
            2.0 + GPU_WEIGHT
        )
    else:
        total = total / 2.0
    util = 100.0 * (total if total < 1.0 else 1.0)
    if spread:
        return 100.0 - util
    if node.cpu_used or node.mem_used or node.gpus_used:
        return 50.0 + util / 2.0  # a node in use beats every empty one
    return (100.0 - util) / 2.0  # and if one must be opened, the largest
