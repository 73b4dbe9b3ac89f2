"""The pass's index of task groups: each job's group with its request, by key.

A pass reads a group's job, spec and request many times per replica; building the
request once per group and indexing by ``(job id, group name)`` keeps that a
dictionary read. :class:`Group` names the three parts (a tuple underneath: as cheap
to build and unpack as one).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NamedTuple

from forge.core.models import Job, Request, TaskGroup

__all__ = [
    "Bound",
    "Group",
    "GroupKey",
    "Groups",
    "groups_of",
    "reschedule_window",
    "still_desired",
    "update_groups",
]

#: ``(job id, group name)``
GroupKey = tuple[str, str]


class Group(NamedTuple):
    """One task group of the pass, with the job it belongs to and its request."""

    job: Job
    spec: TaskGroup
    request: Request


Groups = Mapping[GroupKey, Group]


class Bound:
    """A carried pass's bound count per group, read from the carry's index (which
    the release phase and rollout stops keep current) instead of copied whole."""

    __slots__ = ("by_group",)

    def __init__(self, by_group: Mapping[GroupKey, Mapping[str, None]]) -> None:
        self.by_group = by_group

    def get(self, key: GroupKey, default: int = 0) -> int:
        held = self.by_group.get(key)
        return len(held) if held else default

    def items(self) -> Iterable[tuple[GroupKey, int]]:
        return ((k, len(v)) for k, v in self.by_group.items())


def groups_of(jobs: Mapping[str, Job]) -> dict[GroupKey, Group]:
    return {
        (job.id, g.name): Group(job, g, g.request()) for job in jobs.values() for g in job.groups
    }


def update_groups(
    groups: dict[GroupKey, Group],
    changed: list[str],
    old: Mapping[str, Job],
    new: Mapping[str, Job],
) -> None:
    """Bring a group index (:func:`groups_of`) from ``old`` to ``new`` jobs, which
    differ only in ``changed``, in place. A job whose group names stay keeps its
    entries' places; the others' entries go last (only fgd reads the index's order,
    and it rebuilds it instead)."""
    for job_id in changed:
        before, after = old.get(job_id), new.get(job_id)
        names = [g.name for g in before.groups] if before is not None else []
        if after is None or names != [g.name for g in after.groups]:
            for name in names:
                groups.pop((job_id, name), None)
        if after is not None:
            for g in after.groups:
                groups[(job_id, g.name)] = Group(after, g, g.request())


def still_desired(wid: str, groups: Groups) -> bool:
    """Is replica ``wid`` (job/group/ordinal) within its group's desired count?"""
    job, group, ordinal = wid.rsplit("/", 2)
    entry = groups.get((job, group))
    return entry is not None and int(ordinal) < entry.spec.scaling.desired


def reschedule_window(wid: str, groups: Groups) -> float:
    """The reschedule policy's interval of replica ``wid``'s group (which exists)."""
    job, group, _ = wid.rsplit("/", 2)
    return groups[(job, group)].spec.reschedule.interval
