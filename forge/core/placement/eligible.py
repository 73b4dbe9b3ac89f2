"""Static eligibility: which nodes pass the rules that cannot change within a pass
(node state, labels, taints, GPU count, model and memory), shared by every
equivalence class with the same rules, and why the others are out.

None of it depends on what the nodes hold, so a carried cluster keeps it across
passes (``Cluster.static``, dropped when a node changes): a pass over a steady
cluster builds no static list and sweeps no node to say why a class found none.
Building it is counted in ``work`` only when it is built.
"""

from __future__ import annotations

import random

from forge.core.models import Constraint, NodeState, Request, tolerated
from forge.core.placement.classes import static_key
from forge.core.placement.diagnosis import Rejection, Rule
from forge.core.placement.state import Cluster, NodeAlloc

__all__ = ["COPY_PER_UNIT", "Eligibility"]

#: Work units: one per node checked or scored in Python; copying node lists (a C
#: loop) costs about this many nodes per unit.
COPY_PER_UNIT = 16
_TOO_FEW_GPUS = Rejection(Rule.GPU)
_GPU_MODEL = Rejection(Rule.GPU_MODEL)
_GPU_MEMORY = Rejection(Rule.GPU_MEMORY)


class Eligibility:
    """The statically eligible nodes per set of static rules, in the pass's seeded
    order. ``work`` counts what building them cost (for the placer's budget)."""

    @classmethod
    def of(cls, cluster: Cluster, *, seed: int) -> Eligibility:
        """The cluster's eligibility for this seed, kept in the cluster
        (``Cluster.static``) so the passes of a carried cluster share it. The node
        order is the seeded shuffle of the cluster's nodes (Nomad seeds its shuffle
        from the evaluation id: reproducible, yet free of id-order bias)."""
        key = ("eligibility", seed)
        found = cluster.static.get(key)
        if isinstance(found, cls):
            found.kept = True
            return found
        order = list(cluster.nodes)
        random.Random(seed).shuffle(order)
        made = cls(cluster, order)
        made.work = len(order) // COPY_PER_UNIT  # the order's copy
        cluster.static[key] = made
        return made

    def __init__(self, cluster: Cluster, order: list[NodeAlloc]) -> None:
        # the cluster's node list, not the cluster: kept in ``cluster.static``, a
        # reference back would make a cycle, and a cluster left behind (a new run,
        # a node change) would then wait for a full collection instead of going
        self.nodes_all = cluster.nodes
        self.order = order
        self.work = 0
        self.kept = False  # handed to a later pass (its work so far was charged before)
        self._static: dict[tuple[object, ...], list[NodeAlloc]] = {}
        self._static_ids: dict[tuple[object, ...], set[int]] = {}
        self._static_why: dict[tuple[object, ...], dict[Rejection, int]] = {}
        self._tallies: tuple[dict[Rejection, int], dict[int, int]] | None = None
        self._ready: list[NodeAlloc] | None = None  # the schedulable nodes, in order
        self._most_gpus = max((len(n.node.gpus) for n in order), default=0)
        self._tainted = any(n.node.taints for n in order)

    def nodes(self, req: Request, constraints: tuple[Constraint, ...]) -> list[NodeAlloc]:
        """A fresh list of the nodes that pass the static rules, in the pass's order."""
        skey = static_key(req, constraints)
        nodes = self._static.get(skey)
        if nodes is None:
            # the same nodes in the same order as one combined filter, each rule a
            # pass of its own so a pass without constraints or GPUs costs nothing
            if self._ready is None:  # one sweep per pass, whatever the number of rules
                self._ready = [n for n in self.order if n.schedulable]
            nodes = list(self._ready)
            self.work += len(self.order) // COPY_PER_UNIT
            if req.gpu > self._most_gpus:
                nodes = []  # more devices than any node has: nothing to look at
            if not req.gpu:
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

    def view(self, req: Request, constraints: tuple[Constraint, ...]) -> list[NodeAlloc]:
        """The list :meth:`nodes` copies, itself: for a search that only reads it."""
        skey = static_key(req, constraints)
        if skey not in self._static:
            self.nodes(req, constraints)
        return self._static[skey]

    def ids(self, req: Request, constraints: tuple[Constraint, ...]) -> set[int]:
        skey = static_key(req, constraints)
        ids = self._static_ids.get(skey)
        if ids is None:
            ids = self._static_ids[skey] = {n.index for n in self.nodes(req, constraints)}
        return ids

    def reasons(self, req: Request, constraints: tuple[Constraint, ...]) -> dict[Rejection, int]:
        """Why the nodes outside a class's static list are out, counted once per
        set of static rules while the nodes stay the same (only when a class of
        that set runs out)."""
        skey = static_key(req, constraints)
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
                counts[_TOO_FEW_GPUS] = short
            self._static_why[skey] = counts
            return counts
        if skey not in self._static:
            self.nodes(req, constraints)
        eligible = {id(n) for n in self._static[skey]}
        counts = _static_reasons(self.nodes_all, eligible, req, constraints, self._tainted)
        # one cheap check per node outside the list, once per rule set and node set
        self.work += len(self.nodes_all) + (len(self.nodes_all) - len(eligible))
        self._static_why[skey] = counts
        return counts

    def _tally(self) -> tuple[dict[Rejection, int], dict[int, int]]:
        """Nodes out of service by state, and ready nodes by device count."""
        if self._tallies is None:
            states: dict[Rejection, int] = {}
            gpus: dict[int, int] = {}
            for n in self.nodes_all:
                if n.schedulable:
                    gpus[len(n.node.gpus)] = gpus.get(len(n.node.gpus), 0) + 1
                else:
                    why = Rejection(Rule.STATE, state=str(n.node.state.value))
                    states[why] = states.get(why, 0) + 1
            self._tallies = (states, gpus)
            self.work += len(self.nodes_all)
        return self._tallies


def _static_reasons(
    nodes: list[NodeAlloc],
    eligible: set[int],
    req: Request,
    constraints: tuple[Constraint, ...],
    tainted: bool,
) -> dict[Rejection, int]:
    """Each node outside ``eligible`` (ids) counted under the first static rule that
    rejects it, in node order: what ``filters.explain_node`` with the static filters
    says (state, constraint, taint, GPU model, GPU memory; else too few devices),
    written out so a sweep costs a few attribute reads per node, not a filter chain
    and a verdict object each (tests/core/placement/test_eligible.py holds them equal)."""
    counts: dict[Rejection, int] = {}
    states: dict[str, Rejection] = {}
    models = req.gpu_models if req.gpu else ()
    memory = req.gpu_memory if req.gpu else 0
    need = req.gpu
    tols = req.tolerations
    for n in nodes:
        if id(n) in eligible:
            continue
        node = n.node
        why: Rejection | None = None
        if node.state is not NodeState.READY:
            value = str(node.state.value)
            why = states.get(value)
            if why is None:
                why = states[value] = Rejection(Rule.STATE, state=value)
        else:
            for c in constraints:
                if not c.matches(node.labels):
                    why = Rejection(Rule.CONSTRAINT, constraint=c)
                    break
            if why is None and tainted and node.taints:
                taint = tolerated(node.taints, tols)
                if taint is not None:
                    why = Rejection(Rule.TAINT, taint=taint)
            if why is None:
                if models and sum(1 for g in node.gpus if g.model in models) < need:
                    why = _GPU_MODEL
                elif memory and len(n.matching_gpus(req, free_only=False)) < need:
                    why = _GPU_MEMORY
                else:
                    why = _TOO_FEW_GPUS
        counts[why] = counts.get(why, 0) + 1
    return counts
