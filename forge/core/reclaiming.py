"""Reclaim's victims by quota (issue 34): when a preemption search frees a node for a
queue's replica but not the quota its cohort lent away, more of the cohort's borrowers
are evicted, wherever they run, until the quota is back.

A queue within its nominal quota whose cohort has lent everything reclaims it
(:mod:`forge.core.admitting`): the preempt phase finds it a node as any preemption
does (:mod:`forge.core.preempting`); where that node had room without evicting enough
borrowed quota, these are the further victims: replicas of the cohort's borrowing
queues, lowest priority first, then most recently bound, fewest possible. Bounded:
it looks at the most recent ``SCAN`` charges and takes at most ``MAX_EXTRA``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from forge.core.admitting import Claim, Gate
from forge.core.groups import Groups
from forge.core.models import Job, Request
from forge.core.placement import Binding, Cluster
from forge.core.preemption import Holder, Preemption
from forge.core.quota import Usage, held

__all__ = ["MAX_EXTRA", "SCAN", "ByQueue", "evictable", "trade_victims"]

#: charges looked at, most recent first, and extra victims taken, per reclaim
SCAN = 4096
MAX_EXTRA = 64


class ByQueue:
    """Per node, its holders by their job's queue, built the first time a claim looks
    at the node in a pass (a claim then reads only the queues it may take from: the
    search's cost stays with the candidates it counts, not the node's every holder)."""

    def __init__(self, holders_of: Callable[[str], list[Holder]], groups: Groups) -> None:
        self._of, self._groups = holders_of, groups
        self._nodes: dict[str, dict[str, list[Holder]]] = {}

    def of(self, node: str) -> dict[str, list[Holder]]:
        found = self._nodes.get(node)
        if found is None:
            found = self._nodes[node] = {}
            for h in self._of(node):
                found.setdefault(self._groups[h.group].job.queue, []).append(h)
        return found

    def drop(self, node: str) -> None:
        """The node's holders changed (a binding was made on it)."""
        self._nodes.pop(node, None)


def evictable(
    gate: Gate, claim: Claim, by_queue: ByQueue, groups: Groups, cluster: Cluster, node: str
) -> list[Holder]:
    """The holders on ``node`` a ``claim`` may evict (:meth:`Gate.may_evict`), looked
    at only in the queues it may take from."""
    on, mine, per = cluster.by_id[node].node, claim.queue, by_queue.of(node)
    out = []
    for queue in sorted(claim.others | {mine}):
        for h in per.get(queue, ()):
            if gate.may_evict(claim, groups[h.group].job, held(h.binding, on)):
                out.append(h)
    return out


def trade_victims(
    job: Job,
    req: Request,
    choice: Preemption,
    gate: Gate,
    *,
    bindings: Mapping[str, Binding],
    groups: Groups,
    cluster: Cluster,
    skip: set[str],
    cooling: Callable[[str], bool],
    budget: Callable[[tuple[str, str]], int | None],
) -> list[Holder] | None:
    """The fewest victims beside the node's (``choice``) whose eviction admits one
    replica of ``job`` asking ``req`` ([]: none; the trade is kept in ``gate``), or
    None: not within what the scan of the most recent charges found."""
    on = tuple(sorted({d.model for d in choice.node.node.gpus})) if req.gpu else ()
    pairs = [
        (groups[v.group].job, held(v.binding, cluster.by_id[v.binding.node].node))
        for v in choice.victims
    ]
    claim = gate.claim(job, req)  # (each trade below starts from the same usage)
    if gate.trade(job, req, on, pairs, claim):
        return []
    found: list[tuple[Holder, Job, Usage]] = []
    for n, wid in enumerate(reversed(gate.ledger.charged)):
        if n >= SCAN:
            break
        b = bindings.get(wid)
        entry = groups.get((b.job, b.group)) if b is not None else None
        if b is None or entry is None or wid in skip or entry.spec.gang or cooling(wid):
            continue
        left = budget((b.job, b.group))
        use = held(b, cluster.by_id[b.node].node)
        if (left is not None and left <= 0) or not gate.may_evict(claim, entry.job, use):
            continue
        found.append((Holder(wid, b, entry.job.priority), entry.job, use))
    found.sort(key=lambda f: f[0].priority)  # (stable: most recent first within one)
    taken = []
    for holder, owner, use in found[:MAX_EXTRA]:
        taken.append(holder)
        pairs.append((owner, use))
        if gate.trade(job, req, on, pairs, claim):
            return taken
    return None
