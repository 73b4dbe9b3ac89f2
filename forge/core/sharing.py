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

    __slots__ = ("_by_json", "limit")

    def __init__(self, limit: int = MAX_SHARED) -> None:
        self._by_json: dict[str, TaskGroup] = {}
        self.limit = limit

    def __len__(self) -> int:
        return len(self._by_json)

    def share(self, job: Job) -> Job:
        table = self._by_json
        shared: list[TaskGroup] = []
        changed = False
        for g in job.groups:
            key = g.model_dump_json()
            same = table.get(key)
            if same is None:
                if len(table) < self.limit:
                    table[key] = g
                same = g
            changed |= same is not g
            shared.append(same)
        return job.model_copy(update={"groups": tuple(shared)}) if changed else job
