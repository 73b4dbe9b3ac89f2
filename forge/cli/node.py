"""``forge node``: add, remove, drain nodes; report loss and heartbeats."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import click

from forge.cli.params import (
    GPU,
    LABEL,
    NAME,
    NAME_HELP,
    Checked,
    cluster_option,
    nonnegative_int,
    store_option,
    temporal_options,
)
from forge.cli.remote import open_existing_store, remote, settings, store_call
from forge.loaders import GPU_MEMORY_MIB, load_nodes
from forge.params import node_from_flags

if TYPE_CHECKING:
    from forge.client.client import ForgeClient

__all__ = ["COMMANDS", "node"]


@click.group(
    subcommand_metavar="COMMAND",
    short_help="add, remove, drain nodes; report loss and heartbeats",
)
def node() -> None:
    pass


@node.command(
    short_help="register nodes: one from flags, or many from --file",
    help=(
        "Register one node from flags (--id, --cpu, --memory, optional --gpu and "
        "--label), or the nodes of a file (--file: YAML/JSON list or the Alibaba node "
        "CSV). Nodes are signalled in batches; the next pass places onto them."
    ),
)
@click.option("--file", metavar="FILE", help="node file (YAML, JSON or trace CSV)")
@click.option("--id", "node_id", type=NAME, help=f"node id ({NAME_HELP})")
@click.option("--cpu", type=Checked(nonnegative_int, "MILLICORES"))
@click.option("--memory", type=Checked(nonnegative_int, "MIB"))
@click.option(
    "--gpu",
    "gpus",
    type=GPU,
    multiple=True,
    help="one GPU device per use (ids gpu0, gpu1, ...); MODEL alone for known models "
    f"({', '.join(sorted(GPU_MEMORY_MIB))})",
)
@click.option("--label", "labels", type=LABEL, multiple=True, help="node label")
@temporal_options
def add(
    file: str | None,
    node_id: str | None,
    cpu: int | None,
    memory: int | None,
    gpus: Sequence[tuple[str, int]],
    labels: Sequence[tuple[str, str]],
    connect_timeout: float,
    **flags: str | None,
) -> int:
    if file is not None:
        if node_id is not None or cpu is not None or memory is not None or gpus or labels:
            raise click.UsageError(
                "--file cannot be combined with --id/--cpu/--memory/--gpu/--label"
            )
        nodes = load_nodes(file)
    elif node_id is None or cpu is None or memory is None:
        raise click.UsageError("give --file FILE, or --id, --cpu and --memory")
    else:
        nodes = [node_from_flags(node_id, cpu, memory, gpus, labels)]

    async def action(fc: ForgeClient) -> int:
        count = await fc.register_nodes(nodes)
        what = nodes[0].id if count == 1 else f"{count:,} nodes"
        print(f"registered {what} in cluster {fc.cluster} (placed onto from the next pass)")
        return 0

    return remote(settings(**flags), connect_timeout, action)


def _signal_command(
    name: str, short_help: str, verb: Callable[[ForgeClient, str], Awaitable[str]]
) -> click.Command:
    """``forge node NAME ID``: one call on the client, one line of output."""

    @node.command(name, short_help=short_help)
    @click.argument("node_id", metavar="ID", type=NAME)
    @temporal_options
    def command(node_id: str, connect_timeout: float, **flags: str | None) -> int:
        async def action(fc: ForgeClient) -> int:
            print(f"node {node_id}: {await verb(fc, node_id)}")
            return 0

        return remote(settings(**flags), connect_timeout, action)

    return command


async def _remove(fc: ForgeClient, node_id: str) -> str:
    await fc.remove_node(node_id)
    return "removal signalled; its replicas move on the next pass"


async def _lost(fc: ForgeClient, node_id: str) -> str:
    await fc.node_lost(node_id)
    return "reported lost; its replicas move on the next pass"


async def _drain(fc: ForgeClient, node_id: str) -> str:
    moved = await fc.drain_node(node_id)
    return f"draining; {moved} replicas moving off it"


_signal_command("remove", "unregister a node (its replicas move)", _remove)
_signal_command("lost", "report a node lost (its replicas move now)", _lost)
_signal_command("drain", "drain a node and wait for the pass that moves its replicas", _drain)


@node.command(
    short_help="record a node heartbeat in the store",
    help=(
        "Write a heartbeat for node ID straight into the store (not a signal: "
        "heartbeats are high-rate traffic, read in batches by the workflow's watch)."
    ),
)
@click.argument("node_id", metavar="ID", type=NAME)
@store_option
@cluster_option
def heartbeat(node_id: str, store: str | None, cluster: str | None) -> int:
    s = settings(store=store, cluster=cluster)
    url = s.store_url
    opened = open_existing_store(url)
    now = time.time()
    try:
        store_call(lambda: opened.heartbeat(s.cluster, node_id, now), url)
    finally:
        opened.close()
    stamp = datetime.fromtimestamp(now, UTC).isoformat(timespec="seconds")
    print(f"heartbeat: node {node_id} in cluster {s.cluster} at {stamp}")
    return 0


COMMANDS = [node]
