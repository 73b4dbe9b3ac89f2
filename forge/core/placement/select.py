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

binpack keeps its window between replicas (re-checks it, refills it from a
frontier that only moves forward), and a class that (re)starts takes over the
remaining nodes of a recently used class with the same static rules and a
request no larger (every node full for that one is full for this one too): a
50,000-replica pass then scans each node about once per class instead of once
per replica, with the same choices (bench/placement.py measures it).

The GPU reservation (``Cluster(gpu_reserve=...)``) is the one exception to
"placements only consume capacity": taking a GPU frees its reservation, so a GPU
replica that asks less cpu or memory than its share gives work without GPUs more
room on that node. The placer records such nodes (``_revived``) and a class of
GPU-less work re-admits them before its next search, so completeness holds.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from forge.core.models import Constraint, Request
from forge.core.placement.classes import EquivalenceClass as _Class
from forge.core.placement.classes import static_key as _static_key
from forge.core.placement.diagnosis import Diagnosis
from forge.core.placement.eligible import COPY_PER_UNIT, Eligibility
from forge.core.placement.filters import diagnose
from forge.core.placement.scan import (
    AVOID_PENALTY,
    Found,
    best_in_window,
    drain,
    scan_ring,
    scan_window,
)
from forge.core.placement.scorers import Weighted, combined, scorers_for
from forge.core.placement.scorers import fast_scorer as _fast_scorer
from forge.core.placement.searches import REBASE_PEERS, Choice, Open, Peer, Searches
from forge.core.placement.state import Cluster, NodeAlloc

#: A request with its weight in the workload (how many replicas ask it).
Typical = tuple[Request, float]


@runtime_checkable
class _PicksDevice(Protocol):
    """A scorer that also chooses the device of a shared request (fgd)."""

    def device(self, node: NodeAlloc, req: Request) -> int | None: ...


@runtime_checkable
class _Widens(Protocol):
    """A scorer that scores more nodes for some requests (fgd2: multi-GPU ones)."""

    def window(self, req: Request, candidates: int) -> int: ...


@runtime_checkable
class _Observes(Protocol):
    """A scorer that learns from the placements made (gpu-clustering)."""

    def placed(self, node: NodeAlloc, req: Request) -> None: ...


__all__ = ["DEFAULT_CANDIDATES", "WIDER_WINDOW", "Choice", "Placer", "default_candidates"]

#: Feasible nodes scored per replica when a caller does not choose: 8, and 16 for
#: the fragmentation scorers, whose score needs a wider choice to tell nodes apart
#: (the FGD paper's protocol through ``forge plan``: at 8, fgd2 left 13.53% of the
#: GPU unallocated on gpushare100 against the paper's 13.36; at 16, 13.28, below
#: the paper on all four traces; README, GPU fragmentation).
DEFAULT_CANDIDATES = 8
WIDER_WINDOW: dict[str, int] = {"fgd": 16, "fgd2": 16}


def default_candidates(algorithm: str) -> int:
    """The window of ``algorithm`` when none is chosen (see :data:`WIDER_WINDOW`)."""
    return WIDER_WINDOW.get(algorithm, DEFAULT_CANDIDATES)


_NO_GPU = Request(cpu=0, memory=0)  # asks what room a node has for work without GPUs

_Peer = Peer


@dataclass(frozen=True, slots=True)
class _Group:
    """A class's peers (the classes with its static rules, by id, most recently
    used last) and its own entry among them, built once per class."""

    peers: dict[int, _Peer]
    entry: _Peer


