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
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from forge.core.models import GPU_MILLI, Constraint, Request, tolerated
from forge.core.placement.filters import (
    INSUFFICIENT_CPU,
    INSUFFICIENT_GPU,
    INSUFFICIENT_MEMORY,
    STATIC_FILTERS,
    Diagnosis,
    diagnose,
    explain_node,
)
from forge.core.placement.scorers import GPU_WEIGHT, Weighted, combined, scorers_for
from forge.core.placement.state import Cluster, NodeAlloc

#: A request with its weight in the workload (how many replicas ask it).
Typical = tuple[Request, float]


@runtime_checkable
class _PicksDevice(Protocol):
    """A scorer that also chooses the device of a shared request (fgd)."""

    def device(self, node: NodeAlloc, req: Request) -> int | None: ...


@runtime_checkable
class _Observes(Protocol):
    """A scorer that learns from the placements made (gpu-clustering)."""

    def placed(self, node: NodeAlloc, req: Request) -> None: ...


__all__ = ["DEFAULT_CANDIDATES", "Choice", "Placer"]

DEFAULT_CANDIDATES = 8
# Subtracted for the node a failed replica ran on. Larger than the whole score range
# (0..100), so any other feasible node in the window wins over it.
AVOID_PENALTY = 1000.0
REBASE_PEERS = 16  # binpack: recently used classes a (re)starting class may learn from
_NO_GPU = Request(cpu=0, memory=0)  # asks what room a node has for work without GPUs
#: Work units: one per node checked or scored in Python; copying node lists (a C
#: loop) costs about this many nodes per unit.
COPY_PER_UNIT = 16
#: Why a class dropped a node for capacity (the filter chain's order), by code.
_CAPACITY_REASONS = (
    INSUFFICIENT_GPU,
    INSUFFICIENT_CPU,
    INSUFFICIENT_MEMORY,
    "cpu or memory reserved for free gpus",
)


@dataclass(frozen=True, slots=True)
class Choice:
    node: NodeAlloc
    gpu_ids: tuple[str, ...]
    score: float


