"""Selection: choose a node for each replica without scoring every node.

The exhaustive way (the original's) checks and scores every node for every
replica: O(R x N). Here, as in Borg, replicas are grouped into *equivalence
classes* (same request, same constraints). Each class keeps a cursor over its
statically eligible nodes in a seeded shuffled order (Nomad seeds its shuffle
from the evaluation id: reproducible, yet free of id-order bias):

* the node order is fixed for the pass, so a node that cannot take a class's
  replica now never can again in this pass (placements only consume capacity);
  the class forgets it for good, and the scan never revisits it;
* only the first ``candidates`` feasible nodes from the cursor are scored (Nomad's
  limit iterator, Kubernetes' percentageOfNodesToScore) and the best wins;
* when fewer are found the scan has covered every eligible node, so a replica
  is left unplaced only if no node can take it (invariant 4: the bounded sample
  never costs completeness); the class is then exhausted for the pass and its
  remaining replicas fail at once with the same diagnosis.

binpack keeps its cursor where the first feasible node is (first-fit order with
a best-fit choice inside the window); spread moves it past the chosen node
(round-robin, like Kubernetes' rotating start index).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from forge.models import Constraint, Request
from forge.placement.filters import diagnose, format_reasons
from forge.placement.scorers import GPU_WEIGHT, Weighted, combined, scorers_for
from forge.placement.state import Cluster, NodeAlloc

__all__ = ["DEFAULT_CANDIDATES", "Choice", "Placer"]

DEFAULT_CANDIDATES = 8
AVOID_PENALTY = 50.0  # subtracted for the node a failed replica ran on: prefer another


@dataclass(frozen=True, slots=True)
class Choice:
    node: NodeAlloc
    gpu_ids: tuple[str, ...]
    score: float


class _Class:
    """Cursor state of one equivalence class within a pass."""

    __slots__ = ("alive", "cands", "dead", "exhausted", "ptr", "why")

    def __init__(self, cands: list[NodeAlloc]) -> None:
        self.cands = cands
        self.alive = bytearray(b"\x01") * len(cands)
        self.dead = 0
        self.ptr = 0
        self.exhausted = False
        self.why = ""

    def compact(self) -> None:
        keep = [n for i, n in enumerate(self.cands) if self.alive[i]]
        # keep the cursor on the same node (or the next alive one)
        alive_before = sum(self.alive[: self.ptr]) if self.ptr else 0
        self.cands = keep
        self.alive = bytearray(b"\x01") * len(keep)
        self.dead = 0
        self.ptr = alive_before if alive_before < len(keep) else 0


class Placer:
    """Places replicas into a :class:`Cluster`, mutating its allocations.

    Deterministic: the same cluster, seed and sequence of calls give the same
    choices on any machine (``random.Random`` with an int seed is portable).
    """

    def __init__(
        self,
        cluster: Cluster,
        *,
        algorithm: str = "binpack",
        candidates: int = DEFAULT_CANDIDATES,
        seed: int = 0,
    ) -> None:
        self.cluster = cluster
        self.algorithm = algorithm
        self.scorers: tuple[Weighted, ...] = scorers_for(algorithm)
        self.candidates = candidates
        self._fast = _fast_scorer(self.scorers)
        order = list(cluster.nodes)
        random.Random(seed).shuffle(order)
        self._order = order
        self._static: dict[tuple[object, ...], list[NodeAlloc]] = {}
        self._classes: dict[tuple[Request, tuple[Constraint, ...]], _Class] = {}
        self.scored = 0  # how many node scores were computed (for benchmarks)

    # -- public -------------------------------------------------------------------
    def place(
        self,
        req: Request,
        constraints: tuple[Constraint, ...] = (),
        *,
        avoid: str | None = None,
    ) -> Choice | None:
        """Bind one replica to the best node found, or None if no node can take it."""
        cls = self._class(req, constraints)
        if cls.exhausted:
            return None
        found = self._scan(cls, req)
        if not found:
            cls.exhausted = True
            fit, reasons = diagnose(self.cluster.nodes, req, constraints)
            cls.why = format_reasons(len(self.cluster), fit, reasons)
            return None
        best_pos, best, best_score = -1, found[0][1], -1e18
        fast = self._fast
        for pos, node in found:
            s = fast(node, req) if fast is not None else combined(node, req, self.scorers)
            if avoid is not None and node.node.id == avoid:
                s -= AVOID_PENALTY
            if s > best_score:
                best_pos, best, best_score = pos, node, s
        self.scored += len(found)
        gpu_ids = best.allocate(req)
        if self.algorithm == "spread":
            cls.ptr = best_pos + 1 if best_pos + 1 < len(cls.cands) else 0
        if not best.fits(req):
            self._kill(cls, best_pos)
        return Choice(best, gpu_ids, best_score)

    def why_not(self, req: Request, constraints: tuple[Constraint, ...] = ()) -> str:
        """Why the class found no node (``"0/3 nodes available: 2 insufficient cpu, ..."``)."""
        cls = self._class(req, constraints)
        if cls.why:
            return cls.why
        fit, reasons = diagnose(self.cluster.nodes, req, constraints)
        return format_reasons(len(self.cluster), fit, reasons)

    # -- internals ----------------------------------------------------------------
    def _class(self, req: Request, constraints: tuple[Constraint, ...]) -> _Class:
        key = (req, constraints)
        cls = self._classes.get(key)
        if cls is None:
            cls = _Class(self._eligible(req, constraints))
            self._classes[key] = cls
        return cls

    def _eligible(self, req: Request, constraints: tuple[Constraint, ...]) -> list[NodeAlloc]:
        """Nodes that pass the rules that cannot change within a pass (state,
        labels, GPU model and memory), shared by every class with the same rules."""
        skey: tuple[object, ...] = (constraints, req.gpu_models, req.gpu_memory, req.gpu > 0)
        nodes = self._static.get(skey)
        if nodes is None:
            nodes = [
                n
                for n in self._order
                if n.schedulable
                and all(c.matches(n.node.labels) for c in constraints)
                and (not req.gpu or len(n.matching_gpus(req, free_only=False)) >= req.gpu)
            ]
            self._static[skey] = nodes
        return list(nodes)

    def _kill(self, cls: _Class, pos: int) -> None:
        if cls.alive[pos]:
            cls.alive[pos] = 0
            cls.dead += 1

    def _scan(self, cls: _Class, req: Request) -> list[tuple[int, NodeAlloc]]:
        if cls.dead > 64 and cls.dead * 2 > len(cls.cands):
            cls.compact()
        cands, alive = cls.cands, cls.alive
        n = len(cands)
        if n == 0:
            return []
        limit = self.candidates if self.candidates > 0 else n
        found: list[tuple[int, NodeAlloc]] = []
        i = cls.ptr
        cpu, mem, gpu = req.cpu, req.memory, req.gpu
        binpack = self.algorithm != "spread"
        for _ in range(n):
            if alive[i]:
                node = cands[i]
                ok = (
                    node.node.cpu - node.cpu_used >= cpu
                    and node.node.memory - node.mem_used >= mem
                    and (not gpu or node.fits(req))
                )
                if ok:
                    found.append((i, node))
                    if len(found) >= limit:
                        break
                else:
                    alive[i] = 0
                    cls.dead += 1
                    if binpack and i == cls.ptr:
                        cls.ptr = i + 1 if i + 1 < n else 0
            elif binpack and i == cls.ptr:
                cls.ptr = i + 1 if i + 1 < n else 0
            i += 1
            if i == n:
                i = 0
        return found


def _fast_scorer(scorers: Sequence[Weighted]) -> _FastScore | None:
    """An inlined equivalent of the default scorer chains (same numbers, ~5x less
    call overhead on the hot path). Any other chain uses the generic path."""
    names = tuple((w.scorer.name, w.weight) for w in scorers)
    if names == (("binpack", 1.0), ("gpu-preserve", 1.0)):
        return _FastScore(spread=False)
    if names == (("spread", 1.0), ("gpu-preserve", 1.0)):
        return _FastScore(spread=True)
    return None


class _FastScore:
    __slots__ = ("spread",)

    def __init__(self, *, spread: bool) -> None:
        self.spread = spread

    def __call__(self, node: NodeAlloc, req: Request) -> float:
        n = node.node
        ngpu = len(n.gpus)
        total = (node.cpu_used + req.cpu) / n.cpu if n.cpu else 1.0
        total += (node.mem_used + req.memory) / n.memory if n.memory else 1.0
        if ngpu:
            total = (total + GPU_WEIGHT * (node.gpus_used + req.gpu) / ngpu) / (2.0 + GPU_WEIGHT)
            preserve = 100.0 if req.gpu else 100.0 * node.gpus_used / ngpu
        else:
            total = total / 2.0
            preserve = 100.0
        util = 100.0 * min(1.0, total)
        return ((100.0 - util if self.spread else util) + preserve) / 2.0
