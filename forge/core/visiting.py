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

from collections.abc import Iterable, Mapping

from forge.core.groups import GroupKey, Groups
from forge.core.models import Job
from forge.core.placement import Binding
from forge.core.placing import Bound
from forge.core.queue import GroupOrder, Queue, SortKey, sort_key

__all__ = ["incomplete", "ordered", "to_visit"]


def to_visit(
    groups: Groups,
    queue: Queue,
    changed_jobs: list[str],
    jobs: Mapping[str, Job],
    dropped: list[Binding],
    bound: Bound | Mapping[GroupKey, int],
) -> list[tuple[SortKey, GroupKey]]:
    """The groups this pass may place into, in placement order (job sort key, then
    the group's place in its job): those left incomplete by the last pass, those of
    changed jobs and those that lost a binding now, less the ones fully bound. A
    walk over every job in order would place into exactly these, in this order.

    The last pass's incomplete groups come already ordered (``queue.order``): only
    the groups of changed jobs (whose order may have moved) and those that lost a
    binding are placed among them, so a pass behind a big backlog does not sort the
    whole backlog again."""

    def wanting(keys: Iterable[GroupKey]) -> list[GroupKey]:
        """Those of ``keys`` with fewer bindings than replicas desired."""
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
            if (entry := groups.get(key)) is not None
            and bound.get(key, 0) < entry.spec.scaling.desired
        ]

    carried, last = queue.order, queue.incomplete
    kept: list[tuple[GroupOrder, GroupKey]]
    if carried is None or last is None:
        # every group a key (after a continue-as-new): the fully bound ones leave
        # before any is ordered, so a new run's first pass sorts only the incomplete
        keys = set(groups) if last is None else set(last)
        if last is not None:
            keys.update((j, g.name) for j in changed_jobs if j in jobs for g in jobs[j].groups)
            keys.update((b.job, b.group) for b in dropped)
        kept = [(o, k) for k in wanting(keys) if (o := _order(groups, k)) is not None]
    else:
        # The carried groups were incomplete when the last pass ended, and only a
        # pass binds: they still are, unless their job changed (then it is ordered
        # again like any new key). Only the new keys are looked at, not the backlog.
        moved = set(changed_jobs)
        kept = [e for e in carried if e[1][0] not in moved] if moved else list(carried)
        extra = {(j, g.name) for j in changed_jobs if j in jobs for g in jobs[j].groups}
        extra.update((b.job, b.group) for b in dropped if (b.job, b.group) not in last)
        kept.extend(
            (o, key) for key in wanting(sorted(extra)) if (o := _order(groups, key)) is not None
        )
    kept.sort()  # the carried part is in order already: a merge, not a sort
    queue.visiting = kept  # for ordered(), at the end of the pass
    return [(order[0], key) for order, key in kept]


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
) -> set[GroupKey]:
    """The groups among ``keys`` with fewer bindings than replicas desired."""
    out = set()
    for key in keys:
        entry = groups.get(key)
        if entry is not None and len(by_group.get(key) or ()) < entry.spec.scaling.desired:
            out.add(key)
    return out
