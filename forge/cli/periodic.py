"""``forge job run`` / ``stop`` for periodic jobs: a job file's jobs with a
``schedule`` become Temporal Schedules (forge.client.periodic) instead of being
submitted; stopping one removes its schedule."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from forge.core.models import Job

if TYPE_CHECKING:
    from forge.client.client import ForgeClient

__all__ = ["apply_schedules", "remove_schedule", "split"]


def split(jobs: Sequence[Job]) -> tuple[list[Job], list[Job]]:
    """``(jobs to submit, periodic jobs)``, each in file order."""
    return [j for j in jobs if j.schedule is None], [j for j in jobs if j.schedule is not None]


async def apply_schedules(fc: ForgeClient, periodic: Sequence[Job]) -> None:
    for job in periodic:
        print((await fc.apply_schedule(job)).line())


async def remove_schedule(fc: ForgeClient, job_id: str) -> bool:
    """Remove ``job_id``'s schedule if it has one (then it is not a job to stop)."""
    if not await fc.remove_schedule(job_id):
        return False
    print(
        f"{job_id}: schedule removed; instances already submitted ({job_id}-YYYYMMDDHHMMSS) "
        "are jobs of their own: a running one finishes"
    )
    return True
