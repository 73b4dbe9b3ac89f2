"""Which groups the place phase visits, and in what order.

A pass places into the groups left incomplete by the last pass, those of changed
jobs and those that lost a binding now, in placement order: the job's sort key
(:mod:`forge.core.queue`), then the group's place in its job. This module builds
that list (:func:`to_visit`) and leaves the next pass its start
(:func:`incomplete`, :func:`ordered`), so a steady pass behind a big backlog merges
the few groups that moved into the carried order instead of sorting the backlog
again. Once per group, never per replica: the per-replica loop is
:mod:`forge.core.placing`'s.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

from forge.core.groups import Bound, GroupKey, Groups
from forge.core.models import Job
from forge.core.placement import Binding
from forge.core.queue import GroupOrder, Queue, SortKey, sort_key

__all__ = ["Done", "incomplete", "ordered", "still_wanted", "to_visit"]

#: The ordinals of batch groups that completed (forge.core.kinds): never placed
#: again, so they count towards a group's replicas as its bindings do.
Done = Mapping[GroupKey, Collection[int]]


def still_wanted(groups: Groups, key: GroupKey, done: Done) -> int:
    """How many bindings the group wants: its desired count less its done ordinals
    (0 for a group not in the index)."""
    entry = groups.get(key)
    if entry is None:
        return 0
    finished = done.get(key) if done else None
    return entry.spec.scaling.desired - (len(finished) if finished else 0)


def to_visit(
    groups: Groups,
    queue: Queue,
    changed_jobs: list[str],
    jobs: Mapping[str, Job],
    dropped: list[Binding],
    bound: Bound | Mapping[GroupKey, int],
    done: Done | None = None,
) -> list[tuple[SortKey, GroupKey]]:
    """The groups this pass may place into, in placement order (job sort key, then
    the group's place in its job): those left incomplete by the last pass, those of
    changed jobs and those that lost a binding now, less the ones fully bound. A
    walk over every job in order would place into exactly these, in this order.

    The last pass's incomplete groups come already ordered (``queue.order``): only
    the groups of changed jobs (whose order may have moved) and those that lost a
    binding are placed among them, so a pass behind a big backlog does not sort the
    whole backlog again."""

    carried, last = queue.order, queue.incomplete
    kept: list[tuple[GroupOrder, GroupKey]]
    if carried is None or last is None:
        # every group a key (after a continue-as-new): the fully bound ones leave
        # before any is ordered, so a new run's first pass sorts only the incomplete
        keys = set(groups) if last is None else set(last)
        if last is not None:
            keys.update((j, g.name) for j in changed_jobs if j in jobs for g in jobs[j].groups)
            keys.update((b.job, b.group) for b in dropped)
        kept = [
            (o, k)
            for k in _wanting(keys, groups, bound, done)
            if (o := _order(groups, k)) is not None
        ]
    else:
        # The carried groups were incomplete when the last pass ended, and only a
        # pass binds: they still are, unless their job changed (then it is ordered
        # again like any new key). Only the new keys are looked at, not the backlog.
        moved = set(changed_jobs)
        kept = [e for e in carried if e[1][0] not in moved] if moved else list(carried)
        extra = {(j, g.name) for j in changed_jobs if j in jobs for g in jobs[j].groups}
        extra.update((b.job, b.group) for b in dropped if (b.job, b.group) not in last)
        kept.extend(
            (o, key)
            for key in _wanting(sorted(extra), groups, bound, done)
            if (o := _order(groups, key)) is not None
        )
    kept.sort()  # the carried part is in order already: a merge, not a sort
    queue.visiting = kept  # for ordered(), at the end of the pass
    return [(order[0], key) for order, key in kept]


def _wanting(
    keys: Iterable[GroupKey],
    groups: Groups,
    bound: Bound | Mapping[GroupKey, int],
    done: Done | None,
) -> list[GroupKey]:
    """Those of ``keys`` with fewer bindings than replicas desired."""
    if done:  # batch groups with ordinals done: rare, so the plain walk
        return [k for k in keys if bound.get(k, 0) < still_wanted(groups, k, done)]
    if isinstance(bound, Bound):  # the carry's index, read without a call per group
        held = bound.by_group
        return [
            key
            for key in keys
            if (entry := groups.get(key)) is not None
            and len(held.get(key) or ()) < entry.spec.scaling.desired
        ]
    return [
        key
        for key in keys
        if (entry := groups.get(key)) is not None and bound.get(key, 0) < entry.spec.scaling.desired
    ]


def _order(groups: Groups, key: GroupKey) -> GroupOrder | None:
    entry = groups.get(key)
    if entry is None:
        return None
    job = entry.job
    names = [x.name for x in job.groups]
    return (sort_key(job), names.index(entry.spec.name))


def ordered(queue: Queue, keep: set[GroupKey], groups: Groups) -> list[tuple[GroupOrder, GroupKey]]:
    """``keep`` as the next pass's ``to_visit`` takes it: the groups this pass
    visited (``queue.visiting``) in its order, then any others (sorted in then)."""
    out = [e for e in queue.visiting if e[1] in keep]
    queue.visiting = []
    if len(out) < len(keep):
        seen = {key for _, key in out}
        out.extend(
            (o, key) for key in sorted(keep - seen) if (o := _order(groups, key)) is not None
        )
    return out


def incomplete(
    keys: Iterable[GroupKey],
    by_group: Mapping[GroupKey, Mapping[str, None]],
    groups: Groups,
    done: Done | None = None,
) -> set[GroupKey]:
    """The groups among ``keys`` with fewer bindings than replicas desired (less
    their ``done`` ordinals)."""
    out = set()
    for key in keys:
        entry = groups.get(key)
        if entry is None:
            continue
        want = still_wanted(groups, key, done) if done else entry.spec.scaling.desired
        if len(by_group.get(key) or ()) < want:
            out.add(key)
    return out
