"""Activity results cut into pages that fit a workflow's history: by count, and by
bytes (a Temporal payload over 2 MiB is refused), with job specs sent compact (each
distinct group once) so a reload of 50,000 jobs is a few round trips.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TypeVar

from pydantic import BaseModel

from forge.core.models import Job, TaskGroup
from forge.wire.activity_contract import JOB_EXTRAS, BindRow, JobRow, JobsPage

__all__ = ["PAGE_BYTES", "compact_specs", "json_len", "row_len", "within_bytes"]

#: JSON bytes one page may carry back to the workflow. Temporal refuses a payload
#: over 2 MiB (and the run then never finishes loading), so a page is cut by size
#: as well as by count: 40 jobs of 100 KiB are two pages, not one 4 MB result.
PAGE_BYTES = 1024 * 1024

_Item = TypeVar("_Item")


def within_bytes(items: list[_Item], size: Callable[[_Item], int], budget: int = PAGE_BYTES) -> int:
    """How many leading ``items`` fit in ``budget`` bytes (at least one: a single
    item is bounded by the models' own limits)."""
    total = 0
    for i, item in enumerate(items):
        total += size(item)
        if total > budget and i:
            return i
    return len(items)


#: The keys of a stored job spec that a compact page row carries beside its groups.
_JOB_KEYS = frozenset(("id", "name", "priority", "groups"))


def compact_specs(
    rows: list[tuple[int, str, str | None]], revision: int, more: bool, budget: int = PAGE_BYTES
) -> JobsPage:
    """Stored job specs as a compact page, parsing each distinct group once: a new
    run reloads every job, and 50,000 jobs of 30 shapes are 30 groups to validate,
    not 50,000 jobs. A spec that is not the plain shape a store writes (another
    key, a group that does not validate) goes through ``Job`` whole, so what the
    page holds what a page of validated jobs would.

    The page is cut at ``budget`` bytes of what it carries (rows and each distinct
    group once), not of the specs it was made from: jobs of a few shapes make
    pages of thousands of rows, so a reload is a few round trips, not dozens."""
    index: dict[str, int] = {}
    groups: list[TaskGroup] = []
    out: list[JobRow] = []
    size = 0
    for rev, job_id, spec in rows:
        if out and size > budget:
            return JobsPage(groups=groups, rows=out, revision=out[-1][0], more=True)
        size += 48 + 2 * len(job_id)  # a row: revision, id, name, priority, indexes
        if spec is None:
            out.append((rev, job_id, None, 0, []))
            continue
        data = json.loads(spec)
        name, priority = data.get("name"), data.get("priority")
        plain = (
            isinstance(data, dict)
            and data.keys() == _JOB_KEYS
            and data.get("id") == job_id
            and isinstance(name, str)
            and type(priority) is int
            and isinstance(data["groups"], list)
        )
        if not plain:
            known = len(groups)
            out.append(_row(rev, job_id, Job.model_validate_json(spec), index, groups))
            size += sum(len(g.model_dump_json()) for g in groups[known:])
            continue
        idx = []
        for g in data["groups"]:
            key = json.dumps(g, separators=(",", ":"))
            at = index.get(key)
            if at is None:
                at = index[key] = len(groups)
                groups.append(TaskGroup.model_validate_json(key))
                size += len(key)
            idx.append(at)
        out.append((rev, job_id, name, priority, idx))
    return JobsPage(groups=groups, rows=out, revision=revision, more=more)


def _row(rev: int, job_id: str, job: Job, index: dict[str, int], groups: list[TaskGroup]) -> JobRow:
    idx = []
    for g in job.groups:
        key = g.model_dump_json()
        at = index.get(key)
        if at is None:
            at = index[key] = len(groups)
            groups.append(g)
        idx.append(at)
    extra = job.model_dump(
        mode="json", include={k for k in JOB_EXTRAS if getattr(job, k) != _DEFAULTS[k]}
    )
    if extra:  # (a row without keeps the shape rows had before these fields)
        return (rev, job_id, job.name, job.priority, idx, extra)
    return (rev, job_id, job.name, job.priority, idx)


_DEFAULTS = {k: Job.model_fields[k].default for k in JOB_EXTRAS}


def json_len(item: BaseModel) -> int:
    return len(item.model_dump_json())


def row_len(row: BindRow) -> int:
    job, group, _, node, gpu_ids, *_ = row
    return 64 + len(job) + len(group) + len(node) + sum(len(g) + 3 for g in gpu_ids)
