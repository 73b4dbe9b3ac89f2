"""Equivalence classes: the replicas of a pass that share a request and its
constraints share one cursor over the nodes (Borg's equivalence classes), so a
node found full for one of them is never looked at again for the others."""

from __future__ import annotations

from forge.core.models import Constraint, Request
from forge.core.placement.diagnosis import Diagnosis, Rejection, Rule
from forge.core.placement.kernel import Shortfall, shortfall
from forge.core.placement.state import NodeAlloc

__all__ = ["CAPACITY_CAUSES", "EquivalenceClass", "static_key"]

#: What a class counts a node it dropped for capacity under, by :class:`Shortfall`.
CAPACITY_CAUSES: dict[int, Rejection] = {
    Shortfall.GPU: Rejection(Rule.GPU),
    Shortfall.CPU: Rejection(Rule.CPU),
    Shortfall.MEMORY: Rejection(Rule.MEMORY),
    Shortfall.RESERVED: Rejection(Rule.RESERVED),
}


class EquivalenceClass:
    """Cursor state of one equivalence class within a pass.

    spread uses ``ptr`` / ``alive``; binpack uses ``window`` (the positions of the
    first ``candidates`` feasible nodes, in order) and ``frontier`` (the first
    position never scanned): every position before the frontier that is not in
    the window cannot take the class's replica for the rest of the pass.

    binpack's rebase (``Placer._rebase``) lets a class take over a peer's node
    list without copying it (copying ~5,000 node references per request-class
    switch was most of a 50,000-replica pass). ``own``: no other class holds
    ``cands``, so it may be appended to (a shared list is copied first).
    ``fresh``: the class was just rebased and has not scanned since: its window
    is the peer's, which stands for the nodes a copy would have put first, before
    the frontier (see :meth:`unshare`).
    """

    __slots__ = (
        "alive",
        "cands",
        "dead",
        "exhausted",
        "extra",
        "fresh",
        "frontier",
        "own",
        "ptr",
        "rejected",
        "revived",
        "why",
        "window",
    )

    def __init__(self, cands: list[NodeAlloc], revived: int = 0) -> None:
        self.cands = cands
        self.revived = revived  # how much of the placer's revived nodes this class has seen
        # binpack: re-admitted nodes waiting for room in the window (Placer._readmit)
        self.extra: list[NodeAlloc] = []
        self.alive = bytearray(b"\x01") * len(cands)
        self.own = True  # a fresh list (Eligibility.nodes): nobody else holds it
        self.fresh = False
        self.dead = 0
        self.ptr = 0
        self.window: list[int] = []
        self.frontier = 0
        self.exhausted = False
        self.why: Diagnosis | None = None
        # Nodes this class dropped for capacity (node index -> Shortfall), noted as
        # the scan drops them: when the class runs out, that is its diagnosis,
        # without a second sweep over the nodes (a re-admitted node leaves it).
        self.rejected: dict[int, int] = {}

    def reject(self, node: NodeAlloc, req: Request) -> None:
        self.rejected[node.index] = shortfall(node, req)

    def capacity_counts(self) -> dict[Rejection, int]:
        counts: dict[Rejection, int] = {}
        for code in self.rejected.values():
            cause = CAPACITY_CAUSES[code]
            counts[cause] = counts.get(cause, 0) + 1
        return counts

    def unshare(self) -> None:
        """Give the class a node list of its own before it is appended to (the
        re-admission of revived nodes; rare). A just rebased (``fresh``) class
        gets the list a copying rebase made: the peer's window nodes first, then
        the nodes past its frontier, from position 0 with an empty window; so its
        re-admitted nodes go into the window ahead of the peer's window nodes, as
        with the copy. Any other class keeps its positions."""
        if self.fresh:
            cands = self.cands
            nodes = [cands[i] for i in self.window]
            nodes += cands[self.frontier :]
            self.cands = nodes
            self.window = []
            self.frontier = 0
            self.fresh = False
        else:
            self.cands = list(self.cands)
        self.alive = bytearray(b"\x01") * len(self.cands)
        self.own = True

    def compact(self) -> None:
        keep = [n for i, n in enumerate(self.cands) if self.alive[i]]
        # keep the cursor on the same node (or the next alive one)
        alive_before = sum(self.alive[: self.ptr]) if self.ptr else 0
        self.cands = keep
        self.alive = bytearray(b"\x01") * len(keep)
        self.dead = 0
        self.ptr = alive_before if alive_before < len(keep) else 0


def static_key(req: Request, constraints: tuple[Constraint, ...]) -> tuple[object, ...]:
    """What decides a node's static eligibility. The gpu count is part of it: a node
    with 2 matching devices is eligible for a 1-GPU request but not a 4-GPU one. The
    share is part of it so that binpack's rebase never learns from a request whose
    "full" means something else (a node with no whole device free may hold a share)."""
    return (constraints, req.gpu_models, req.gpu_memory, req.gpu, req.gpu_milli, req.tolerations)
