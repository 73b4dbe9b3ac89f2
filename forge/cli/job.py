"""``forge job``: validate, run, scale, stop and list jobs."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import click

from forge.cli.params import NAME, Checked, cluster_option, replicas, store_option, temporal_options
from forge.cli.periodic import apply_schedules, remove_schedule, split
from forge.cli.remote import open_existing_store, print_json, remote, safe_url, settings, store_call
from forge.cli.submit import MANY_JOBS, check_waitable, report_finished, submit_all
from forge.cli.wait import wait
from forge.core.models import Assignment, AssignmentStatus, Job
from forge.errors import NotFound
from forge.loaders import load_jobs

if TYPE_CHECKING:
    from forge.client.client import ForgeClient
    from forge.stores.base import GroupVersion
    from forge.wire.contract import RolloutView

__all__ = ["COMMANDS", "MANY_JOBS", "job"]


@click.group(subcommand_metavar="COMMAND", short_help="validate, run, scale, stop and list jobs")
def job() -> None:
    pass


@job.command(short_help="check a job file without submitting it")
@click.argument("file", metavar="FILE")
def validate(file: str) -> int:
    jobs = load_jobs(file)
    replicas = sum(g.scaling.desired for j in jobs for g in j.groups)  # no forge.cli.plan:
    print(f"ok: {len(jobs)} jobs ({replicas} replicas)")  # it loads the whole planner
    return 0


@job.command(
    short_help="submit the jobs of a file (starts the cluster workflow if needed)",
    help=(
        "Submit every job of FILE in batched updates, all sent at once within the "
        "server's in-flight limit (the first by update-with-start: it starts the cluster "
        "workflow if needed), each answered once stored; then, unless --no-wait, wait "
        f"for the pass that plans them (a progress bar on a terminal; a summary above "
        f"{MANY_JOBS} jobs). A job with a schedule becomes a Temporal Schedule instead. "
        "--wait-finished then waits, reading the store, until every batch job of FILE is "
        "complete (exit 0) or one failed (exit 1); --timeout S gives up after S s (124)."
    ),
)
@click.argument("file", metavar="FILE")
@click.option("--no-wait", is_flag=True, help="return once stored, before the pass that plans it")
@click.option("--wait-finished", is_flag=True, help="then wait for its batch jobs to finish")
@click.option(
    "--timeout", type=click.FloatRange(min=0), default=None, help="seconds, with --wait-finished"
)
@store_option
@temporal_options
def run(
    file: str,
    no_wait: bool,
    wait_finished: bool,
    timeout: float | None,
    connect_timeout: float,
    **flags: str | None,
) -> int:
    from forge import render

    jobs, scheduled = split(load_jobs(file))  # before connecting: bad input fails fast
    check_waitable(jobs, wait_finished=wait_finished, timeout=timeout)
    wait = not no_wait

    async def action(fc: ForgeClient) -> int:
        await apply_schedules(fc, scheduled)  # periodic jobs: Temporal Schedules
        if not jobs:
            return 0
        start = time.perf_counter()
        results = await submit_all(fc, jobs, wait=wait)
        seconds = time.perf_counter() - start
        if len(jobs) <= MANY_JOBS:
            for r in results:
                if wait:
                    print(render.job_result_line(r))
                else:
                    print(
                        f"{r.job_id}: submitted (revision {r.revision}; not waiting for placement)"
                    )
        done = (
            f"submitted {len(results):,} job{'s' * (len(results) != 1)}, stored, in {seconds:.1f} s"
        )
        if not wait:
            print(f"{done} (not waiting for placement; see forge status)")
        elif len(jobs) <= MANY_JOBS:
            print(f"{done}, planned")
        else:
            # the batches were answered once stored; the last one after the pass that
            # planned them all: the totals are the cluster's, as that pass published
            s = await fc.summary()
            print(
                f"{done}, planned: cluster {fc.cluster} {s.desired:,} desired, {s.bound:,} "
                f"bound, {s.pending:,} pending (see forge status)"
            )
        return await report_finished(fc, jobs, timeout) if wait_finished else 0

    return remote(settings(**flags), connect_timeout, action, reads_store=wait_finished)


@job.command(short_help="set a group's desired replica count")
@click.argument("job_id", metavar="JOB", type=NAME)
@click.argument("group", metavar="GROUP", type=NAME)
@click.argument("count", metavar="COUNT", type=Checked(replicas))
@temporal_options
def scale(job_id: str, group: str, count: int, connect_timeout: float, **flags: str | None) -> int:
    from forge import render

    async def action(fc: ForgeClient) -> int:
        r = await fc.scale(job_id, group, count)
        print(f"{job_id}/{group} scaled to {count}; {render.job_result_line(r)}")
        return 0

    return remote(settings(**flags), connect_timeout, action)


@job.command(
    short_help="let a rollout go on past its canaries",
    help=(
        "Promote the rollouts of JOB (of one group with --group) that wait for a "
        "promotion: their canaries are healthy and the rest of the group now rolls to "
        "the new version. Refused (exit 2) when no rollout of it waits."
    ),
)
@click.argument("job_id", metavar="JOB", type=NAME)
@click.option("--group", "-g", type=NAME, default=None, help="only this group")
@temporal_options
def promote(job_id: str, group: str | None, connect_timeout: float, **flags: str | None) -> int:
    async def action(fc: ForgeClient) -> int:
        for name in await fc.promote(job_id, group):
            print(f"{name}: promoted; the rollout goes on")
        return 0

    return remote(settings(**flags), connect_timeout, action)


@job.command(
    short_help="roll a job back to an earlier version of its tasks",
    help=(
        "Submit JOB with its groups' tasks as they were at VERSION (a number as "
        "`forge job history` lists it, 3 or v3, or a version digest), read from the "
        "store: a new version that rolls out like any change (scaling and policies stay "
        "as they are). Refused (exit 1, not found) when no group has that version."
    ),
)
@click.argument("job_id", metavar="JOB", type=NAME)
@click.argument("version", metavar="VERSION")
@click.option("--group", "-g", type=NAME, default=None, help="only this group")
@temporal_options
@store_option
def revert(
    job_id: str, version: str, group: str | None, connect_timeout: float, **flags: str | None
) -> int:
    from forge import render

    async def action(fc: ForgeClient) -> int:
        r = await fc.revert(job_id, version, group)
        print(f"{job_id}: reverted to {version}; {render.job_result_line(r)}")
        return 0

    return remote(settings(**flags), connect_timeout, action, reads_store=True)


@job.command(short_help="stop a job (release its replicas)")
@click.argument("job_id", metavar="JOB", type=NAME)
@temporal_options
def stop(job_id: str, connect_timeout: float, **flags: str | None) -> int:
    async def action(fc: ForgeClient) -> int:
        if not await remove_schedule(fc, job_id):
            r = await fc.stop_job(job_id)
            print(f"{r.job_id}: stopped (revision {r.revision})")
        return 0

    return remote(settings(**flags), connect_timeout, action)


@job.command(
    "list",
    short_help="list the jobs of a cluster (reads the store)",
    help=(
        "List the cluster's jobs with desired and bound replica counts, read from the "
        "store the worker persists to (FORGE_STORE, else FORGE_DATA_DIR/forge.db, or "
        "--store): the workflow's status query carries counts, not a job list, and "
        "the store holds exactly what the workflow persisted after each pass."
    ),
)
@store_option
@cluster_option
@click.option("--json", "as_json", is_flag=True, help="print a JSON list")
def list_(store: str | None, cluster: str | None, as_json: bool) -> int:
    from forge import render
    from forge.client.reads import job_list

    s = settings(store=store, cluster=cluster)
    url = s.store_url
    opened = open_existing_store(url)
    try:
        found = store_call(lambda: job_list(opened, s.cluster), url)
    finally:
        opened.close()
    if as_json:
        print_json(found.as_json())
    elif not found.jobs:
        print(f"no jobs in cluster {s.cluster} (store {safe_url(url)})")
    else:
        print(render.jobs_table(found.jobs, found.bound, found.labels()))
    return 0


@job.command(
    short_help="list a job's group versions and what each changed (reads the store)",
    help=(
        "List every accepted version of each group's task spec, numbered per group, "
        "with the version digest the replicas record and what changed, read from the "
        "store the worker persists to."
    ),
)
@click.argument("job_id", type=NAME)
@store_option
@cluster_option
@click.option("--json", "as_json", is_flag=True, help="print a JSON list")
def history(job_id: str, store: str | None, cluster: str | None, as_json: bool) -> int:
    s = settings(store=store, cluster=cluster)
    url = s.store_url
    opened = open_existing_store(url)
    try:
        versions = store_call(lambda: opened.group_versions(s.cluster, job_id), url)
        current = store_call(lambda: opened.get_job(s.cluster, job_id), url)
    finally:
        opened.close()
    live = {g.name: g.version for g in current.groups} if current is not None else {}
    if as_json:
        print_json(
            [
                {
                    "group": v.group,
                    "number": v.number,
                    "version": v.version,
                    "revision": v.revision,
                    "changed": v.changed,
                    "current": live.get(v.group) == v.version,
                }
                for v in versions
            ]
        )
    elif not versions:
        print(f"no versions of job {job_id} in cluster {s.cluster}")
    else:
        for v in versions:
            mark = "*" if live.get(v.group) == v.version else " "
            print(
                f"{mark} {v.group:<16} v{v.number:<4} {v.version}  rev {v.revision:<6} {v.changed}"
            )
    return 0


@job.command(
    short_help="a job's runs: attempts, start, end, exit status, node (reads the store)",
    help=(
        "Each run (replica) of JOB as its agents reported it: where it stands (complete, "
        "running, exited, failed, bound, pending), how many times it started, when its "
        "last attempt started and ended (UTC, the agents' clocks), its exit status and "
        "node; read from the store the worker and the agents write to."
    ),
)
@click.argument("job_id", type=NAME)
@store_option
@cluster_option
@click.option("--json", "as_json", is_flag=True, help="print a JSON list")
def runs(job_id: str, store: str | None, cluster: str | None, as_json: bool) -> int:
    from forge.client import runs as job_runs

    s = settings(store=store, cluster=cluster)
    url = s.store_url
    opened = open_existing_store(url)
    try:
        found = store_call(lambda: opened.get_job(s.cluster, job_id), url)
        if found is None:
            raise NotFound(f"no job {job_id!r} in cluster {s.cluster}")
        got = store_call(lambda: job_runs.read(opened, s.cluster, found), url)
    finally:
        opened.close()
    if as_json:
        print_json(job_runs.as_json(got))
    else:
        print(job_runs.table(got))
    return 0


@job.command(
    "status",
    short_help="a job's groups: replicas per version, the rollout and why it waits",
    help=(
        "For each group of JOB: how many replicas run each version (healthy = "
        "reported running / placed = bound / desired), and its rollout (the phase, the "
        "versions it moves between, why it waits) as the loop last published it; read "
        "from the store the worker persists to."
    ),
)
@click.argument("job_id", metavar="JOB", type=NAME)
@store_option
@cluster_option
@click.option("--json", "as_json", is_flag=True, help="print a JSON document")
def status_(job_id: str, store: str | None, cluster: str | None, as_json: bool) -> int:
    from forge.client import reads

    s = settings(store=store, cluster=cluster)
    url = s.store_url
    opened = open_existing_store(url)
    try:
        current = store_call(lambda: opened.get_job(s.cluster, job_id), url)
        versions = store_call(lambda: opened.group_versions(s.cluster, job_id), url)
        bound = [a for a in store_call(lambda: reads.all_assignments(opened, s.cluster), url)]
        doc = store_call(lambda: reads.published(opened, s.cluster), url)
    finally:
        opened.close()
    if current is None:
        raise NotFound(f"no job {job_id!r} in cluster {s.cluster}")
    rollouts = {r.group: r for r in doc.rollouts} if doc is not None else {}
    groups = [
        _group_status(current, g.name, versions, bound, rollouts.get(f"{job_id}/{g.name}"))
        for g in current.groups
    ]
    if as_json:
        print_json({"job": job_id, "groups": groups})
        return 0
    for g in groups:
        number = f"v{g['number']}" if g["number"] else "?"
        print(f"{job_id}/{g['group']}: desired {g['desired']}, version {number} ({g['version']})")
        for v in g["versions"]:
            label = f"v{v['number']}" if v["number"] else "unversioned"
            mark = "*" if v["current"] else " "
            print(
                f"  {mark} {label:<12} {v['version'] or '-':<18} healthy {v['healthy']} / "
                f"placed {v['placed']} / desired {v['desired']}"
            )
        r = g["rollout"]
        if r is None:
            print("  no rollout")
        else:
            promoted = ", promoted" if r["promoted"] else ""
            print(f"  rollout: {r['phase']} to {r['version']} from {r['previous']}{promoted}")
            if r["waiting"]:
                print(f"  waiting: {r['waiting']}")
    return 0


def _group_status(
    job: Job,
    group: str,
    versions: Sequence[GroupVersion],
    bound: Sequence[Assignment],
    rollout: RolloutView | None,
) -> dict[str, Any]:
    """One group's replicas per version and its rollout, as plain data (the JSON)."""
    g = job.group(group)
    assert g is not None
    numbers = {v.version: v.number for v in versions if v.group == group}  # the latest wins
    mine = [a for a in bound if a.group == group]
    seen = sorted({a.version for a in mine} | {g.version}, key=lambda v: (numbers.get(v, 0), v))
    rows = []
    for v in seen:
        on = [a for a in mine if a.version == v]
        rows.append(
            {
                "version": v,
                "number": numbers.get(v, 0),
                "healthy": sum(a.status is AssignmentStatus.RUNNING for a in on),
                "placed": len(on),
                "desired": g.scaling.desired if v == g.version else 0,
                "current": v == g.version,
            }
        )
    return {
        "group": group,
        "desired": g.scaling.desired,
        "version": g.version,
        "number": numbers.get(g.version, 0),
        "versions": rows,
        "rollout": rollout.model_dump(mode="json") if rollout is not None else None,
    }


job.add_command(wait)
COMMANDS = [job]
