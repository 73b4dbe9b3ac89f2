"""``forge queue``: declare the cluster's queues and their quotas, and see their usage."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from forge.cli.params import NAME, temporal_options
from forge.cli.remote import print_json, remote, settings
from forge.loaders import load_queues

if TYPE_CHECKING:
    from forge.client.client import ForgeClient

__all__ = ["COMMANDS", "queue"]


@click.group(subcommand_metavar="COMMAND", short_help="declare queues and quotas; show their usage")
def queue() -> None:
    pass


@queue.command(
    short_help="create or replace the queues of a file",
    help=(
        "Create or replace every queue of FILE (YAML or JSON, `queues: [...]`), all or "
        "nothing, through the cluster workflow; returns after the pass that admits with "
        "them. A job names its queue with `queue: NAME` (default: no quota)."
    ),
)
@click.argument("file", metavar="FILE")
@click.option("--json", "as_json", is_flag=True, help="print the queues after, as JSON")
@temporal_options
def apply(file: str, as_json: bool, connect_timeout: float, **flags: str | None) -> int:
    specs = load_queues(file)

    async def action(fc: ForgeClient) -> int:
        from forge import queue_text
        from forge.client.queues import apply_queues

        view = await apply_queues(fc, specs)
        if as_json:
            print_json(view.model_dump(mode="json"))
        else:
            print(f"applied {len(specs)} queue(s) in cluster {fc.cluster}")
            print(queue_text.table(view.queues))
        return 0

    return remote(settings(**flags), connect_timeout, action)


@queue.command(short_help="remove a queue (refused while a job names it)")
@click.argument("name", metavar="NAME", type=NAME)
@temporal_options
def delete(name: str, connect_timeout: float, **flags: str | None) -> int:
    async def action(fc: ForgeClient) -> int:
        from forge.client.queues import apply_queues

        await apply_queues(fc, (), (name,))
        print(f"queue {name} removed from cluster {fc.cluster}")
        return 0

    return remote(settings(**flags), connect_timeout, action)


@queue.command(
    name="list",
    short_help="each queue's quota, usage and waiting replicas (from the store)",
)
@click.option("--json", "as_json", is_flag=True, help="print a JSON object")
@temporal_options
def list_(as_json: bool, connect_timeout: float, **flags: str | None) -> int:
    async def action(fc: ForgeClient) -> int:
        from forge import queue_text
        from forge.client.queues import read_queues

        view = await read_queues(fc)
        if as_json:
            print_json(view.model_dump(mode="json"))
        elif not view.queues:
            print(f"no queues in cluster {fc.cluster} (every job is in 'default': no quota)")
        else:
            print(queue_text.table(view.queues))
        return 0

    return remote(settings(**flags), connect_timeout, action, reads_store=True)


@queue.command(short_help="one queue: its quota, usage, borrowed and lent (from the store)")
@click.argument("name", metavar="NAME", type=NAME)
@click.option("--json", "as_json", is_flag=True, help="print a JSON object")
@temporal_options
def show(name: str, as_json: bool, connect_timeout: float, **flags: str | None) -> int:
    async def action(fc: ForgeClient) -> int:
        from forge import queue_text
        from forge.client.queues import read_queues
        from forge.errors import NotFound

        found = [v for v in (await read_queues(fc)).queues if v.spec.name == name]
        if not found:
            raise NotFound(f"no queue {name!r} in cluster {fc.cluster} (forge queue list)")
        if as_json:
            print_json(found[0].model_dump(mode="json"))
        else:
            print(queue_text.detail(found[0]))
        return 0

    return remote(settings(**flags), connect_timeout, action, reads_store=True)


COMMANDS = [queue]
