"""Waiting for batch jobs to finish, for every caller (``forge job run
--wait-finished``, the Python client): one polling rule, one exit-code rule.

The loop publishes no events to wait on; a finished job is read, not heard. Each
read is one job's state (:meth:`ForgeClient.job_state`: the store's record, or the
``job_state`` query without a store), so the cost is the jobs waited for, not the
cluster.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING

from forge.errors import Unavailable

if TYPE_CHECKING:  # the CLI imports this for its exit codes alone
    from forge.wire.contract import JobState

__all__ = ["FINISHED", "POLL", "QUERY_TIMEOUT", "TIMED_OUT", "exit_code", "wait_finished"]

#: The states a batch job ends in.
FINISHED = ("complete", "failed")
#: The exit code of a wait that timed out (as timeout(1)'s).
TIMED_OUT = 124
#: Seconds between two reads of a job's state.
POLL = 0.5
#: How long one ``job_state`` query may take: one sent while the run's workflow task
#: ends it (a continue-as-new) is never answered, and the next goes to the new run.
QUERY_TIMEOUT = timedelta(seconds=5)


async def wait_finished(
    read: Callable[[str], Awaitable[JobState]],
    job_ids: Sequence[str],
    *,
    timeout: float | None = None,
    poll: float = POLL,
    clock: Callable[[], float] = time.monotonic,
) -> dict[str, JobState]:
    """Each job's state once every one has finished (complete or failed), or when
    ``timeout`` seconds passed first (those still running say ``running``). A
    finished job is not read again. A service job finishes never: it is returned
    at once as it is (``state: service``), for the caller to refuse. A read that
    finds Forge unavailable (a new run loading its state, a worker taking the run
    over, the store down) is tried again next round; any other error ends the wait."""
    deadline = None if timeout is None else clock() + timeout
    last: dict[str, JobState] = {}
    missed: dict[str, Unavailable] = {}
    while True:
        for job_id in job_ids:
            if job_id not in last or last[job_id].state == "running":
                try:
                    last[job_id] = await read(job_id)
                except Unavailable as err:  # a run loading, a worker taking over
                    missed[job_id] = err  # asked again next round
        if len(last) == len(job_ids) and all(s.state != "running" for s in last.values()):
            return last
        if deadline is not None and clock() >= deadline:
            for job_id in job_ids:
                if job_id not in last:
                    raise missed[job_id]  # never read: no state to return
            return last
        await asyncio.sleep(poll)  # polling: the loop publishes no events


def exit_code(states: Sequence[JobState]) -> int:
    """A pipeline's verdict on finished jobs: 0 every one complete, 1 one failed,
    ``TIMED_OUT`` one still running (a failure outranks a timeout: it is final)."""
    if any(s.state == "failed" for s in states):
        return 1
    if any(s.state == "running" for s in states):
        return TIMED_OUT
    return 0
