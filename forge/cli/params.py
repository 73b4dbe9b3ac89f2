"""Argument types and the option sets several commands share.

The checks are the plain functions of :mod:`forge.params` (``str -> value``,
``ValueError`` with the message to show), re-exported here; :class:`Checked` turns
one into a Click type, so Click names the flag or argument (``Invalid value for
'--cpu': ...``) and exits 2 before any connection is made. The agent parses its
flags with the same functions, so ``forge agent --gpu`` and ``forge node add
--gpu`` accept and refuse the same text.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar, cast

import click

from forge.cli.text import verbatim
from forge.params import (
    NAME_HELP,
    address,
    address_problem,
    gpu,
    host,
    label,
    listen_port,
    name,
    nonempty,
    nonnegative_int,
    origin,
    permille,
    port,
    positive_float,
    replicas,
    seconds,
)

__all__ = [
    "CONNECT_TIMEOUT",
    "GPU",
    "LABEL",
    "NAME",
    "NAME_HELP",
    "Checked",
    "address",
    "address_problem",
    "cluster_option",
    "gpu",
    "host",
    "label",
    "listen_port",
    "name",
    "nonempty",
    "nonnegative_int",
    "origin",
    "permille",
    "port",
    "positive_float",
    "replicas",
    "seconds",
    "store_option",
    "temporal_options",
    "verbatim",
]

#: Seconds to wait for a Temporal connection before giving up (``--connect-timeout``).
CONNECT_TIMEOUT = 10.0

_T = TypeVar("_T")
_F = TypeVar("_F", bound=Callable[..., Any])


class Checked(click.ParamType[_T, Any]):
    """A Click type from a check function; its ``ValueError`` becomes a usage error
    naming the parameter (exit 2)."""

    def __init__(self, check: Callable[[str], _T], metavar: str = "") -> None:
        self.check = check
        self.name = check.__name__
        self._metavar = metavar

    def get_metavar(self, param: click.Parameter, ctx: click.Context) -> str | None:
        return self._metavar or None

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> _T:
        if not isinstance(value, str):  # a default, already converted
            return cast(_T, value)
        try:
            return self.check(value)
        except ValueError as err:
            self.fail(str(err), param, ctx)


NAME = Checked(name, "NAME")
#: ``--gpu`` and ``--label`` of ``forge node add`` and ``forge agent``: one type each.
GPU = Checked(gpu, "MODEL:MEMORY_MIB")
LABEL = Checked(label, "KEY=VALUE")
PATH = click.Path(path_type=Path)


# ------------------------------------------------------------- shared option sets


def cluster_option(f: _F) -> _F:
    return click.option(
        "--cluster", type=NAME, help="cluster name (FORGE_CLUSTER, default 'default')"
    )(f)


def store_option(f: _F) -> _F:
    return click.option(
        "--store",
        metavar="URL",
        help="store URL (default: FORGE_STORE, else sqlite in FORGE_DATA_DIR, default .forge)",
    )(f)


def temporal_options(f: _F) -> _F:
    """The connection flags; each wins over its ``FORGE_*`` variable, which
    :mod:`forge.settings` reads (one place owns the environment)."""
    options = [
        click.option(
            "--address",
            type=Checked(address, "HOST:PORT"),
            help="host:port (FORGE_TEMPORAL_ADDRESS)",
        ),
        click.option(
            "--namespace", type=Checked(nonempty, "TEXT"), help="namespace (FORGE_NAMESPACE)"
        ),
        cluster_option,
        click.option(
            "--task-queue", type=Checked(nonempty, "TEXT"), help="task queue (FORGE_TASK_QUEUE)"
        ),
        click.option(
            "--connect-timeout",
            type=Checked(positive_float, "SECONDS"),
            default=CONNECT_TIMEOUT,
            help=f"give up connecting after this long (default {CONNECT_TIMEOUT:g})",
        ),
    ]
    for option in reversed(options):
        f = option(f)
    return f
