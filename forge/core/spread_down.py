"""Scale-down of a group with ``do_not_schedule`` spread rules: as if released from
the most loaded value first (issue 22).

A replica is named by its ordinal (``job/group/N``), so scaling a group from 6 to 4
releases ordinals 4 and 5 wherever they run, which can leave the rest skewed past
``max_skew`` (replicas 0-3 all in zone a). Kubernetes ranks the pods of a
ReplicaSet to delete by spread; Forge's ordinals cannot be renumbered, so the same
result is reached by a move: a kept replica on the most loaded value (ties: the
values' sorted order; on it, the highest ordinal first, as a scale-down goes) is
released and bound again in the slot a released replica left on a less loaded
value (its node, its GPU ids: room the release has just freed, so the move cannot
fail for capacity). The nodes left holding the group are exactly those a release
from the most loaded value first would have left.

Only while a rule is past its ``max_skew`` (a scale-down within it moves nothing),
only into slots that strictly lower the total excess over every hard rule, and at
most one move per replica the scale-down released: a move costs the moved replica
a restart, so it is made only where the rule needs it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

from forge.core.models import NodeState, SpreadRule, TaskGroup
from forge.core.placement import Binding, NodeAlloc
from forge.core.placement.filters import STATIC_FILTERS, explain_node
from forge.core.placement.topology import topology_of
from forge.core.release import _still_fits_rules

__all__ = ["SPREAD_DOWN", "Move", "spread_moves"]

#: The release reason of a replica moved off the most loaded value by a scale-down.
SPREAD_DOWN = "scaled down (spread)"


class Move(NamedTuple):
    """``wid`` leaves ``old`` (on the most loaded value) for ``new``: the slot of a
    replica the scale-down released."""

    wid: str
    old: Binding
    new: Binding


def spread_moves(
    job_id: str,
    g: TaskGroup,
    nodes: Sequence[NodeAlloc],
    by_id: Mapping[str, NodeAlloc],
    kept: Sequence[Binding],
    released: Sequence[Binding],
) -> list[Move]:
    """The moves that bring ``g``'s hard spread rules back within ``max_skew`` after
    a scale-down released ``released`` (its kept replicas: ``kept``), in order."""
    hard = [(i, r) for i, r in enumerate(g.spread) if r.hard]
    if not hard or not released:
        return []
    req = g.request()
    topo = topology_of(job_id, g, nodes, kept)
    counts = topo.counts

    def counted(b: Binding) -> bool:
        return not b.version or b.version == g.version

    def values(node_id: str) -> list[str | None]:
        labels = by_id[node_id].node.labels
        return [labels.get(r.label) for r in g.spread]

    def excess() -> int:
        return sum(
            max(0, max(counts[i].values()) - min(counts[i].values()) - r.max_skew)
            for i, r in hard
            if counts[i]
        )

    def score() -> tuple[int, int]:
        # the skew past the rules first; then how uneven the counts are, so a move
        # off one of two equally loaded values counts as progress ({3, 3, 0, 0} to
        # {2, 3, 1, 0} leaves the excess as it was, and then {2, 2, 1, 1} ends it)
        return excess(), sum(n * n for i, _ in hard for n in counts[i].values())

    def usable(s: Binding) -> bool:
        alloc = by_id.get(s.node)
        return (
            alloc is not None
            and alloc.node.state is NodeState.READY
            and counted(s)
            and (s.cpu, s.memory, len(s.gpu_ids), s.gpu_milli)
            == (req.cpu, req.memory, req.gpu, req.gpu_milli)
            and all(v is not None and v in counts[i] for i, v in _of(hard, values(s.node)))
            and explain_node(alloc, req, g.constraints, STATIC_FILTERS) is None
            and _still_fits_rules(alloc.node, g, req, s.gpu_ids)
        )

    slots = sorted((s for s in released if usable(s)), key=lambda s: s.ordinal)
    group = sorted(kept, key=lambda b: b.ordinal)
    moves: list[Move] = []
    while slots:
        now = score()
        if not now[0]:
            break
        i, rule = next((i, r) for i, r in hard if _skew(counts[i]) > r.max_skew)
        top = max(counts[i].values())
        value = min(v for v, n in counts[i].items() if n == top)  # ties: sorted order
        movers = [
            b
            for b in reversed(group)
            if counted(b)
            and by_id.get(b.node) is not None
            and by_id[b.node].node.state is NodeState.READY
            and by_id[b.node].node.labels.get(rule.label) == value
        ]
        on = {b.node for b in group}
        found: tuple[Binding, Binding] | None = None
        for k in movers:
            for s in sorted(
                slots, key=lambda s: (counts[i].get(values(s.node)[i] or "", 0), s.ordinal)
            ):
                if s.node == k.node or (g.distinct_hosts and s.node in on):
                    continue
                _shift(counts, hard, values(k.node), values(s.node))
                better = score() < now
                _shift(counts, hard, values(s.node), values(k.node))  # undo
                if better:
                    found = (k, s)
                    break
            if found is not None:
                break
        if found is None:
            break
        k, s = found
        _shift(counts, hard, values(k.node), values(s.node))
        slots.remove(s)
        new = Binding(
            k.job,
            k.group,
            k.ordinal,
            s.node,
            s.gpu_ids,
            s.cpu,
            s.memory,
            gpu_milli=s.gpu_milli,
            version=k.version,
        )
        group[group.index(k)] = new
        moves.append(Move(k.workload_id, k, new))
    return moves


def _skew(counts: Mapping[str, int]) -> int:
    return max(counts.values()) - min(counts.values()) if counts else 0


def _of(hard: list[tuple[int, SpreadRule]], vals: list[str | None]) -> list[tuple[int, str | None]]:
    """Each hard rule's index with the node's value of its label."""
    return [(i, vals[i]) for i, _ in hard]


def _shift(
    counts: list[dict[str, int]],
    hard: list[tuple[int, SpreadRule]],
    src: list[str | None],
    dst: list[str | None],
) -> None:
    """Move one counted replica from the values ``src`` to ``dst`` in every hard rule."""
    for i, _ in hard:
        a, b = src[i], dst[i]
        if a is not None and a in counts[i]:
            counts[i][a] -= 1
        if b is not None and b in counts[i]:
            counts[i][b] += 1
