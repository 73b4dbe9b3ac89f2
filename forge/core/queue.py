"""The placement queue of a pass: which groups it looks at, and in what order,
without walking every job.

A pass places in priority order, then jobs asking GPUs first,
then job id, group order. Walking and sorting every job each pass costs what the
cluster holds, not what changed: at 50,000 jobs that was ~0.3 s of every pass (a
sort, a group index rebuilt, one look at each fully bound group), uncounted by the
work budget. A :class:`Queue` carried from pass to pass keeps instead:

* ``incomplete``: the groups that had unbound replicas when the last pass ended
  (None: not known yet, every group is looked at once);
* ``asking``: the sort keys of the jobs that ask GPUs, sorted, so the last of them
  (where the GPU reservation may be lifted) is known without a scan;
* ``desired``: the replicas all jobs want.

A pass looks at the incomplete groups, the groups of the jobs that changed and
those that lost a binding, sorted by :func:`sort_key`: the same groups in the same
order as a walk over every job would place into (the others are fully bound and a
walk skips them), so the plans are the same (tests/core/test_queue.py).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from forge.core.models import Job

__all__ = ["GroupOrder", "Parked", "Queue", "SortKey", "asks_gpu", "sort_key"]

#: (-priority, not asks GPUs, job id): placement order.
SortKey = tuple[int, bool, str]


def asks_gpu(job: Job) -> bool:
    return any(g.request().gpu for g in job.groups)


def sort_key(job: Job) -> SortKey:
    """Where a job is placed: higher priority first; within one priority jobs that
    ask GPUs first, since they can only use GPU nodes and work without GPUs then
    fills what they leave; then by id."""
    return (-job.priority, not asks_gpu(job), job.id)


#: A group's place in the placement order: its job's sort key, its index in the job.
GroupOrder = tuple[SortKey, int]


E = TypeVar("E")


@dataclass(slots=True, frozen=True)
class Parked(Generic[E]):
    """A group whose every unbound replica waited out a delay in the last pass that
    walked it, with the entries it left (``forge.core.placing``). While none of it
    changed (the same group object, bound count and entries, nothing of it just
    failed, no delay over, no freed capacity for a backoff) a pass takes the entries
    whole instead of walking the replicas again: at 10,000 nodes / 300,000 replicas
    ~29,000 GPU replicas that fit nowhere head the placement order, and walking them
    was ~40% of every pass's placement time."""

    group: object  # the group entry recorded for, compared by identity
    bound: int
    until: float  # the earliest delay's end
    backoff: bool  # some entry is a backoff (freed capacity retries those)
    entries: dict[str, E]  # in ordinal order, as the walk left them


@dataclass(slots=True)
class Queue:
    asking: list[SortKey]
    desired: int
    incomplete: set[tuple[str, str]] | None = None
    #: ``incomplete`` in placement order with each group's order, as the last pass
    #: left it (None: not known, sort them): a pass that defers most of a big
    #: submission sorts only what changed into it, not every waiting group again.
    order: list[tuple[GroupOrder, tuple[str, str]]] | None = None
    #: what this pass visits, in order (to_visit), for the next ``order``
    visiting: list[tuple[GroupOrder, tuple[str, str]]] = field(default_factory=list)
    #: groups whose replicas all wait, as the last pass left them (see ``Parked``)
    parked: dict[tuple[str, str], Parked[Any]] = field(default_factory=dict)

    @classmethod
    def build(cls, jobs: Mapping[str, Job]) -> Queue:
        asking = sorted(sort_key(j) for j in jobs.values() if asks_gpu(j))
        desired = sum(g.scaling.desired for j in jobs.values() for g in j.groups)
        return cls(asking, desired)

    def update(
        self, changed: Iterable[str], old: Mapping[str, Job], new: Mapping[str, Job]
    ) -> None:
        """Account the jobs in ``changed`` going from ``old`` to ``new``."""
        for job_id in changed:
            before, after = old.get(job_id), new.get(job_id)
            if before is not None:
                self.desired -= sum(g.scaling.desired for g in before.groups)
                if asks_gpu(before):
                    key = sort_key(before)
                    i = bisect.bisect_left(self.asking, key)
                    if i < len(self.asking) and self.asking[i] == key:
                        del self.asking[i]
            if after is not None:
                self.desired += sum(g.scaling.desired for g in after.groups)
                if asks_gpu(after):
                    bisect.insort(self.asking, sort_key(after))

    def last_asking(self) -> SortKey | None:
        """The sort key of the last job in placement order that asks GPUs."""
        return self.asking[-1] if self.asking else None
