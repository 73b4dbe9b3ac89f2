"""``forge sim fleet``: run a simulated fleet of nodes (:mod:`forge.sim.fleet`)
against a real cluster, for scale runs without machines."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import click

from forge.cli.params import (
    GPU,
    LABEL,
    NAME,
    Checked,
    nonnegative_int,
    positive_float,
    store_option,
    temporal_options,
)
from forge.cli.remote import remote, settings
from forge.params import node_from_flags

if TYPE_CHECKING:
    from forge.client.client import ForgeClient
    from forge.sim.fleet import Fleet
    from forge.stores.base import Store

__all__ = ["sim"]

_SECONDS = Checked(positive_float, "SECONDS")


@click.group(subcommand_metavar="COMMAND", short_help="simulation tools for scale runs")
def sim() -> None:
    pass


@sim.command(
    short_help="register N simulated nodes and act as their agents",
    help=(
        "Register N nodes PREFIX0000 ... with the given capacity, then act as their "
        "agents through the store until interrupted (or --duration): heartbeat, report "
        "each replica bound to them running and, when all its tasks are `sleep S`, "
        "exited 0 after S seconds (anything else runs until its binding goes). "
        "--events FILE writes each start and exit as a JSON line."
    ),
)
@click.option("--nodes", "count", type=Checked(nonnegative_int, "N"), required=True)
@click.option("--prefix", type=NAME, default="sim-", show_default=True, help="node id prefix")
@click.option(
    "--cpu", type=Checked(nonnegative_int, "MILLICORES"), default=32000, show_default=True
)
@click.option("--memory", type=Checked(nonnegative_int, "MIB"), default=131072, show_default=True)
@click.option("--gpu", "gpus", type=GPU, multiple=True, help="one GPU device per use, per node")
@click.option("--label", "labels", type=LABEL, multiple=True, help="a label on every node")
@click.option("--heartbeat-every", type=_SECONDS, default=5.0, show_default=True)
@click.option("--poll-every", type=_SECONDS, default=0.2, show_default=True, help="binding reads")
@click.option("--events", type=click.Path(dir_okay=False), help="JSON lines of starts and exits")
@click.option("--duration", type=_SECONDS, help="stop after this many seconds")
@store_option
@temporal_options
def fleet(
    count: int,
    prefix: str,
    cpu: int,
    memory: int,
    gpus: Sequence[tuple[str, int]],
    labels: Sequence[tuple[str, str]],
    heartbeat_every: float,
    poll_every: float,
    events: str | None,
    duration: float | None,
    connect_timeout: float,
    **flags: str | None,
) -> int:
    from forge.sim.fleet import Fleet

    width = max(4, len(str(max(count - 1, 0))))
    ids = [f"{prefix}{i:0{width}d}" for i in range(count)]
    nodes = [node_from_flags(n, cpu, memory, gpus, labels, source="sim fleet") for n in ids]

    def simulate(store: Store, cluster: str, stop: threading.Event) -> Fleet:
        with contextlib.ExitStack() as files:
            log = files.enter_context(open(events, "a", buffering=1)) if events else None
            sims = Fleet(store, cluster, ids, heartbeat_every, poll_every, events=log)
            sims.run(stop)
        return sims

    async def action(fc: ForgeClient) -> int:
        assert fc.store is not None
        await fc.register_nodes(nodes)
        print(f"fleet: {count:,} nodes registered in cluster {fc.cluster}", flush=True)
        stop = threading.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        if duration is not None:
            loop.call_later(duration, stop.set)
        start = time.monotonic()
        sims = await asyncio.to_thread(simulate, fc.store, fc.cluster, stop)
        print(
            f"fleet: {time.monotonic() - start:.0f} s, {sims.started:,} replicas started, "
            f"{sims.exited:,} exited, {sims.heartbeats:,} heartbeats, "
            f"{sims.errors:,} store errors" + (f" (last: {sims.last_error})" if sims.errors else "")
        )
        each = sims.read_seconds / max(1, sims.reads)
        print(f"fleet: bindings read {sims.reads:,} times, {each * 1000:.0f} ms each")
        return 0

    return remote(settings(**flags), connect_timeout, action, reads_store=True)
