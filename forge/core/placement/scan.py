"""The selector's scans: find the feasible nodes of an equivalence class, and
(binpack with a default scorer chain) score them in the same loop.

Each returns the work it did (nodes checked and scored) for the placer's
deterministic budget. Feasibility is the fit kernel and the score is the score
kernel (:mod:`forge.core.placement.kernel`); a node that fails the kernel is
dropped by the class for the rest of the pass with its shortfall noted, since
placements only consume capacity (re-admission aside: ``Placer._readmit``).
"""

from __future__ import annotations

from forge.core.models import GPU_MILLI, Request
from forge.core.placement.classes import EquivalenceClass
from forge.core.placement.kernel import GPU_WEIGHT, fits
from forge.core.placement.state import NodeAlloc

__all__ = ["AVOID_PENALTY", "Found", "best_in_window", "drain", "scan_ring", "scan_window"]

# Subtracted for the node a failed replica ran on. Larger than the whole score range
# (0..100), so any other feasible node in the window wins over it.
AVOID_PENALTY = 1000.0
_GPU_DIV = 2.0 + GPU_WEIGHT

#: Feasible nodes found, as (position in the class's nodes, node).
Found = list[tuple[int, NodeAlloc]]


def _limit(candidates: int, n: int) -> int:
    return candidates if candidates > 0 else n


def scan_ring(cls: EquivalenceClass, req: Request, candidates: int) -> tuple[Found, int]:
    """spread: the first ``candidates`` feasible nodes from the cursor, round the
    ring of the class's nodes (the caller moves the cursor past its choice)."""
    if cls.dead > 64 and cls.dead * 2 > len(cls.cands):
        cls.compact()
    cands, alive = cls.cands, cls.alive
    n = len(cands)
    if n == 0:
        return [], 0
    limit = _limit(candidates, n)
    found: Found = []
    i = cls.ptr
    checked = 0
    for _ in range(n):
        if alive[i]:
            checked += 1
            node = cands[i]
            if fits(node, req):
                found.append((i, node))
                if len(found) >= limit:
                    break
            else:
                alive[i] = 0
                cls.dead += 1
                cls.reject(node, req)
        i += 1
        if i == n:
            i = 0
    return found, checked + len(found)


def scan_window(cls: EquivalenceClass, req: Request, candidates: int) -> tuple[Found, int]:
    """binpack: the first ``candidates`` feasible nodes in the class's order.

    Re-checks the previous window and refills it from the frontier, so each
    node is scanned once per class and a pass costs O(classes x nodes +
    replicas x candidates), never re-skipping the nodes already found full.
    A node that drops out of the window is full for this class for the rest
    of the pass (placements only consume capacity), so when the frontier has
    reached the end and the window is empty, no node can take the replica.
    """
    if cls.extra:
        drain(cls, req, candidates)
    cands = cls.cands
    n = len(cands)
    limit = _limit(candidates, n)
    found: Found = []
    for i in cls.window:
        node = cands[i]
        if fits(node, req):
            found.append((i, node))
        else:
            cls.reject(node, req)
    checked = len(cls.window)
    extra = cls.extra
    while len(found) < limit and extra:  # re-admitted nodes first (Placer._readmit)
        node = extra.pop(0)
        if fits(node, req):
            found.append((len(cands), node))
            cands.append(node)
            cls.alive.append(1)
        else:
            cls.reject(node, req)
    start = i = cls.frontier
    while len(found) < limit and i < n:
        node = cands[i]
        if fits(node, req):
            found.append((i, node))
        else:
            cls.reject(node, req)
        i += 1
    cls.frontier = i
    cls.window = [pos for pos, _ in found]
    cls.fresh = False
    return found, checked + (i - start) + len(found)


def best_in_window(
    cls: EquivalenceClass, req: Request, avoid: str | None, candidates: int
) -> tuple[int, NodeAlloc | None, float, int]:
    """binpack with a default scorer chain: :func:`scan_window` and the scoring of
    the window in one loop (the hot path of a pass). Returns the best position,
    node and score (``-1, None``: nothing fits) and the work done; the number of
    nodes scored is the new window's length.

    The fit kernel (for work without GPUs) and the score kernel are written out
    here, with the request's fields read once: two calls and a property per node
    were a fifth of a 50,000-replica pass. A property test holds the window and
    the choice exactly equal to :func:`fits` and :func:`default_score`'s."""
    if cls.extra:
        drain(cls, req, candidates)
    cands = cls.cands
    n = len(cands)
    limit = _limit(candidates, n)
    extra = cls.extra
    old = cls.window
    k, n_old, i = 0, len(old), cls.frontier
    window: list[int] = []
    best_pos, best, best_score = -1, None, -1e18
    fit = fits  # a local: the loop runs once per node looked at
    rcpu, rmemory, rgpu, rmilli = req.cpu, req.memory, req.gpu, req.milli
    while True:
        if k < n_old:  # re-check the previous window
            pos = old[k]
            k += 1
        elif len(window) < limit and extra:  # then re-admitted nodes (Placer._readmit)
            pos = len(cands)
            cands.append(extra.pop(0))
            cls.alive.append(1)
        elif len(window) < limit and i < n:  # then refill it from the frontier
            pos = i
            i += 1
        else:
            break
        node = cands[pos]
        spec = node.node
        cpu_used, mem_used = node.cpu_used, node.mem_used
        if rgpu:
            if not fit(node, req):
                cls.reject(node, req)
                continue
        elif (
            spec.cpu - cpu_used - node.res_cpu < rcpu
            or spec.memory - mem_used - node.res_mem < rmemory
        ):
            cls.reject(node, req)
            continue
        window.append(pos)
        # kernel.default_score(node, req, False), written out
        total = (cpu_used + rcpu) / spec.cpu if spec.cpu else 1.0
        total += (mem_used + rmemory) / spec.memory if spec.memory else 1.0
        gpus = spec.gpus
        if gpus:
            cap = GPU_MILLI * len(gpus)
            total = (total + GPU_WEIGHT * ((cap - node.milli_free + rmilli) / cap)) / _GPU_DIV
        else:
            total = total / 2.0
        util = 100.0 * (total if total < 1.0 else 1.0)
        # a node in use beats every empty one; if one must be opened, the largest
        s = 50.0 + util / 2.0 if cpu_used or mem_used or node.gpus_used else (100.0 - util) / 2.0
        if avoid is not None and spec.id == avoid:
            s -= AVOID_PENALTY
        if s > best_score:
            best_pos, best, best_score = pos, node, s
    work = n_old + (i - cls.frontier) + len(window)
    cls.frontier = i
    cls.window = window
    cls.fresh = False
    return best_pos, best, best_score, work


def drain(cls: EquivalenceClass, req: Request, candidates: int) -> None:
    """binpack: move re-admitted nodes that fit into the window while it has
    fewer than ``candidates`` nodes: a candidate before any node the frontier
    has not reached (a used GPU node's spare cpu before an empty node), yet the
    window stays bounded. A node that no longer fits is dropped: capacity only
    shrinks until it is re-admitted again."""
    limit = candidates if candidates > 0 else len(cls.cands) + len(cls.extra)
    extra = cls.extra
    k = 0
    while k < len(extra) and len(cls.window) < limit:
        node = extra[k]
        k += 1
        if fits(node, req):
            cls.window.append(len(cls.cands))
            cls.cands.append(node)
            cls.alive.append(1)
        else:
            cls.reject(node, req)
    del extra[:k]