class Placer(Searches):
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
        workload: Sequence[Typical] = (),
    ) -> None:
        self.cluster = cluster
        self.algorithm = algorithm
        self.scorers: tuple[Weighted, ...] = scorers_for(algorithm, workload=workload, seed=seed)
        self.candidates = candidates
        self._fast = _fast_scorer(self.scorers)
        # a scorer that also picks the device of a shared (fractional) request
        self._device: _PicksDevice | None = next(
            (w.scorer for w in self.scorers if isinstance(w.scorer, _PicksDevice)), None
        )
        # a scorer that scores more nodes for some requests (fgd2)
        self._widens: _Widens | None = next(
            (w.scorer for w in self.scorers if isinstance(w.scorer, _Widens)), None
        )
        # scorers that learn from placements (gpu-clustering)
        self._observers = [w.scorer for w in self.scorers if isinstance(w.scorer, _Observes)]
        # nodes where a GPU placement gave GPU-less work more room (module docstring)
        self._revived: list[NodeAlloc] = []
        self._reserving = any(n.reserve for n in cluster.nodes)
        # the seeded node order and the static lists, shared with the cluster's
        # earlier passes while its nodes stay the same (charged only when built)
        self._eligibility = Eligibility.of(cluster, seed=seed)
        # what earlier passes were charged for it (a new one's order copy is ours)
        self._static_work = self._eligibility.work if self._eligibility.kept else 0
        self._classes: dict[tuple[Request, tuple[Constraint, ...]], _Class] = {}
        # the reconcile pass places a group's replicas one after another with the
        # same request object: remember the last class (hashing a pydantic model
        # per replica was ~10% of a pass)
        self._last: tuple[Request, tuple[Constraint, ...], _Class] | None = None
        self._by_id: dict[int, tuple[Request, tuple[Constraint, ...], _Class]] = {}
        # binpack classes by static key, most recently used last (see _rebase)
        self._peers: dict[tuple[object, ...], dict[int, _Peer]] = {}
        self._groups: dict[int, _Group] = {}  # by id(class): its peers and its entry there
        # the searches without a class: the nodes that may still fit, by request
        self._opens: dict[tuple[object, ...], Open] = {}
        self._open_peers: dict[tuple[object, ...], list[Open]] = {}
        self._domains: dict[tuple[object, ...], tuple[tuple[str, ...], ...]] = {}
        self._open_by_id: dict[int, tuple[Request, tuple[Constraint, ...], Open]] = {}
        self.scored = 0  # how many node scores were computed (for benchmarks)
        self._work = 0

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
        if not req.gpu and cls.revived < len(self._revived):
            self._readmit(cls, req, constraints)
        if cls.exhausted:
            return None
        fast = self._fast
        if fast is not None and not fast.spread:
            best_pos, best, best_score, work = best_in_window(cls, req, avoid, self.candidates)
            self._work += work
            self.scored += len(cls.window)
            while best is None and cls.extra:  # the window emptied: re-admitted nodes next
                best_pos, best, best_score, work = best_in_window(cls, req, avoid, self.candidates)
                self._work += work
                self.scored += len(cls.window)
        else:
            best_pos, best, best_score = -1, None, -1e18
            found = self._scan(cls, req)
            while not found and cls.extra:
                found = self._scan(cls, req)
            for pos, node in found:
                s = fast(node, req) if fast is not None else combined(node, req, self.scorers)
                if avoid is not None and node.node.id == avoid:
                    s -= AVOID_PENALTY
                if s > best_score:
                    best_pos, best, best_score = pos, node, s
            self.scored += len(found)
        if best is None:
            cls.exhausted = True
            counts = dict(self._eligibility.reasons(req, constraints))
            for cause, n in cls.capacity_counts().items():
                counts[cause] = counts.get(cause, 0) + n
            cls.why = Diagnosis.of(len(self.cluster), 0, counts)
            return None
        gpu_ids = self._take(best, req)
        if self.algorithm == "spread":
            cls.ptr = best_pos + 1 if best_pos + 1 < len(cls.cands) else 0
            if not best.fits(req):
                self._kill(cls, best_pos, req)
        return Choice(best, gpu_ids, best_score)

    def _take(self, best: NodeAlloc, req: Request) -> tuple[str, ...]:
        """Allocate ``req`` on the chosen node; note a node whose GPU reservation it
        freed (revived) and tell the observing scorers."""
        if req.gpu and self._reserving:
            room = (best.cpu_room(_NO_GPU), best.mem_room(_NO_GPU))
        device = None
        if req.gpu_milli and self._device is not None:
            device = self._device.device(best, req)
        gpu_ids = best.allocate(req, device)
        if (
            req.gpu
            and self._reserving
            and (best.cpu_room(_NO_GPU) > room[0] or best.mem_room(_NO_GPU) > room[1])
        ):
            self._revived.append(best)
        for w in self._observers:
            w.placed(best, req)
        return gpu_ids

    @property
    def order(self) -> list[NodeAlloc]:
        """The pass's seeded node order (what the scan walks)."""
        return self._eligibility.order

    @property
    def reserving(self) -> bool:
        """Whether free GPUs still reserve cpu and memory in this pass."""
        return self._reserving

    def could_ever_fit(self, req: Request, constraints: tuple[Constraint, ...] = ()) -> bool:
        """Whether some node could take the request were it empty (static rules and
        total capacity): a GPU replica that never could is no reason to keep the
        reservation."""
        return any(
            n.node.cpu >= req.cpu and n.node.memory >= req.memory
            for n in self._eligibility.nodes(req, constraints)
        )

    def eligible(self, req: Request, constraints: tuple[Constraint, ...] = ()) -> list[NodeAlloc]:
        """The nodes that pass the request's static rules (state, labels, taints,
        GPU count and model), in the pass's seeded order: where a preemption for it
        may look. A fresh list; its copy is charged like a class's."""
        self._work += len(self.cluster) // COPY_PER_UNIT
        return self._eligibility.nodes(req, constraints)

    def lift_reservation(self) -> None:
        """Drop every node's GPU reservation for the rest of the pass (no GPU work
        is waiting for it). The nodes it held back are re-admitted for classes of
        work without GPUs, as after a GPU placement. The cluster remembers it
        (``Cluster.lifted``) so a carried cluster is restored before its next pass."""
        self.cluster.lifted = True
        for node in self.cluster.nodes:
            if node.reserve:
                node.reserve = 0
                if node.res_cpu or node.res_mem:
                    node.res_cpu = node.res_mem = 0
                    self._revived.append(node)
        self._reserving = False

    def why_not(self, req: Request, constraints: tuple[Constraint, ...] = ()) -> Diagnosis:
        """Why the class found no node (``"0/3 nodes available: 2 insufficient cpu, ..."``
        once formatted): gathered by the scan that ran out, so it costs nothing."""
        cls = self._class(req, constraints)
        if cls.why is not None:
            return cls.why
        # not asked through place(): a full sweep (explain and tests only)
        self._work += len(self.cluster)
        return diagnose(self.cluster.nodes, req, constraints)

    @property
    def work(self) -> int:
        """Deterministic work done so far (node checks and scores): what a caller
        budgets a pass by, since wall time differs between a run and its replay."""
        return self._work + self._eligibility.work - self._static_work

    # -- internals ----------------------------------------------------------------
    def _class(self, req: Request, constraints: tuple[Constraint, ...]) -> _Class:
        last = self._last
        if last is not None and last[0] is req and last[1] is constraints:
            return last[2]
        # by identity first: the pass hands in each group's one request object, and
        # hashing a pydantic model on each of ~50,000 class switches costs
        hit = self._by_id.get(id(req))
        if hit is not None and hit[0] is req and hit[1] is constraints:
            cls = hit[2]
        else:
            key = (req, constraints)
            found = self._classes.get(key)
            if found is None:
                # a new class scans every eligible node: revived ones are among them
                found = _Class(self._eligibility.nodes(req, constraints), len(self._revived))
                self._classes[key] = found
                self._groups[id(found)] = _Group(
                    self._peers.setdefault(_static_key(req, constraints), {}),
                    (req.cpu, req.memory, found),
                )
            cls = found
            # the tuple keeps req alive, so its id is not reused within the pass
            self._by_id[id(req)] = (req, constraints, cls)
        if self.algorithm != "spread":
            self._rebase(req, cls)
        self._last = (req, constraints, cls)
        return cls

    def _rebase(self, req: Request, cls: _Class) -> None:
        """binpack: when a class (re)starts, skip the nodes a smaller class has found full.

        A class with the same static rules (same GPU count, memory, models and
        constraints) whose request is no larger in cpu and memory has marked nodes
        full that are full for this class too. If its remaining nodes (window plus
        unscanned) are fewer than this class's, they become this class's nodes, in
        the same order, so the window (the first ``candidates`` feasible nodes in
        the class's order) is the same, found without rescanning the nodes the
        pass has filled since. Only the most recently used peers are looked at.

        The class shares the peer's list rather than copying it (see
        ``EquivalenceClass.unshare``): with ~30 request shapes interleaved, a
        50,000-replica pass switches class on nearly every replica, and copying
        thousands of node references each time was most of its cost. The work
        counter still charges the copy's size, so budgets and replay are as before.
        """
        group = self._groups[id(cls)]
        peers = group.peers
        remaining = len(cls.window) + len(cls.cands) - cls.frontier
        best: _Class | None = None
        cpu, memory = req.cpu, req.memory
        for pcpu, pmemory, peer in itertools.islice(reversed(peers.values()), REBASE_PEERS):
            if pcpu > cpu or pmemory > memory or peer is cls:
                continue
            size = len(peer.window) + len(peer.cands) - peer.frontier
            if size < remaining:
                best, remaining = peer, size
        if best is not None:
            # the copy's length: what the work counter has always charged for it
            size = len(best.window) + len(best.cands) - best.frontier + len(best.extra)
            if self.candidates > 0 and not best.extra:
                # share the peer's list: its window stands for the nodes the copy
                # put first, its frontier for where the rest start (EquivalenceClass)
                cls.cands = best.cands
                cls.alive = best.alive
                cls.window = list(best.window)
                cls.frontier = best.frontier
                cls.own = best.own = False
                cls.fresh = True
            else:
                # candidates=0 sizes the window by the list's length, and a peer's
                # waiting re-admitted nodes go last: a list laid out for this class
                cands = [best.cands[i] for i in best.window]
                cands += best.cands[best.frontier :]
                cands += best.extra
                cls.cands = cands
                cls.alive = bytearray(b"\x01") * len(cands)
                cls.window = []
                cls.frontier = 0
                cls.own = True
                cls.fresh = False
            cls.dead = 0
            cls.extra = []
            # the peer's nodes include the revived nodes it has seen, not later ones
            cls.revived = best.revived
            # the nodes left behind were dropped by the peer, for the reasons it noted
            cls.rejected = dict(best.rejected)
            self._work += (size + len(best.rejected)) // COPY_PER_UNIT
        peers.pop(id(cls), None)  # most recently used last
        peers[id(cls)] = group.entry

    def _readmit(self, cls: _Class, req: Request, constraints: tuple[Constraint, ...]) -> None:
        """Give a class of GPU-less work back the nodes where GPU placements freed
        reservation since it last looked: appended to its nodes (so its scan reaches
        them) and, for binpack, to its window at once, so a used GPU node's spare
        cpu is filled before the class opens another node. A node the class still
        holds is merely checked twice."""
        new = self._revived[cls.revived :]
        cls.revived = len(self._revived)
        eligible = self._eligibility.ids(req, constraints)
        seen: set[int] = set()
        for node in new:
            if node.index in seen or node.index not in eligible or not node.fits(req):
                continue
            seen.add(node.index)
            cls.exhausted = False
            cls.why = None
            cls.rejected.pop(node.index, None)
            if self.algorithm != "spread":
                cls.extra.append(node)  # joins the window as soon as it has room
                continue
            cls.cands.append(node)
            cls.alive.append(1)
        if cls.extra:
            if not cls.own:
                cls.unshare()  # drain appends to the list
            drain(cls, req, self._limit(req))

    def _limit(self, req: Request) -> int:
        """The nodes scored for ``req``: the placer's candidates, or a scorer's wider
        window for it (0 stays 0: all)."""
        if self._widens is None or self.candidates <= 0:
            return self.candidates
        return self._widens.window(req, self.candidates)

    def _kill(self, cls: _Class, pos: int, req: Request) -> None:
        if cls.alive[pos]:
            cls.alive[pos] = 0
            cls.dead += 1
            cls.reject(cls.cands[pos], req)

    def _scan(self, cls: _Class, req: Request) -> Found:
        limit = self._limit(req)
        if self.algorithm != "spread":
            found, work = scan_window(cls, req, limit)
        else:
            found, work = scan_ring(cls, req, limit)
        self._work += work
        return found