class _Class:
    """Cursor state of one equivalence class within a pass.

    spread uses ``ptr`` / ``alive``; binpack uses ``window`` (the positions of the
    first ``candidates`` feasible nodes, in order) and ``frontier`` (the first
    position never scanned): every position before the frontier that is not in
    the window cannot take the class's replica for the rest of the pass.
    """

    __slots__ = (
        "alive",
        "cands",
        "dead",
        "exhausted",
        "extra",
        "frontier",
        "ptr",
        "rejected",
        "revived",
        "why",
        "window",
    )

    def __init__(self, cands: list[NodeAlloc], revived: int = 0) -> None:
        self.cands = cands
        self.revived = revived  # how much of Placer._revived this class has seen
        # binpack: re-admitted nodes waiting for room in the window (see _readmit)
        self.extra: list[NodeAlloc] = []
        self.alive = bytearray(b"\x01") * len(cands)
        self.dead = 0
        self.ptr = 0
        self.window: list[int] = []
        self.frontier = 0
        self.exhausted = False
        self.why: Diagnosis | None = None
        # Nodes this class dropped for capacity (node index -> reason code), noted as
        # the scan drops them: when the class runs out, that is its diagnosis,
        # without a second sweep over the nodes (a re-admitted node leaves it).
        self.rejected: dict[int, int] = {}

    def reject(self, node: NodeAlloc, req: Request) -> None:
        n = node.node
        if req.gpu and not (
            len(n.gpus) - node.gpus_used >= req.gpu
            if not req.gpu_milli
            else bool(node.shared_gpus(req))
        ):
            code = 0
        elif n.cpu - node.cpu_used < req.cpu:
            code = 1
        elif n.memory - node.mem_used < req.memory:
            code = 2
        elif req.gpu:
            code = 0  # a device rule (model, memory) on the free ones
        else:
            code = 3
        self.rejected[node.index] = code

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
        version: int = 1,
        workload: Sequence[Typical] = (),
    ) -> None:
        self.cluster = cluster
        self.algorithm = algorithm
        self.scorers: tuple[Weighted, ...] = scorers_for(
            algorithm, version=version, workload=workload, seed=seed
        )
        self.candidates = candidates
        self._fast = _fast_scorer(self.scorers)
        # a scorer that also picks the device of a shared (fractional) request
        self._device: _PicksDevice | None = next(
            (w.scorer for w in self.scorers if isinstance(w.scorer, _PicksDevice)), None
        )
        # scorers that learn from placements (gpu-clustering)
        self._observers = [w.scorer for w in self.scorers if isinstance(w.scorer, _Observes)]
        # nodes where a GPU placement gave GPU-less work more room (module docstring)
        self._revived: list[NodeAlloc] = []
        self._reserving = any(n.reserve for n in cluster.nodes)
        self._gpu_first = version >= 2
        order = list(cluster.nodes)
        random.Random(seed).shuffle(order)
        self._order = order
        self._static: dict[tuple[object, ...], list[NodeAlloc]] = {}
        self._static_ids: dict[tuple[object, ...], set[int]] = {}
        self._classes: dict[tuple[Request, tuple[Constraint, ...]], _Class] = {}
        # the reconcile pass places a group's replicas one after another with the
        # same request object: remember the last class (hashing a pydantic model
        # per replica was ~10% of a pass)
        self._last: tuple[Request, tuple[Constraint, ...], _Class] | None = None
        # binpack classes by static key, most recently used last (see _rebase)
        self._peers: dict[tuple[object, ...], dict[int, tuple[Request, _Class]]] = {}
        self.scored = 0  # how many node scores were computed (for benchmarks)
        # Deterministic work done so far (node checks and scores): what a caller
        # budgets a pass by, since wall time differs between a run and its replay.
        self.work = len(order) // COPY_PER_UNIT
        self._static_why: dict[tuple[object, ...], dict[str, int]] = {}
        self._tallies: tuple[dict[str, int], dict[int, int]] | None = None
        self._most_gpus = max((len(n.node.gpus) for n in order), default=0)
        self._tainted = any(n.node.taints for n in order)

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
            best_pos, best, best_score = self._best_in_window(cls, req, avoid)
            while best is None and cls.extra:  # the window emptied: re-admitted nodes next
                best_pos, best, best_score = self._best_in_window(cls, req, avoid)
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
            counts = dict(self._static_reasons(req, constraints))
            for code in cls.rejected.values():
                reason = _CAPACITY_REASONS[code]
                counts[reason] = counts.get(reason, 0) + 1
            cls.why = Diagnosis.of(len(self.cluster), 0, counts)
            return None
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
        if self.algorithm == "spread":
            cls.ptr = best_pos + 1 if best_pos + 1 < len(cls.cands) else 0
            if not best.fits(req):
                self._kill(cls, best_pos, req)
        return Choice(best, gpu_ids, best_score)

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
            for n in self._eligible(req, constraints)
        )

    def lift_reservation(self) -> None:
        """Drop every node's GPU reservation for the rest of the pass (no GPU work
        is waiting for it). The nodes it held back are re-admitted for classes of
        work without GPUs, as after a GPU placement."""
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
        self.work += len(self.cluster)
        fit, reasons = diagnose(self.cluster.nodes, req, constraints)
        return Diagnosis.of(len(self.cluster), fit, reasons)

    # -- internals ----------------------------------------------------------------
    def _class(self, req: Request, constraints: tuple[Constraint, ...]) -> _Class:
        last = self._last
        if last is not None and last[0] is req and last[1] is constraints:
            return last[2]
        key = (req, constraints)
        cls = self._classes.get(key)
        if cls is None:
            # a new class scans every eligible node: revived ones are among them
            cls = _Class(self._eligible(req, constraints), len(self._revived))
            self._classes[key] = cls
        if self.algorithm != "spread":
            self._rebase(req, constraints, cls)
        self._last = (req, constraints, cls)
        return cls

    def _rebase(self, req: Request, constraints: tuple[Constraint, ...], cls: _Class) -> None:
        """binpack: when a class (re)starts, skip the nodes a smaller class has found full.

        A class with the same static rules (same GPU count, memory, models and
        constraints) whose request is no larger in cpu and memory has marked nodes
        full that are full for this class too. If its remaining nodes (window plus
        unscanned) are fewer than this class's, they become this class's nodes, in
        the same order, so the window (the first ``candidates`` feasible nodes in
        the class's order) is the same, found without rescanning the nodes the
        pass has filled since. Only the most recently used peers are looked at.
        """
        peers = self._peers.setdefault(_static_key(req, constraints), {})
        remaining = len(cls.window) + len(cls.cands) - cls.frontier
        best: _Class | None = None
        for preq, peer in itertools.islice(reversed(peers.values()), REBASE_PEERS):
            if peer is cls or preq.cpu > req.cpu or preq.memory > req.memory:
                continue
            size = len(peer.window) + len(peer.cands) - peer.frontier
            if size < remaining:
                best, remaining = peer, size
        if best is not None:
            cands = [best.cands[i] for i in best.window]
            cands += best.cands[best.frontier :]
            cands += best.extra
            cls.cands = cands
            cls.alive = bytearray(b"\x01") * len(cands)
            cls.dead = 0
            cls.window = []
            cls.frontier = 0
            cls.extra = []
            # the peer's nodes include the revived nodes it has seen, not later ones
            cls.revived = best.revived
            # the nodes left behind were dropped by the peer, for the reasons it noted
            cls.rejected = dict(best.rejected)
            self.work += (len(cands) + len(best.rejected)) // COPY_PER_UNIT
        peers.pop(id(cls), None)  # most recently used last
        peers[id(cls)] = (req, cls)

    def _eligible(self, req: Request, constraints: tuple[Constraint, ...]) -> list[NodeAlloc]:
        """Nodes that pass the rules that cannot change within a pass (state,
        labels, GPU model and memory), shared by every class with the same rules."""
        skey = _static_key(req, constraints)
        nodes = self._static.get(skey)
        if nodes is None:
            # the same nodes in the same order as one combined filter, each rule a
            # pass of its own so a pass without constraints or GPUs costs nothing
            nodes = [n for n in self._order if n.schedulable]
            self.work += len(self._order) // COPY_PER_UNIT
            if req.gpu > self._most_gpus:
                nodes = []  # more devices than any node has: nothing to look at
            if not req.gpu and self._gpu_first:
                # GPU nodes first (stable: each part keeps the seeded order). GPU
                # work opens them anyway; work without GPUs then fills what their
                # GPUs do not reserve before it opens a CPU node.
                nodes = [n for n in nodes if n.node.gpus] + [n for n in nodes if not n.node.gpus]
            if constraints and nodes:
                self.work += len(nodes)
                nodes = [n for n in nodes if all(c.matches(n.node.labels) for c in constraints)]
            if self._tainted and any(n.node.taints for n in nodes):
                tols = req.tolerations
                nodes = [n for n in nodes if tolerated(n.node.taints, tols) is None]
            if req.gpu and nodes:
                self.work += len(nodes)
                match = bool(req.gpu_models or req.gpu_memory)  # else every device matches
                nodes = [
                    n
                    for n in nodes
                    if len(n.node.gpus) >= req.gpu  # cheap first: most nodes have no GPUs
                    and (not match or len(n.matching_gpus(req, free_only=False)) >= req.gpu)
                ]
            self._static[skey] = nodes
        return list(nodes)

    def _static_reasons(self, req: Request, constraints: tuple[Constraint, ...]) -> dict[str, int]:
        """Why the nodes outside a class's static list are out, counted once per
        pass per set of static rules (only when a class of that set runs out)."""
        skey = _static_key(req, constraints)
        counts = self._static_why.get(skey)
        if counts is not None:
            return counts
        if not (constraints or req.gpu_models or req.gpu_memory or self._tainted):
            # the usual case needs no sweep: node states and device counts, tallied
            # once per pass, say it all
            states, by_count = self._tally()
            counts = dict(states)
            short = sum(n for gpus, n in by_count.items() if gpus < req.gpu)
            if short:
                counts[INSUFFICIENT_GPU] = short
            self._static_why[skey] = counts
            return counts
        eligible = {id(n) for n in self._static.get(skey, ())}
        counts = {}
        for n in self.cluster.nodes:
            if id(n) not in eligible:
                # static rules first; a node with too few devices fails the count rule
                why = explain_node(n, req, constraints, STATIC_FILTERS) or INSUFFICIENT_GPU
                counts[why] = counts.get(why, 0) + 1
        self.work += len(self.cluster) + 4 * (len(self.cluster) - len(eligible))
        self._static_why[skey] = counts
        return counts

    def _tally(self) -> tuple[dict[str, int], dict[int, int]]:
        """Nodes out of service by state, and ready nodes by device count."""
        if self._tallies is None:
            states: dict[str, int] = {}
            gpus: dict[int, int] = {}
            for n in self.cluster.nodes:
                if n.schedulable:
                    gpus[len(n.node.gpus)] = gpus.get(len(n.node.gpus), 0) + 1
                else:
                    why = str(n.node.state.value)
                    states[why] = states.get(why, 0) + 1
            self._tallies = (states, gpus)
            self.work += len(self.cluster.nodes)
        return self._tallies

    def _readmit(self, cls: _Class, req: Request, constraints: tuple[Constraint, ...]) -> None:
        """Give a class of GPU-less work back the nodes where GPU placements freed
        reservation since it last looked: appended to its nodes (so its scan reaches
        them) and, for binpack, to its window at once, so a used GPU node's spare
        cpu is filled before the class opens another node. A node the class still
        holds is merely checked twice."""
        new = self._revived[cls.revived :]
        cls.revived = len(self._revived)
        eligible = self._eligible_ids(req, constraints)
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
            self._drain(cls, req)

    def _drain(self, cls: _Class, req: Request) -> None:
        """binpack: move re-admitted nodes that fit into the window while it has
        fewer than ``candidates`` nodes: a candidate before any node the frontier
        has not reached (a used GPU node's spare cpu before an empty node), yet the
        window stays bounded. A node that no longer fits is dropped: capacity only
        shrinks until it is re-admitted again."""
        limit = self.candidates if self.candidates > 0 else len(cls.cands) + len(cls.extra)
        extra = cls.extra
        k = 0
        while k < len(extra) and len(cls.window) < limit:
            node = extra[k]
            k += 1
            if node.fits(req):
                cls.window.append(len(cls.cands))
                cls.cands.append(node)
                cls.alive.append(1)
            else:
                cls.reject(node, req)
        del extra[:k]

    def _eligible_ids(self, req: Request, constraints: tuple[Constraint, ...]) -> set[int]:
        skey = _static_key(req, constraints)
        ids = self._static_ids.get(skey)
        if ids is None:
            ids = self._static_ids[skey] = {n.index for n in self._eligible(req, constraints)}
        return ids

    def _kill(self, cls: _Class, pos: int, req: Request) -> None:
        if cls.alive[pos]:
            cls.alive[pos] = 0
            cls.dead += 1
            cls.reject(cls.cands[pos], req)

    def _scan(self, cls: _Class, req: Request) -> list[tuple[int, NodeAlloc]]:
        if self.algorithm != "spread":
            return self._scan_window(cls, req)
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
        checked = 0
        for _ in range(n):
            if alive[i]:
                checked += 1
                node = cands[i]
                ok = (
                    node.node.cpu - node.cpu_used >= cpu
                    and node.node.memory - node.mem_used >= mem
                    and (not (gpu or node.reserve) or node.fits(req))
                )
                if ok:
                    found.append((i, node))
                    if len(found) >= limit:
                        break
                else:
                    alive[i] = 0
                    cls.dead += 1
                    cls.reject(node, req)
                    if binpack and i == cls.ptr:
                        cls.ptr = i + 1 if i + 1 < n else 0
            elif binpack and i == cls.ptr:
                cls.ptr = i + 1 if i + 1 < n else 0
            i += 1
            if i == n:
                i = 0
        self.work += checked + len(found)
        return found

    def _scan_window(self, cls: _Class, req: Request) -> list[tuple[int, NodeAlloc]]:
        """binpack: the first ``candidates`` feasible nodes in the class's order.

        Re-checks the previous window and refills it from the frontier, so each
        node is scanned once per class and a pass costs O(classes x nodes +
        replicas x candidates), never re-skipping the nodes already found full.
        A node that drops out of the window is full for this class for the rest
        of the pass (placements only consume capacity), so when the frontier has
        reached the end and the window is empty, no node can take the replica.
        """
        if cls.extra:
            self._drain(cls, req)
        cands = cls.cands
        n = len(cands)
        limit = self.candidates if self.candidates > 0 else n
        cpu, mem, gpu = req.cpu, req.memory, req.gpu
        found: list[tuple[int, NodeAlloc]] = []
        for i in cls.window:
            node = cands[i]
            if (
                node.node.cpu - node.cpu_used >= cpu
                and node.node.memory - node.mem_used >= mem
                and (not (gpu or node.reserve) or node.fits(req))
            ):
                found.append((i, node))
            else:
                cls.reject(node, req)
        checked = len(cls.window)
        extra = cls.extra
        while len(found) < limit and extra:  # re-admitted nodes first (_readmit)
            node = extra.pop(0)
            if node.fits(req):
                found.append((len(cands), node))
                cands.append(node)
                cls.alive.append(1)
            else:
                cls.reject(node, req)
        start = i = cls.frontier
        while len(found) < limit and i < n:
            node = cands[i]
            if (
                node.node.cpu - node.cpu_used >= cpu
                and node.node.memory - node.mem_used >= mem
                and (not (gpu or node.reserve) or node.fits(req))
            ):
                found.append((i, node))
            else:
                cls.reject(node, req)
            i += 1
        self.work += checked + (i - start) + len(found)
        cls.frontier = i
        cls.window = [pos for pos, _ in found]
        return found

    def _best_in_window(
        self, cls: _Class, req: Request, avoid: str | None
    ) -> tuple[int, NodeAlloc | None, float]:
        """binpack with the default scorers: :meth:`_scan_window` and the scoring
        of the window in one loop, with :class:`_FastScore`'s arithmetic written
        out (the hot path of a pass: the same choices, ~30% less time)."""
        if cls.extra:
            self._drain(cls, req)
        cands = cls.cands
        n = len(cands)
        limit = self.candidates if self.candidates > 0 else n
        cpu, mem, gpu = req.cpu, req.memory, req.gpu
        shared, milli = bool(req.gpu_milli), req.milli
        preserve = self._fast is not None and self._fast.preserve
        # without a model or memory rule every device matches: a free count is enough
        match = bool(req.gpu_models or req.gpu_memory)
        extra = cls.extra
        old = cls.window
        k, n_old, i = 0, len(old), cls.frontier
        window: list[int] = []
        best_pos, best, best_score = -1, None, -1e18
        while True:
            if k < n_old:  # re-check the previous window
                pos = old[k]
                k += 1
            elif len(window) < limit and extra:  # then re-admitted nodes (_readmit)
                pos = len(cands)
                cands.append(extra.pop(0))
                cls.alive.append(1)
            elif len(window) < limit and i < n:  # then refill it from the frontier
                pos = i
                i += 1
            else:
                break
            node = cands[pos]
            nn = node.node
            if gpu:
                if (
                    nn.cpu - node.cpu_used < cpu
                    or nn.memory - node.mem_used < mem
                    or (shared and not node.fits(req))
                    or (
                        not shared
                        and (len(nn.gpus) - node.gpus_used < gpu or (match and not node.fits(req)))
                    )
                ):
                    cls.reject(node, req)
                    continue
            elif nn.cpu - node.cpu_used - node.res_cpu < cpu or (
                nn.memory - node.mem_used - node.res_mem < mem
            ):
                cls.reject(node, req)
                continue
            window.append(pos)
            ngpu = len(nn.gpus)
            total = (node.cpu_used + cpu) / nn.cpu if nn.cpu else 1.0
            total += (node.mem_used + mem) / nn.memory if nn.memory else 1.0
            if ngpu:
                # milli-GPU: the same quotient as devices when nothing is shared
                cap = GPU_MILLI * ngpu
                gutil = (cap - node.milli_free + milli) / cap
                total = (total + GPU_WEIGHT * gutil) / (2.0 + GPU_WEIGHT)
                keep = 100.0 if gpu else 100.0 * node.gpus_used / ngpu
            else:
                total = total / 2.0
                keep = 100.0
            util = 100.0 * (total if total < 1.0 else 1.0)
            if preserve:
                s = (util + keep) / 2.0
            elif node.cpu_used or node.mem_used or node.gpus_used:
                s = 50.0 + util / 2.0  # a node in use beats every empty one
            else:
                s = (100.0 - util) / 2.0  # and if one must be opened, the largest
            if avoid is not None and nn.id == avoid:
                s -= AVOID_PENALTY
            if s > best_score:
                best_pos, best, best_score = pos, node, s
        self.work += n_old + (i - cls.frontier) + len(window)
        cls.frontier = i
        cls.window = window
        self.scored += len(window)
        return best_pos, best, best_score


