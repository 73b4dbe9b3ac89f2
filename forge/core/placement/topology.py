"""Rules over a group's own replicas: ``distinct_hosts`` (no two on one node,
Nomad's constraint of that name) and ``spread`` (Kubernetes'
topologySpreadConstraints: the replica count per value of a node label differs by
at most ``max_skew``).

Unlike every other rule, whether a node can take such a group's replica depends
on where the group's other replicas are, so the answer changes with each of the
group's placements. Such a group therefore never joins an equivalence class (a
class shares one feasibility search, and its "no node found" answer, between
replicas of any group with the same request): the placer searches for it with
:meth:`forge.core.placement.select.Placer.place_with`, which reads a
:class:`Topology` kept for the group through the pass.

The domains of a spread rule are the values of its label on the group's statically
eligible nodes (ready, matching its constraints, taints and GPUs), as Kubernetes
counts the nodes that pass node affinity. During a rolling update only replicas of
the group's current version count towards spread; every replica counts towards
``distinct_hosts``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from forge.core.models import Constraint, Node, Request, SpreadRule, TaskGroup
from forge.core.placement.diagnosis import Diagnosis, Rejection, Rule
from forge.core.placement.filters import DEFAULT_FILTERS, STATIC_FILTERS, Filter, explain_node
from forge.core.placement.state import Binding, NodeAlloc

__all__ = [
    "DistinctHostsFilter",
    "SpreadFilter",
    "Topology",
    "domains",
    "filters_for",
    "topology_of",
]

_DISTINCT = Rejection(Rule.DISTINCT_HOSTS)


class Topology:
    """One group's replicas as its ``distinct_hosts`` and ``spread`` rules see them.

    ``held``: the group's replicas per node id; per spread rule, the counted
    replicas per label value (every domain present, from 0) and their minimum.
    ``why`` and ``revived`` are the placer's: the group's "no node" answer, kept
    until capacity revives."""

    __slots__ = (
        "_hard",
        "counts",
        "distinct",
        "held",
        "mins",
        "revived",
        "rules",
        "why",
    )

    def __init__(
        self,
        distinct_hosts: bool,
        rules: Sequence[SpreadRule],
        domains: Sequence[Iterable[str]],
    ) -> None:
        self.distinct = distinct_hosts
        self.rules = tuple(rules)
        self.held: dict[str, int] = {}
        self.counts: list[dict[str, int]] = [dict.fromkeys(values, 0) for values in domains]
        self.mins = [0 for _ in self.rules]
        # the do_not_schedule rules, with their verdicts made once
        self._hard = [
            (
                i,
                r.label,
                r.max_skew,
                Rejection(Rule.SPREAD_LABEL, label=r.label),
                Rejection(Rule.SPREAD, label=r.label),
            )
            for i, r in enumerate(self.rules)
            if r.hard
        ]
        self.revived = 0
        self.why: Diagnosis | None = None  # the placer's, when the group found no node

    @classmethod
    def of(
        cls,
        group: TaskGroup,
        domains: Sequence[Iterable[str]],
        held: Iterable[tuple[Node, bool]],
    ) -> Topology:
        """The topology of ``group`` with each spread rule's ``domains`` (from
        :func:`domains`) and its replicas ``held`` (each node holding one, and
        whether it counts towards spread: a replica of the current version)."""
        topo = cls(group.distinct_hosts, group.spread, domains)
        for node, counted in held:
            topo.add(node, counted=counted)
        return topo

    def copy(self) -> Topology:
        """A copy to try placements on (a gang's trial)."""
        out = Topology(self.distinct, self.rules, ())
        out.held = dict(self.held)
        out.counts = [dict(c) for c in self.counts]
        out.mins = list(self.mins)
        return out

    @property
    def hard(self) -> list[tuple[int, str, int, Rejection, Rejection]]:
        """The ``do_not_schedule`` rules: index, label, max_skew and their verdicts
        (a missing label, a skew past max_skew), for a search that inlines them."""
        return self._hard

    @property
    def soft(self) -> bool:
        """Whether any rule is a preference (``schedule_anyway``)."""
        return any(not r.hard for r in self.rules)

    def add(self, node: Node, *, counted: bool = True) -> None:
        """Note one more replica of the group on ``node``."""
        self.held[node.id] = self.held.get(node.id, 0) + 1
        if not counted:
            return
        for i, r in enumerate(self.rules):
            counts = self.counts[i]
            value = node.labels.get(r.label)
            if value is not None and value in counts:
                counts[value] += 1
                self.mins[i] = min(counts.values())

    def _excess(self, i: int, node: Node) -> int | None:
        """How far past ``max_skew`` one more replica on ``node`` takes rule ``i``
        (0: within it; None: the node lacks the label)."""
        r = self.rules[i]
        value = node.labels.get(r.label)
        if value is None:
            return None
        skew = self.counts[i].get(value, 0) + 1 - self.mins[i]
        return max(0, skew - r.max_skew)

    def distinct_rejection(self, node: Node) -> Rejection | None:
        if self.distinct and node.id in self.held:
            return _DISTINCT
        return None

    def spread_rejection(self, node: Node) -> Rejection | None:
        labels, counts, mins = node.labels, self.counts, self.mins
        for i, label, skew, missing, skewed in self._hard:
            value = labels.get(label)
            if value is None:
                return missing
            if counts[i].get(value, 0) + 1 - mins[i] > skew:
                return skewed
        return None

    def rejection(self, node: Node) -> Rejection | None:
        """The first of the group's own rules that keeps a replica off ``node``."""
        if self.distinct and node.id in self.held:
            return _DISTINCT
        return self.spread_rejection(node) if self._hard else None

    def within(self, node: Node) -> bool:
        """Whether one more replica on ``node`` keeps every preference's skew within
        its ``max_skew`` (such a node needs no further search for a better one)."""
        return all(r.hard or self._excess(i, node) == 0 for i, r in enumerate(self.rules))

    def score(self, node: Node) -> float:
        """0..100, the mean over the ``schedule_anyway`` rules (100 if none): 100 on
        a value holding the fewest replicas, falling with the count above that; 0
        without the label."""
        total, n = 0.0, 0
        for i, r in enumerate(self.rules):
            if r.hard:
                continue
            n += 1
            value = node.labels.get(r.label)
            if value is None:
                continue
            counts = self.counts[i]
            spread = max(counts.values(), default=0) - self.mins[i] + 1
            total += 100.0 * (spread - (counts.get(value, 0) - self.mins[i])) / spread
        return total / n if n else 100.0


def domains(rules: Sequence[SpreadRule], nodes: Iterable[NodeAlloc]) -> tuple[tuple[str, ...], ...]:
    """Each rule's domains: the values of its label on ``nodes`` (sorted)."""
    values: list[set[str]] = [set() for _ in rules]
    for alloc in nodes:
        labels = alloc.node.labels
        for i, r in enumerate(rules):
            value = labels.get(r.label)
            if value is not None:
                values[i].add(value)
    return tuple(tuple(sorted(v)) for v in values)


class DistinctHostsFilter:
    """A node holding a replica of the group cannot take another (``distinct_hosts``)."""

    name = "distinct-hosts"

    def __init__(self, topology: Topology) -> None:
        self.topology = topology

    def check(
        self, node: NodeAlloc, req: Request, constraints: Sequence[Constraint]
    ) -> Rejection | None:
        return self.topology.distinct_rejection(node.node)


class SpreadFilter:
    """The group's ``do_not_schedule`` spread rules: a node without the label, or
    on a value one more replica would skew past ``max_skew``, cannot take it."""

    name = "spread"

    def __init__(self, topology: Topology) -> None:
        self.topology = topology

    def check(
        self, node: NodeAlloc, req: Request, constraints: Sequence[Constraint]
    ) -> Rejection | None:
        return self.topology.spread_rejection(node.node)


def topology_of(
    job_id: str, group: TaskGroup, nodes: Sequence[NodeAlloc], bindings: Iterable[Binding]
) -> Topology:
    """The group's topology over ``nodes`` (its domains: the values on the nodes
    that pass its static rules) with its replicas among ``bindings``: what
    ``forge explain`` checks a node against, as the pass would."""
    req = group.request()
    eligible = [
        n
        for n in nodes
        if len(n.node.gpus) >= req.gpu
        and explain_node(n, req, group.constraints, STATIC_FILTERS) is None
    ]
    by_id = {n.id: n.node for n in nodes}
    held = [
        (by_id[b.node], not b.version or b.version == group.version)
        for b in bindings
        if b.job == job_id
        and b.group == group.name
        and b.ordinal < group.scaling.desired
        and b.node in by_id
    ]
    return Topology.of(group, domains(group.spread, eligible), held)


def filters_for(topology: Topology | None) -> tuple[Filter, ...]:
    """The filter chain for a group: the default one, then the group's own rules."""
    if topology is None:
        return DEFAULT_FILTERS
    return (*DEFAULT_FILTERS, DistinctHostsFilter(topology), SpreadFilter(topology))
