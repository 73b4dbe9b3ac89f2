"""The release phase of a pass that has a carry: re-check only what may have changed.

A steady pass over 300,000 bindings costs what changed, not 300,000 checks: the
bindings on changed nodes, of changed groups, of failed replicas and those held on
draining nodes (:class:`forge.core.release.Carry` says which); every one is decided
by the same rule a pass without a carry applies to all (``forge.core.release``).
"""

from __future__ import annotations

from collections.abc import Mapping

from forge.core.groups import Groups
from forge.core.models import Job, Node
from forge.core.release import DRAINING, Carry, Held, Release, _holds, _reason

__all__ = ["release_changed"]


def release_changed(
    carry: Carry,
    jobs: Mapping[str, Job],
    nodes: Mapping[str, Node],
    groups: Groups,
    changed_jobs: list[str],
    failed: set[str],
    node_ok: dict[tuple[str, tuple[str, str]], bool],
    release: Release,
    rolling: bool = False,
    held: Held = None,
) -> int:
    """Re-check only what may have changed since the carry's pass: the bindings on
    nodes whose object changed (re-held from empty, in binding order, as a full pass
    would), and those of changed groups (``changed_jobs``: Carry.changed_jobs), of
    failed replicas and those the last pass held back on draining nodes. Those of
    budgeted groups on draining nodes are kept and listed in ``held`` (when given).
    Returns how many bindings were checked."""
    checked = _release_stale(carry, groups, failed, release, rolling, held)
    old_nodes = carry.nodes
    changed_nodes = sorted(
        n for n in nodes.keys() | old_nodes.keys() if nodes.get(n) is not old_nodes.get(n)
    )
    cluster = carry.cluster
    if changed_nodes:
        cluster.refresh(dict(nodes), set(changed_nodes))
    on_changed = set(changed_nodes)
    for node_id in changed_nodes:
        alloc = cluster.by_id.get(node_id)
        for wid in list(carry.by_node.get(node_id, ())):
            b = carry.bindings[wid]
            checked += 1
            entry = groups.get((b.job, b.group))
            reason = _reason(wid, b, entry, alloc, failed, node_ok, rolling, held is not None)
            holds = held is not None and _holds(reason, wid, b, entry, failed)
            if reason is None or holds:
                assert alloc is not None
                if alloc.hold(b):
                    if holds and held is not None:
                        held.append((wid, b))
                    continue
                reason = "node capacity changed"
            carry.drop(wid, b)
            release(wid, b, reason)
    candidates: dict[str, None] = {}
    for job_id in changed_jobs:
        for job in (carry.jobs.get(job_id), jobs.get(job_id)):
            for g in job.groups if job is not None else ():
                candidates.update(carry.by_group.get((job_id, g.name), {}))
    for wid in sorted(failed):
        candidates[wid] = None
    candidates.update(carry.draining)
    carry.draining = {}
    return checked + _recheck(
        carry, candidates, on_changed, groups, failed, node_ok, release, rolling, held
    )


def _release_stale(
    carry: Carry, groups: Groups, failed: set[str], release: Release, rolling: bool, held: Held
) -> int:
    """The bindings found invalid when the carry was loaded: released, except those
    of budgeted groups on draining nodes, kept for the drain step. Returns how many
    were checked."""
    checked = len(carry.stale)
    for wid, b, why in carry.stale:  # found invalid when loaded
        entry = groups.get((b.job, b.group))
        if held is not None and why == DRAINING:
            alloc = carry.cluster.by_id.get(b.node)
            why = _reason(wid, b, entry, alloc, failed, {}, rolling, True) or DRAINING
        if held is not None and _holds(why, wid, b, entry, failed):
            alloc = carry.cluster.by_id.get(b.node)
            if alloc is not None and alloc.hold(b):
                assert entry is not None
                carry.add(wid, b)
                carry.floor = min(carry.floor, entry.job.priority)
                held.append((wid, b))
                continue
        release(wid, b, why)
    carry.stale = []
    return checked


def _recheck(
    carry: Carry,
    candidates: Mapping[str, None],
    on_changed: set[str],
    groups: Groups,
    failed: set[str],
    node_ok: dict[tuple[str, tuple[str, str]], bool],
    release: Release,
    rolling: bool,
    held: Held,
) -> int:
    """Re-check the bindings of changed groups, failed replicas and those held on
    draining nodes (``candidates``), less those on changed nodes (decided with their
    node already). Returns how many were checked."""
    checked = 0
    cluster = carry.cluster
    for wid in candidates:
        kept = carry.bindings.get(wid)
        if kept is None or kept.node in on_changed:
            continue  # gone already, or decided with its node above
        checked += 1
        alloc = cluster.by_id[kept.node]
        entry = groups.get((kept.job, kept.group))
        reason = _reason(wid, kept, entry, alloc, failed, node_ok, rolling, held is not None)
        if reason is None:
            continue  # still held, unchanged
        if held is not None and _holds(reason, wid, kept, entry, failed):
            held.append((wid, kept))
            continue  # still held, for the drain step
        alloc.unhold(kept)
        carry.drop(wid, kept)
        release(wid, kept, reason)
    return checked
