"""The ``forge`` command group: global options and the table of commands.

The root imports no noun: each command lives in its module (``forge.cli.job``,
``forge.cli.node`` ...) and is imported only when it runs (or its own ``--help`` is
asked for), so ``forge --help`` answers at once and ``forge job validate`` never
loads the Temporal SDK. The listing in ``forge --help`` is built from the short help
kept in the table below (``tests/cli/test_lazy.py`` checks it matches each
command's). Adding a command is one line in ``_COMMANDS``.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping, MutableMapping

import click

from forge.cli.text import verbatim

__all__ = ["COMMANDS", "forge"]

#: Name -> (``module:attribute``, short help), in the order ``forge --help`` lists
#: them: from offline planning to running a cluster, not alphabetically.
COMMANDS: Mapping[str, tuple[str, str]] = {
    "plan": ("forge.cli.plan:plan", "dry-run one placement pass offline (no server)"),
    "job": ("forge.cli.job:job", "validate, run, scale, stop and list jobs"),
    "node": ("forge.cli.node:node", "add, remove, drain nodes; report loss and heartbeats"),
    "queue": ("forge.cli.queue:queue", "declare queues and quotas; show their usage"),
    "cluster": ("forge.cli.cluster:cluster", "manage the cluster workflow"),
    "status": ("forge.cli.cluster:status", "show counts, nodes and pending replicas"),
    "explain": (
        "forge.cli.cluster:explain",
        "why a replica is where it is, or not placed (reads the store)",
    ),
    "store": ("forge.cli.store:store", "store maintenance"),
    "worker": (
        "forge.cli.services:worker",
        "run a worker in this process (like `python -m worker`)",
    ),
    "dev": (
        "forge.cli.services:dev_command",
        "run a local Temporal dev server + worker (+ --demo)",
    ),
    "codec-server": (
        "forge.cli.services:codec_server_command",
        "serve Temporal's codec protocol so the Web UI and CLI read Forge's payloads",
    ),
    "codec-key": (
        "forge.cli.codec_key:codec_key",
        "make and rotate payload encryption keys (FORGE_CODEC_KEY_FILE)",
    ),
    "agent": (
        "forge.cli.agent:agent",
        "run a node agent: register this machine, run the replicas bound to it",
    ),
    "logs": ("forge.cli.agent:logs", "print a replica's task log"),
    "sim": ("forge.cli.sim:sim", "simulation tools for scale runs"),
}

_EPILOG = """\
environment: FORGE_TEMPORAL_ADDRESS, FORGE_NAMESPACE, FORGE_CLUSTER,
FORGE_TASK_QUEUE (flags win), FORGE_STORE / FORGE_DATA_DIR (the store).
exit codes: 0 ok, 1 failure (no server, RPC error), 2 bad input."""


def load(target: str) -> click.Command:
    """The command at ``module:attribute`` (imports its module)."""
    module, _, attribute = target.partition(":")
    command = getattr(importlib.import_module(module), attribute)
    if not isinstance(command, click.Command):  # pragma: no cover - a wrong table entry
        raise TypeError(f"{target} is not a click command")
    return command


class _Commands(MutableMapping[str, click.Command]):
    """``Group.commands`` that imports a command the first time it is looked up.

    Iterating gives the names (table order, then any added) without importing
    anything, so listing, "no such command" suggestions and ``list(forge.commands)``
    stay free; ``forge.commands["job"]`` or ``.values()`` load what they return."""

    def __init__(self, table: Mapping[str, tuple[str, str]]) -> None:
        self._table = table
        self._loaded: dict[str, click.Command] = {}

    def __getitem__(self, name: str) -> click.Command:
        if name not in self._loaded:
            if name not in self._table:
                raise KeyError(name)
            self._loaded[name] = load(self._table[name][0])
        return self._loaded[name]

    def __setitem__(self, name: str, command: click.Command) -> None:
        self._loaded[name] = command

    def __delitem__(self, name: str) -> None:
        raise TypeError("forge's commands are fixed by its table")

    def __iter__(self) -> Iterator[str]:
        yield from self._table
        yield from (name for name in self._loaded if name not in self._table)

    def __len__(self) -> int:
        return len(self._table) + sum(1 for name in self._loaded if name not in self._table)

    def __contains__(self, name: object) -> bool:
        return name in self._table or name in self._loaded

    def short_help(self, name: str, limit: int) -> str:
        """The listing's help for ``name``: the table's, without importing it."""
        if name in self._table and name not in self._loaded:
            return self._table[name][1]
        return self[name].get_short_help_str(limit)


class _Lazy(click.Group):
    """Lists commands in table order and formats the listing from the table."""

    commands: _Commands

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.commands)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        names = self.list_commands(ctx)
        if not names:  # pragma: no cover - the table is not empty
            return
        limit = formatter.width - 6 - max(len(n) for n in names)
        rows = [(n, self.commands.short_help(n, limit)) for n in names]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


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
    cls=_Lazy,
    commands=_Commands(COMMANDS),
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
