"""One object per distinct task group spec, shared by every job that has it.

A cluster of 50,000 single-group jobs of 30 request shapes holds 30 distinct group
specs. Kept apart, each job carries its own copy (a group, its tasks, resources,
GPU request, policies: a dozen objects the cyclic collector tracks, and the version
digest and request computed again per copy); shared, a job is its own small record
and a tuple. Equal specs are equal models, so sharing changes no decision.
"""

from __future__ import annotations

from forge.core.models import Job, TaskGroup

__all__ = ["MAX_SHARED", "SharedGroups"]

#: Distinct specs kept at most: past this, a new spec is kept as it came (jobs that
#: each have a spec of their own gain nothing from a table of them).
MAX_SHARED = 4096


class SharedGroups:
    """Interns task groups by their JSON: ``share(job)`` returns the job with each
    group replaced by the first equal group seen (the job itself when nothing
    changes)."""

    __slots__ = ("_by_json", "_kept", "limit")

    def __init__(self, limit: int = MAX_SHARED) -> None:
        self._by_json: dict[str, TaskGroup] = {}
        # the kept groups by identity: a group that is already the shared one
        # answers without a dump (the table holds it, so its id stays its own)
        self._kept: dict[int, TaskGroup] = {}
        self.limit = limit

    def __len__(self) -> int:
        return len(self._by_json)

    def group(self, g: TaskGroup) -> TaskGroup:
        """The shared group equal to ``g`` (``g`` itself when it is the first)."""
        if self._kept.get(id(g)) is g:
            return g
        key = g.model_dump_json()
        same = self._by_json.get(key)
        if same is None:
            if len(self._by_json) < self.limit:
                self._by_json[key] = g
                self._kept[id(g)] = g
            same = g
        return same

    def share(self, job: Job) -> Job:
        shared = tuple(self.group(g) for g in job.groups)
        changed = any(a is not b for a, b in zip(shared, job.groups, strict=True))
        return job.model_copy(update={"groups": shared}) if changed else job
