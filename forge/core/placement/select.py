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
from dataclasses import dataclass, replace
from typing import Protocol, runtime_checkable

from forge.core.models import Constraint, Request, SpreadRule
from forge.core.placement.classes import CAPACITY_CAUSES
from forge.core.placement.classes import EquivalenceClass as _Class
from forge.core.placement.classes import static_key as _static_key
from forge.core.placement.diagnosis import Diagnosis, Rejection
from forge.core.placement.eligible import COPY_PER_UNIT, Eligibility
from forge.core.placement.filters import diagnose
from forge.core.placement.kernel import fits, shortfall
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
from forge.core.placement.state import Cluster, NodeAlloc
from forge.core.placement.topology import Topology
from forge.core.placement.topology import domains as _domains

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


__all__ = ["DEFAULT_CANDIDATES", "Choice", "Placer"]

DEFAULT_CANDIDATES = 8
REBASE_PEERS = 16  # binpack: recently used classes a (re)starting class may learn from
_NO_GPU = Request(cpu=0, memory=0)  # asks what room a node has for work without GPUs


#: A binpack class among its peers (Placer._rebase): its request's cpu and memory
#: (read once, not from the pydantic model on every look) and the class.
_Peer = tuple[int, int, _Class]


@dataclass(frozen=True, slots=True)
class _Group:
    """A class's peers (the classes with its static rules, by id, most recently
    used last) and its own entry among them, built once per class."""

    peers: dict[int, _Peer]
    entry: _Peer


class _Open:
    """The nodes that may still fit one request in this pass (``Placer._open``):
    in the pass's order, those found full dropped (marked, then compacted in one
    sweep once a quarter of the list is dead, so a search costs the nodes it looks
    at). ``revived``: how much of the placer's revived nodes the list reflects
    (-1: not built yet); ``peers``: the lists of the requests with the same static
    rules, most recently started last."""

    __slots__ = ("cpu", "dead", "memory", "nodes", "peers", "peers_key", "revived")

    def __init__(self, req: Request) -> None:
        self.cpu, self.memory = req.cpu, req.memory
        self.nodes: list[NodeAlloc] = []
        self.dead: set[int] = set()
        self.revived = -1
        self.peers: list[_Open] = []
        self.peers_key: tuple[object, ...] = ()

    def reset(self, nodes: list[NodeAlloc], revived: int) -> None:
        self.nodes = list(nodes)
        self.dead = set()
        self.revived = revived

    def live(self) -> list[NodeAlloc]:
        dead = self.dead
        return [n for n in self.nodes if n.index not in dead] if dead else self.nodes

    def drop(self, node: NodeAlloc) -> None:
        self.dead.add(node.index)

    def sweep(self, upto: int) -> int:
        """Take the dead out of the first ``upto`` nodes (what a search just walked),
        so no later search walks them again; returns the work."""
        dead = self.dead
        head = self.nodes[:upto]
        keep = [n for n in head if n.index not in dead]
        if len(keep) < len(head):
            dead.difference_update(n.index for n in head if n.index in dead)
            self.nodes[:upto] = keep
        return upto // COPY_PER_UNIT

    def compact(self) -> int:
        """Cut the dead off the front of the list (binpack fills nodes in the
        list's order, so that is where they gather), and sweep the rest out when
        they are a quarter of the list; returns the work."""
        dead = self.dead
        if not dead:
            return 0
        nodes = self.nodes
        p = 0
        while p < len(nodes) and nodes[p].index in dead:
            dead.discard(nodes[p].index)
            p += 1
        if p:
            del nodes[:p]
        if len(dead) * 4 < len(nodes):
            return p + len(nodes) // COPY_PER_UNIT if p else 0
        self.nodes = [n for n in nodes if n.index not in dead]
        self.dead = set()
        return p + len(self.nodes) // COPY_PER_UNIT + len(dead)


