"""How ``forge job run`` sends a file's jobs: batched updates, all at once, with a
progress bar on a terminal."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from forge.core.models import Job

if TYPE_CHECKING:
    from forge.client.client import ForgeClient
    from forge.wire.contract import JobResult

__all__ = ["MANY_JOBS", "submit_all"]

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
