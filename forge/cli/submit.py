"""How ``forge job run`` sends a file's jobs: batched updates, all at once, with a
progress bar on a terminal."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from forge.core.models import Job
from forge.errors import InvalidInput

if TYPE_CHECKING:
    from forge.client.client import ForgeClient
    from forge.wire.contract import JobResult

__all__ = ["MANY_JOBS", "check_waitable", "report_finished", "submit_all"]

#: Above this many jobs, ``job run`` prints a summary instead of a line per job.
MANY_JOBS = 20


async def submit_all(fc: ForgeClient, jobs: Sequence[Job], *, wait: bool) -> list[JobResult]:
    """Submit in batched updates, all at once (``ForgeClient.submit_jobs``: one
    update per ``MAX_JOBS_PER_UPDATE`` jobs, within the server's in-flight limit,
    each answered once stored; with ``wait`` a last one after the pass that plans
    them).

    One update per job would hit Temporal's per-run cap on distinct updates (2,000
    by default) on the Alibaba trace's 8,152 jobs, and cost a workflow round trip
    each. A terminal shows a progress bar as the batches are answered.
    """
    bar = _Progress(len(jobs), enabled=sys.stderr.isatty() and len(jobs) > MANY_JOBS)
    try:
        results = await fc.submit_jobs(jobs, wait=wait, progress=bar.update)
    except BaseException:
        bar.close()
        if bar.done:  # say what did go in: a rerun resubmits them, harmlessly
            print(f"forge: {bar.done:,} of {len(jobs):,} jobs were submitted", file=sys.stderr)
        raise
    bar.close()
    return results


def check_waitable(jobs: Sequence[Job], *, wait_finished: bool, timeout: float | None) -> None:
    """Refuse, before anything is sent, a wait that could never end: a service job
    runs until stopped; a periodic job's instances are waited for one by one."""
    if timeout is not None and not wait_finished:
        raise InvalidInput("--timeout: only with --wait-finished (how long to wait)")
    if not wait_finished:
        return
    if not jobs:
        raise InvalidInput("--wait-finished: the file has no batch job to wait for")
    for job in jobs:
        if job.type != "batch":
            raise InvalidInput(
                f"--wait-finished: job {job.id} is a {job.type} job: it runs until "
                "stopped (wait for batch jobs only)"
            )


async def report_finished(fc: ForgeClient, jobs: Sequence[Job], timeout: float | None) -> int:
    """Wait for the jobs to finish and print each one's end as ``forge job wait``
    does; the pipeline's exit code (:func:`forge.client.finish.exit_code`)."""
    from forge.client.finish import exit_code

    states = await fc.wait_finished([j.id for j in jobs], timeout=timeout)
    for job_id, s in states.items():
        end = s.state if s.state != "running" else f"still running after {timeout or 0:g} s"
        print(f"{job_id}: {end}: {s.what}")
    return exit_code(list(states.values()))


class _Progress:
    """``submitting jobs [#####.....] 4,000/8,152`` on stderr, redrawn in place
    (a terminal only: a pipe or a log file gets nothing)."""

    WIDTH = 30

    def __init__(self, total: int, *, enabled: bool) -> None:
        self.total = total
        self.enabled = enabled
        self.done = 0
        self._drawn = False

    def update(self, done: int) -> None:
        self.done = done
        if not self.enabled:
            return
        filled = self.WIDTH * done // max(1, self.total)
        bar = "#" * filled + "." * (self.WIDTH - filled)
        sys.stderr.write(f"\rsubmitting jobs [{bar}] {done:,}/{self.total:,}")
        sys.stderr.flush()
        self._drawn = True

    def close(self) -> None:
        if self._drawn:  # end the bar's line
            sys.stderr.write("\n")
            sys.stderr.flush()
            self._drawn = False