def _static_key(req: Request, constraints: tuple[Constraint, ...]) -> tuple[object, ...]:
    """What decides a node's static eligibility. The gpu count is part of it: a node
    with 2 matching devices is eligible for a 1-GPU request but not a 4-GPU one. The
    share is part of it so that binpack's rebase never learns from a request whose
    "full" means something else (a node with no whole device free may hold a share)."""
    return (constraints, req.gpu_models, req.gpu_memory, req.gpu, req.gpu_milli, req.tolerations)


def _fast_scorer(scorers: Sequence[Weighted]) -> _FastScore | None:
    """An inlined equivalent of the default scorer chains (same numbers, ~5x less
    call overhead on the hot path). Any other chain uses the generic path."""
    names = tuple((w.scorer.name, w.weight) for w in scorers)
    if names == (("binpack", 1.0), ("gpu-preserve", 1.0)):
        return _FastScore(spread=False)
    if names == (("spread", 1.0), ("gpu-preserve", 1.0)):
        return _FastScore(spread=True)
    if names == (("binpack-v2", 1.0),):
        return _FastScore(spread=False, preserve=False)
    if names == (("spread", 1.0),):
        return _FastScore(spread=True, preserve=False)
    return None


class _FastScore:
    __slots__ = ("preserve", "spread")

    def __init__(self, *, spread: bool, preserve: bool = True) -> None:
        self.spread = spread
        self.preserve = preserve

    def __call__(self, node: NodeAlloc, req: Request) -> float:
        n = node.node
        ngpu = len(n.gpus)
        total = (node.cpu_used + req.cpu) / n.cpu if n.cpu else 1.0
        total += (node.mem_used + req.memory) / n.memory if n.memory else 1.0
        if ngpu:
            cap = GPU_MILLI * ngpu
            gutil = (cap - node.milli_free + req.milli) / cap
            total = (total + GPU_WEIGHT * gutil) / (2.0 + GPU_WEIGHT)
            preserve = 100.0 if req.gpu else 100.0 * node.gpus_used / ngpu
        else:
            total = total / 2.0
            preserve = 100.0
        util = 100.0 * min(1.0, total)
        base = 100.0 - util if self.spread else util
        if self.preserve:
            return (base + preserve) / 2.0
        if self.spread:
            return base
        if node.cpu_used or node.mem_used or node.gpus_used:
            return 50.0 + base / 2.0
        return (100.0 - base) / 2.0
