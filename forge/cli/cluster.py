"""``forge cluster start``, ``forge status`` and ``forge explain``: the cluster as
a whole. Status and explain read what the last pass published to the store, never
by querying the workflow (see docs/architecture.md, "Rules for workflow code", on
queries)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, cast

import click

from forge import render
from forge.cli.params import store_option, temporal_options
from forge.cli.remote import (
    connect_client,
    open_existing_store,
    print_json,
    remote,
    remote_reader,
    settings,
    web_ui_hint,
)
from forge.errors import InvalidInput, NotFound

if TYPE_CHECKING:
    from temporalio.service import ServiceClient

    from forge.client.client import ForgeClient
    from forge.client.status_rows import Rows
    from forge.settings import Settings
    from forge.wire.contract import AssignmentView, StatusView
    from forge.wire.views import NodeUsage

__all__ = ["COMMANDS", "cluster", "explain", "status"]


@click.group(subcommand_metavar="COMMAND", short_help="manage the cluster workflow")
def cluster() -> None:
    pass


@cluster.command(
    short_help="start the cluster workflow if needed",
    help=(
        "Start the cluster workflow if it is not running. The preemption flags set the "
        "options it starts with (it carries them through continue-as-new); a cluster "
        "already running keeps its own, so giving them then is an error. Any other "
        "command that starts the cluster starts it with the defaults."
    ),
)
@temporal_options
@click.option(
    "--preemption/--no-preemption",
    default=None,
    help="a replica that fits nowhere may evict lower-priority replicas [on]",
)
@click.option(
    "--min-gap",
    type=click.IntRange(1, 99),
    default=None,
    help="priority points a victim is below its preemptor [10]",
)
@click.option(
    "--preemption-cooldown",
    type=click.FloatRange(0, 7 * 24 * 3600),
    default=None,
    metavar="SECONDS",
    help="a preempted replica is not preempted again for this long [600]",
)
def start(
    connect_timeout: float,
    preemption: bool | None,
    min_gap: int | None,
    preemption_cooldown: float | None,
    **flags: str | None,
) -> int:
    s = settings(**flags)
    chosen = {
        "preemption": preemption,
        "min_gap": min_gap,
        "preemption_cooldown": preemption_cooldown,
    }
    chosen = {k: v for k, v in chosen.items() if v is not None}

    async def action(fc: ForgeClient) -> int:
        if chosen:
            if await _running(fc):
                raise InvalidInput(
                    f"cluster {fc.cluster} is running with the options it was started "
                    f"with; the options given ({', '.join(_flag(k) for k in chosen)}) apply "
                    "only when this command starts it"
                )
            fc.options = fc.options.model_copy(
                update={"reconcile": fc.options.reconcile.model_copy(update=chosen)}
            )
        run_id = await fc.start()
        print(f"cluster {fc.cluster}: workflow {fc.workflow_id} running (run {run_id})")
        print(web_ui_hint(s))
        return 0

    return remote(s, connect_timeout, action)


def _flag(option: str) -> str:
    return "--" + option.replace("_", "-")


async def _running(fc: ForgeClient) -> bool:
    """Is the cluster workflow running now?"""
    from temporalio.client import WorkflowExecutionStatus
    from temporalio.service import RPCError, RPCStatusCode

    try:
        desc = await fc.handle().describe()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return False
        raise
    return desc.status == WorkflowExecutionStatus.RUNNING


@click.command(
    short_help="show counts, nodes and pending replicas",
    help=(
        "Show the cluster's summary, nodes and pending replicas grouped by reason, as "
        "the last pass published them: read from the store the worker persists to, "
        "never by querying the workflow. Where node agents run, each node also shows "
        "what its replicas use (their latest usage reports) and their ports.\n\n"
        "--json prints one object: {summary: {desired, bound, pending, ...}, nodes: "
        "[{id, state, cpu: {capacity, allocated}, memory: {capacity, allocated}, gpus: "
        "{total, allocated}, usage (with agents): {cpu, memory, reporting, ports: "
        "[{workload_id, name, port}]}}], assignments: [{workload_id, node, gpu_ids, status}], "
        "pending: [{workload_id, reasons}], queues: [{spec, usage, bound, queued}]}. "
        "Units: millicores, MiB; a queue's gpu usage in milli-devices."
    ),
)
@temporal_options
@store_option
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
@click.option("-a", "--assignments", is_flag=True, help="also list every binding (human output)")
def status(as_json: bool, assignments: bool, connect_timeout: float, **flags: str | None) -> int:
    s = settings(**flags)

    async def action(service: ServiceClient) -> int:
        from forge.client import probe
        from forge.wire.names import workflow_id

        # describe() (is it running, is its workflow task failing?) while the store
        # is read: every binding once, for the nodes, the usage and the listing
        described = asyncio.ensure_future(probe.probe(service, s.namespace, workflow_id(s.cluster)))
        try:
            listed = as_json or assignments
            read, usage, found = await asyncio.to_thread(_read, s.store_url, s.cluster, listed)
        finally:
            if not described.done():
                await asyncio.wait([described])
        seen = described.result()  # raises if there is no such workflow
        notices = [await _stuck(s, connect_timeout)] if seen.maybe_stuck else []
        view = _with_notices(read, [n for n in notices if n])
        if as_json:
            print_json(render.status_json(view, found, usage))
            return 0
        print(render.status_text(s.cluster, view, usage))
        if assignments:
            rows = [(a.workload_id, a.node, ",".join(a.gpu_ids) or "-", a.status) for a in found]
            print()
            print(render.table(("WORKLOAD", "NODE", "GPUS", "STATUS"), rows))
        return 0

    return remote_reader(s, connect_timeout, action)


def _read(
    url: str, cluster: str, listed: bool
) -> tuple[StatusView | Rows, dict[str, NodeUsage], list[AssignmentView]]:
    """The status, per-node usage and every binding (``listed``: needed): from an
    SQLite store's rows without building models when it can
    (:mod:`forge.client.status_rows`, the same output at a fraction of the imports),
    else through the store."""
    from forge.client import status_rows

    rows = status_rows.read(url, cluster, bindings=listed)
    if rows is not None:  # the bindings have the attributes of AssignmentView
        return rows, {}, cast("list[AssignmentView]", rows.assignments)
    from forge.client import reads

    store = open_existing_store(url)
    try:
        found = reads.all_assignments(store, cluster)
        view = reads.status(store, cluster, found)
        return view, reads.node_usage(store, cluster, found), reads.assignment_views(found)
    finally:
        store.close()


def _with_notices(view: StatusView | Rows, notices: list[str]) -> StatusView:
    """``view`` with ``notices`` first; a :class:`~forge.client.status_rows.Rows`
    has the attributes the renderers read, so it renders as a ``StatusView``."""
    from forge.client.status_rows import Rows

    if isinstance(view, Rows):
        view.notices = [*notices, *view.notices]
        return cast("StatusView", view)
    return view.model_copy(update={"notices": [*notices, *view.notices]})


async def _stuck(s: Settings, timeout: float) -> str:
    """The watchdog's diagnosis of a run whose workflow task failed (the full client:
    it reads the run's history), as a notice; empty if it is not stuck after all."""
    from forge.client import watchdog
    from forge.wire.contract import workflow_id

    client = await connect_client(s, timeout)
    stuck = await watchdog.diagnose(client, workflow_id(s.cluster))
    return stuck.line if stuck is not None else ""


@click.command(short_help="why a replica is where it is, or not placed (reads the store)")
@click.argument("workload_id", metavar="WORKLOAD_ID")
@temporal_options
@store_option
def explain(workload_id: str, connect_timeout: float, **flags: str | None) -> int:
    """Why a replica is where it is, or not placed (reads the store).

    WORKLOAD_ID is job/group/ordinal, e.g. web/api/0; one that is not a desired
    replica of any job exits 1."""

    async def action(fc: ForgeClient) -> int:
        explained = await fc.explain(workload_id)
        if explained.state == "unknown":  # no job, group or ordinal by that name
            raise NotFound(f"{workload_id}: {'; '.join(explained.reasons)}")
        print(render.explain_text(explained))
        return 0

    return remote(settings(**flags), connect_timeout, action, reads_store=True)


COMMANDS = [cluster, status, explain]
