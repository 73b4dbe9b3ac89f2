"""The ``forge`` command group: global options and the list of nouns.

A noun is a module with a ``COMMANDS`` list (``forge.cli.job``, ``forge.cli.node``
...); adding one (``forge agent``, ``forge logs``) is one line in ``_NOUNS``.
"""

from __future__ import annotations

import click

from forge.cli import agent, cluster, job, node, plan, services, store
from forge.cli.params import verbatim

__all__ = ["forge"]

_NOUNS = (plan, job, node, cluster, store, services, agent)

_EPILOG = """\
environment: FORGE_TEMPORAL_ADDRESS, FORGE_NAMESPACE, FORGE_CLUSTER,
FORGE_TASK_QUEUE (flags win), FORGE_STORE / FORGE_DATA_DIR (the store).
exit codes: 0 ok, 1 failure (no server, RPC error), 2 bad input."""


class _InOrder(click.Group):
    """Lists commands in the order they were added (the order of ``_NOUNS``), so
    help reads from offline planning to running a cluster, not alphabetically."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.commands)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("forge-reconciler")
    except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        return "unknown"


def _print_version(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(f"forge {_version()}")
        ctx.exit()


@click.group(
    "forge",
    cls=_InOrder,
    subcommand_metavar="COMMAND",
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    help="Forge: a durable cluster reconciler (one Temporal workflow per cluster).",
    epilog=verbatim(_EPILOG),
)
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_print_version,
    help="show the version and exit",
)
def forge() -> None:
    pass


for _noun in _NOUNS:
    for _command in _noun.COMMANDS:
        forge.add_command(_command)
