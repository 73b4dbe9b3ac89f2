"""The placer's searches that use no equivalence class: a group whose rules look at
its own replicas (``distinct_hosts``, ``spread``: :mod:`forge.core.placement.topology`)
and a gang (all of its replicas or none). A class shares one cursor and one "no node"
answer between replicas of any group with the same request; these groups' answers
change with their own placements, so they search on their own, sharing with others
only what the pass learnt about capacity (:class:`Open`: the nodes that may still fit
a request). :class:`Searches` is a part of :class:`forge.core.placement.select.Placer`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

from forge.core.models import Constraint, Request, SpreadRule
from forge.core.placement.classes import CAPACITY_CAUSES, EquivalenceClass, static_key
from forge.core.placement.diagnosis import Diagnosis, Rejection
from forge.core.placement.eligible import COPY_PER_UNIT, Eligibility
from forge.core.placement.kernel import fits, shortfall
from forge.core.placement.scan import AVOID_PENALTY
from forge.core.placement.scorers import FastScore, Weighted, combined
from forge.core.placement.state import Cluster, NodeAlloc
from forge.core.placement.topology import Topology
from forge.core.placement.topology import domains as _domains

__all__ = ["REBASE_PEERS", "Choice", "Open", "Peer", "Searches"]

REBASE_PEERS = 16  # recently used classes (or open lists) a (re)starting one may learn from

#: A binpack class among its peers (Placer._rebase): its request's cpu and memory
#: (read once, not from the pydantic model on every look) and the class.
Peer = tuple[int, int, EquivalenceClass]


@dataclass(frozen=True, slots=True)
class Choice:
    node: NodeAlloc
    gpu_ids: tuple[str, ...]
    score: float


class Open:
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
        self.peers: list[Open] = []
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


class Searches:
    """The searches without a class, as a part of the placer (which holds the
    state they read: its cluster, scorers, eligibility, classes and work)."""

    cluster: Cluster
    algorithm: str
    scorers: tuple[Weighted, ...]
    scored: int
    _work: int
    _fast: FastScore | None
    _revived: list[NodeAlloc]
    _eligibility: Eligibility
    _peers: dict[tuple[object, ...], dict[int, Peer]]
    _opens: dict[tuple[object, ...], Open]
    _open_peers: dict[tuple[object, ...], list[Open]]
    _open_by_id: dict[int, tuple[Request, tuple[Constraint, ...], Open]]
    _domains: dict[tuple[object, ...], tuple[tuple[str, ...], ...]]

    def _limit(self, req: Request) -> int:
        raise NotImplementedError  # the placer's

    def _take(self, best: NodeAlloc, req: Request) -> tuple[str, ...]:
        raise NotImplementedError  # the placer's

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
        so a replica is refused only if no node passes every rule (invariant 4;
        the refusal is kept for the group: :meth:`_refuse`)."""
        if self._still_refused(topology):
            return None
        open_ = self._open(req, constraints)
        nodes, dead = open_.nodes, open_.dead
        limit = self._limit(req) or len(nodes)
        fast, soft = self._fast, topology.soft
        best: NodeAlloc | None = None
        # swept: dead nodes walked over (or found) by this search
        best_score, good, checked, scored, swept = -1e18, 0, 0, 0, 0
        # the fit kernel (work without GPUs) and the group's rules written out, as in
        # scan.best_in_window: this loop runs once per node looked at
        rcpu, rmemory, rgpu = req.cpu, req.memory, req.gpu
        held = topology.held if topology.distinct else None
        hard, counts, mins = topology.hard, topology.counts, topology.mins
        for node in nodes:
            checked += 1
            index = node.index
            if index in dead:
                swept += 1
                continue
            spec = node.node
            if (
                (not fits(node, req))
                if rgpu
                else (
                    spec.cpu - node.cpu_used - node.res_cpu < rcpu
                    or spec.memory - node.mem_used - node.res_mem < rmemory
                )
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
            self._refuse(req, constraints, topology)
            return None
        return Choice(best, self._take(best, req), best_score)

    def _still_refused(self, topology: Topology) -> bool:
        """Whether the group's last refusal stands: it does until capacity revives
        (a revival since it forgets it, and the group's nodes are scanned again)."""
        if topology.revived < len(self._revived):
            topology.revived = len(self._revived)
            topology.why = None
            return False
        return topology.why is not None

    def _refuse(
        self, req: Request, constraints: tuple[Constraint, ...], topology: Topology
    ) -> None:
        """No node passes every rule: the reason, kept for the group (its replicas
        are the same and its rules unchanged) until capacity revives."""
        view = self._eligibility.view(req, constraints)
        topology.why = self._why_on(req, constraints, view, topology)

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

    def _open(self, req: Request, constraints: tuple[Constraint, ...]) -> Open:
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
            skey = static_key(req, constraints)
            key = (skey, req.cpu, req.memory)
            found = self._opens.get(key) or self._opens.setdefault(key, Open(req))
            found.peers = self._open_peers.setdefault(skey, [])
            found.peers_key = skey
            self._open_by_id[id(req)] = (req, constraints, found)
        revived = len(self._revived)
        if found.revived < 0 or found.revived < revived:
            seed: list[NodeAlloc] | None = None
            cpu, memory = req.cpu, req.memory
            size = -1
            best_open: Open | None = None
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
            best_cls: EquivalenceClass | None = None
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
        key = (static_key(req, constraints), tuple(r.label for r in rules))
        found = self._domains.get(key)
        if found is None:
            nodes = self._eligibility.view(req, constraints)
            found = self._domains[key] = _domains(rules, nodes)
            self._work += len(nodes)
        return found