@dataclass(frozen=True, slots=True)
class Choice:
    node: NodeAlloc
    gpu_ids: tuple[str, ...]
    score: float


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
        self._eligibility = Eligibility.of(cluster, seed=seed, gpu_first=version >= 2)
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
        self._opens: dict[tuple[object, ...], _Open] = {}
        self._open_peers: dict[tuple[object, ...], list[_Open]] = {}
        self._domains: dict[tuple[object, ...], tuple[tuple[str, ...], ...]] = {}
        self._open_by_id: dict[int, tuple[Request, tuple[Constraint, ...], _Open]] = {}
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
            preserve = fast.preserve
            best_pos, best, best_score, work = best_in_window(
                cls, req, avoid, self.candidates, preserve=preserve
            )
            self._work += work
            self.scored += len(cls.window)
            while best is None and cls.extra:  # the window emptied: re-admitted nodes next
                best_pos, best, best_score, work = best_in_window(
                    cls, req, avoid, self.candidates, preserve=preserve
                )
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

    def place_with(
        self,
        req: Request,
        constraints: tuple[Constraint, ...],
        topology: Topology,
        *,
        avoid: str | None = None,
    ) -> Choice | None:
        """Bind one replica of a group whose rules look at its own replicas
        (``distinct_hosts``, ``spread``; :mod:`forge.core.placement.topology`), or
        None if no node can take it. No equivalence class: the answer changes with
        each of the group's placements, so it shares neither a cursor nor a "no
        node" answer with any other group. The caller notes the choice in
        ``topology`` (:meth:`Topology.add`).

        The scan walks the nodes that may still fit the request (:meth:`_open`:
        its statically eligible ones in the pass's order, less those found full for
        an equal request this pass; capacity only shrinks, until a revival), and
        scores the feasible ones until ``candidates`` of them keep every
        preference within its skew; when fewer are found it has seen every node,
        so a replica is refused only if no node passes every rule (invariant 4). A
        refusal is kept for the group (its replicas are the same and its own rules
        unchanged) until capacity revives."""
        if topology.revived < len(self._revived):
            topology.revived = len(self._revived)
            topology.why = None
        elif topology.why is not None:
            return None
        open_ = self._open(req, constraints)
        nodes = open_.nodes
        limit = self._limit(req) or len(nodes)
        fast, soft = self._fast, topology.soft
        best: NodeAlloc | None = None
        best_score, good, checked, scored = -1e18, 0, 0, 0
        dead = open_.dead
        # the fit kernel (work without GPUs) and the group's rules written out, as in
        # scan.best_in_window: this loop runs once per node looked at
        rcpu, rmemory, rgpu = req.cpu, req.memory, req.gpu
        held = topology.held if topology.distinct else None
        hard, counts, mins = topology.hard, topology.counts, topology.mins
        swept = 0  # dead nodes walked over (or found) by this search
        for node in nodes:
            checked += 1
            index = node.index
            if index in dead:
                swept += 1
                continue
            spec = node.node
            if rgpu:
                if not fits(node, req):
                    dead.add(index)
                    swept += 1
                    continue
            elif (
                spec.cpu - node.cpu_used - node.res_cpu < rcpu
                or spec.memory - node.mem_used - node.res_mem < rmemory
            ):
                dead.add(index)
                swept += 1
                continue
            if held is not None and spec.id in held:
                continue
            if hard:  # Topology.spread_rejection
                labels = spec.labels
                closed = False
                for i, label, skew, _, _ in hard:
                    value = labels.get(label)
                    if value is None or counts[i].get(value, 0) + 1 - mins[i] > skew:
                        closed = True
                        break
                if closed:
                    continue
            scored += 1
            s = fast(node, req) if fast is not None else combined(node, req, self.scorers)
            if soft:  # the spread preference weighs twice the node's own score
                s = (s + 2.0 * topology.score(spec)) / 3.0
            if avoid is not None and spec.id == avoid:
                s -= AVOID_PENALTY
            if s > best_score:
                best, best_score = node, s
            if not soft or topology.within(spec):
                good += 1
                if good >= limit:
                    break
        self._work += checked + scored + (open_.sweep(checked) if swept else 0)
        self.scored += scored
        if best is None:
            view = self._eligibility.view(req, constraints)
            topology.why = self._why_on(req, constraints, view, topology)
            return None
        return Choice(best, self._take(best, req), best_score)

    def place_gang(
        self,
        req: Request,
        constraints: tuple[Constraint, ...],
        count: int,
        topology: Topology | None = None,
    ) -> list[Choice] | tuple[int, Diagnosis]:
        """Bind ``count`` replicas of one request all together, or none (a gang).

        They are placed one after another on a simulated copy of the nodes they
        touch (the real nodes and every class's cursor stay as they were), each on
        the best of the first ``candidates`` nodes that fit it there, with the
        group's own rules (``topology``, copied) when it has them. Only if every
        one fits are they bound, on the same nodes in the same order; else nothing
        is, and the answer is how many fit and why the next one did not (on the
        simulated nodes). No class is used, so no "no node" answer is shared."""
        open_ = self._open(req, constraints)
        nodes = open_.nodes
        limit = self._limit(req) or len(nodes)
        trial = topology.copy() if topology is not None else None
        fast = self._fast
        sim: dict[int, NodeAlloc] = {}
        picks: list[NodeAlloc] = []
        work = 0
        for k in range(count):
            best: NodeAlloc | None = None
            best_real = nodes[0] if nodes else None
            best_score, found = -1e18, 0
            for real in nodes:
                node = sim.get(real.index, real)
                work += 1
                if not fits(node, req):
                    if node is real:  # full for real, not just in the trial
                        open_.drop(real)
                    continue
                if trial is not None and trial.rejection(node.node) is not None:
                    continue
                work += 1
                s = fast(node, req) if fast is not None else combined(node, req, self.scorers)
                if trial is not None and trial.soft:
                    s = (s + 2.0 * trial.score(node.node)) / 3.0
                if s > best_score:
                    best, best_real, best_score = node, real, s
                if trial is None or trial.within(node.node):
                    found += 1
                    if found >= limit:
                        break
            if best is None or best_real is None:
                self._work += work + open_.compact()
                view = self._eligibility.view(req, constraints)
                on = [sim.get(n.index, n) for n in view]
                return k, self._why_on(req, constraints, on, trial)
            if best.index not in sim:
                best = sim[best.index] = replace(
                    best, gpu_free=list(best.gpu_free), gpu_left=list(best.gpu_left)
                )
            best.allocate(req)
            if trial is not None:
                trial.add(best.node)
            picks.append(best_real)
        self._work += work + open_.compact()
        return [Choice(node, self._take(node, req), 0.0) for node in picks]

    def _why_on(
        self,
        req: Request,
        constraints: tuple[Constraint, ...],
        nodes: list[NodeAlloc],
        topology: Topology | None,
    ) -> Diagnosis:
        """Why none of ``nodes`` (the request's eligible ones, as they stand) takes
        it: static reasons, then each node's capacity or the group's own rule."""
        counts = dict(self._eligibility.reasons(req, constraints))
        for node in nodes:
            if not fits(node, req):
                cause: Rejection | None = CAPACITY_CAUSES[shortfall(node, req)]
            else:
                cause = topology.rejection(node.node) if topology is not None else None
            if cause is not None:
                counts[cause] = counts.get(cause, 0) + 1
        self._work += len(nodes)
        return Diagnosis.of(len(self.cluster), 0, counts)

    def _open(self, req: Request, constraints: tuple[Constraint, ...]) -> _Open:
        """The nodes that may still fit ``req`` this pass, shared by the searches
        that use no equivalence class (topology groups, gangs) with an equal
        request: a node one of them found full is full for all of them (capacity
        only shrinks), so each is dropped once, not skipped once per replica.

        A list (re)started takes the live nodes of the shortest list of a recently
        used request with the same static rules and no larger cpu and memory (as
        binpack's rebase: a node full for that one is full for this one), else the
        static list. A revival (a GPU placement freeing reservation, a lifted
        reservation) restarts a list: one that has not seen it is nobody's seed."""
        hit = self._open_by_id.get(id(req))
        if hit is not None and hit[0] is req and hit[1] is constraints:
            found = hit[2]
        else:
            skey = _static_key(req, constraints)
            key = (skey, req.cpu, req.memory)
            found = self._opens.get(key) or self._opens.setdefault(key, _Open(req))
            found.peers = self._open_peers.setdefault(skey, [])
            found.peers_key = skey
            self._open_by_id[id(req)] = (req, constraints, found)
        revived = len(self._revived)
        if found.revived < 0 or found.revived < revived:
            seed: list[NodeAlloc] | None = None
            cpu, memory = req.cpu, req.memory
            size = -1
            best_open: _Open | None = None
            for peer in found.peers[-REBASE_PEERS:]:
                left = len(peer.nodes) - len(peer.dead)
                if (
                    peer is not found
                    and peer.revived == revived
                    and peer.cpu <= cpu
                    and peer.memory <= memory
                    and (size < 0 or left < size)
                ):
                    best_open, size = peer, left
            best_cls: _Class | None = None
            if self.algorithm != "spread":
                # binpack's classes know more: the nodes left to a class of the same
                # static rules and no larger request are all that may fit this one
                for pcpu, pmemory, cls in itertools.islice(
                    reversed(self._peers.get(found.peers_key, {}).values()), REBASE_PEERS
                ):
                    if pcpu > cpu or pmemory > memory or cls.revived != revived:
                        continue
                    left = len(cls.window) + len(cls.cands) - cls.frontier + len(cls.extra)
                    if size < 0 or left < size:
                        best_cls, size = cls, left
            if best_cls is not None:
                seed = [best_cls.cands[i] for i in best_cls.window]
                seed += best_cls.cands[best_cls.frontier :]
                seed += best_cls.extra
                self._work += size // COPY_PER_UNIT
            elif best_open is not None:
                seed = best_open.live()
                self._work += len(best_open.nodes) // COPY_PER_UNIT
            if seed is None:
                seed = self._eligibility.view(req, constraints)
            found.reset(seed, revived)
            self._work += len(found.nodes) // COPY_PER_UNIT
            if found in found.peers:
                found.peers.remove(found)
            found.peers.append(found)  # most recently (re)started last
        return found

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

    def static_nodes(
        self, req: Request, constraints: tuple[Constraint, ...] = ()
    ) -> list[NodeAlloc]:
        """The nodes that pass the request's static rules, in the pass's order: the
        placer's own list, not to be changed (no copy, nothing charged)."""
        return self._eligibility.view(req, constraints)

    def domains(
        self, req: Request, constraints: tuple[Constraint, ...], rules: tuple[SpreadRule, ...]
    ) -> tuple[tuple[str, ...], ...]:
        """Each spread rule's domains (:func:`forge.core.placement.topology.domains`)
        over the request's static nodes, once per pass per static rules and labels."""
        key = (_static_key(req, constraints), tuple(r.label for r in rules))
        found = self._domains.get(key)
        if found is None:
            nodes = self._eligibility.view(req, constraints)
            found = self._domains[key] = _domains(rules, nodes)
            self._work += len(nodes)
        return found

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
