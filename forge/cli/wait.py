"""``forge job wait``: block until a batch job finishes, for pipelines (a Makefile,
a CI step, an Airflow task) that need the exit code rather than a dashboard."""

from __future__ import annotations

import time

import click

from forge.cli.params import NAME, cluster_option, store_option
from forge.cli.remote import open_existing_store, settings, store_call
from forge.client.finish import POLL, TIMED_OUT
from forge.errors import InvalidInput, NotFound

__all__ = ["wait"]


@click.command(
    short_help="wait for a batch job to finish (0 complete, 1 failed, 124 timed out)",
    help=(
        "Wait until batch job JOB has every run complete (exit 0) or has failed for "
        "good, a run's reschedule attempts exhausted (exit 1, with the run and why), "
        "reading the store the worker persists to; --timeout S gives up after S "
        "seconds (exit 124)."
    ),
)
@click.argument("job_id", metavar="JOB", type=NAME)
@click.option("--timeout", type=click.FloatRange(min=0), default=None, help="seconds")
@store_option
@cluster_option
def wait(job_id: str, timeout: float | None, store: str | None, cluster: str | None) -> int:
    from forge.client.reads import batch_state

    s = settings(store=store, cluster=cluster)
    url = s.store_url
    opened = open_existing_store(url)
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        while True:
            found = store_call(lambda: batch_state(opened, s.cluster, job_id), url)
            if found is None:
                raise NotFound(f"no job {job_id!r} in cluster {s.cluster}")
            state, what = found
            if state == "service":
                raise InvalidInput(f"{what}; forge job wait waits for batch jobs (type: batch)")
            if state != "running":
                print(f"{job_id}: {state}: {what}")
                return 0 if state == "complete" else 1
            if deadline is not None and time.monotonic() >= deadline:
                print(f"{job_id}: still running after {timeout:g} s: {what}")
                return TIMED_OUT
            time.sleep(POLL)  # polling the store, the CLI's only view of the loop
    finally:
        opened.close()
