"""Group versions: what changed between two task specs of a group, as words.

A group's version is ``TaskGroup.version`` (a digest of its tasks: what a replica
runs). The store numbers versions per group as they are accepted
(``Store.group_versions``); this module says what a new one changed, for
``forge job history``, and builds the group a revert submits. Pure: no I/O.
"""

from __future__ import annotations

from forge.core.models import Job, TaskGroup

__all__ = ["describe_change", "with_tasks_of"]

_TASK_FIELDS = ("command", "args", "env", "resources", "ports", "stop_grace")


def describe_change(old: TaskGroup | None, new: TaskGroup) -> str:
    """``"initial"``, or what differs, e.g. ``"api: env; worker: added"``."""
    if old is None:
        return "initial"
    before = {t.name: t for t in old.tasks}
    after = {t.name: t for t in new.tasks}
    parts: list[str] = []
    for name in sorted(before.keys() | after.keys()):
        a, b = before.get(name), after.get(name)
        if a is None:
            parts.append(f"{name}: added")
        elif b is None:
            parts.append(f"{name}: removed")
        else:
            fields = [f for f in _TASK_FIELDS if getattr(a, f) != getattr(b, f)]
            extra = sorted(set(type(b).model_fields) - set(_TASK_FIELDS) - {"name"})
            fields += [f for f in extra if getattr(a, f) != getattr(b, f)]
            if fields:
                parts.append(f"{name}: {', '.join(fields)}")
    return "; ".join(parts) or "tasks reordered"


def with_tasks_of(job: Job, group: str, spec: TaskGroup) -> Job:
    """``job`` with ``group``'s tasks replaced by ``spec``'s (a revert: scaling and
    policies stay as they are now). ``KeyError`` if the job has no such group."""
    if job.group(group) is None:
        raise KeyError(group)
    groups = tuple(
        g.model_copy(update={"tasks": spec.tasks}) if g.name == group else g for g in job.groups
    )
    return Job.model_validate(job.model_copy(update={"groups": groups}).model_dump())
