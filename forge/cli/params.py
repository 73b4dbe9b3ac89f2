"""Argument types and the option sets several commands share.

Every check is a plain function ``str -> value`` that raises ``ValueError`` with
the message to show; :class:`Checked` turns it into a Click type, so Click names
the flag or argument (``Invalid value for '--cpu': ...``) and exits 2 before any
connection is made. Plain functions keep the rules testable and reusable (the
``forge dev`` and ``codec-server`` flags use the same ones).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar, cast
from urllib.parse import urlsplit

import click

from forge.cli.text import verbatim
from forge.core.models import MAX_MEMORY, MAX_REPLICAS, is_valid_name

__all__ = [
    "CONNECT_TIMEOUT",
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
NAME_HELP = "1-63 of A-Z a-z 0-9 . _ - (starting with a letter or digit)"
_LABEL_KEY_RE = re.compile(
    r"^([A-Za-z0-9]([-A-Za-z0-9.]{0,251}[A-Za-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
_MAX_LABEL_VALUE = 4096

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


# ------------------------------------------------------------------------- checks


def name(text: str) -> str:
    if not is_valid_name(text):
        raise ValueError(f"{text!r}: must be {NAME_HELP}")
    return text


def nonempty(text: str) -> str:
    if not text.strip():
        raise ValueError("must not be empty")
    return text


def address_problem(text: str) -> str | None:
    host, sep, port = text.rpartition(":")
    if not sep or not host or any(c.isspace() for c in text):
        return f"{text!r} is not host:port"
    if not port.isdigit() or not 0 < int(port) < 65536:
        return f"{text!r}: port must be 1-65535"
    return None


def address(text: str) -> str:
    problem = address_problem(text)
    if problem:
        raise ValueError(problem)
    return text


def nonnegative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{text!r} is not an integer") from None
    if value < 0:
        raise ValueError(f"{text!r} must be >= 0")
    return value


def permille(text: str) -> int:
    value = nonnegative_int(text)
    if value > 1000:
        raise ValueError(f"{text!r} must be 0..1000 (per mille)")
    return value


def replicas(text: str) -> int:
    value = nonnegative_int(text)
    if value > MAX_REPLICAS:
        raise ValueError(f"{text!r} must be <= {MAX_REPLICAS}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number") from None
    if not value > 0 or value == float("inf"):
        raise ValueError(f"{text!r} must be a positive number")
    return value


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise ValueError(f"{text!r} is not a positive number of seconds")
    return value


def gpu(text: str) -> tuple[str, int]:
    """``MODEL:MEMORY_MIB`` (or a known ``MODEL``) -> (model, memory MiB)."""
    from forge.loaders import GPU_MEMORY_MIB  # lazily: the loaders bring YAML

    model, sep, memory = text.partition(":")
    if not is_valid_name(model):
        raise ValueError(f"{text!r}: GPU model must be {NAME_HELP}")
    if not sep:
        if model in GPU_MEMORY_MIB:
            return model, GPU_MEMORY_MIB[model]
        raise ValueError(
            f"{text!r}: expected MODEL:MEMORY_MIB (memory is known only for "
            f"{', '.join(sorted(GPU_MEMORY_MIB))})"
        )
    if not memory.isdigit() or not 0 < int(memory) <= MAX_MEMORY:
        raise ValueError(f"{text!r}: GPU memory must be a whole number of MiB, 1-{MAX_MEMORY}")
    return model, int(memory)


def label(text: str) -> tuple[str, str]:
    """``KEY=VALUE`` with a Kubernetes-style key (``[prefix/]name``)."""
    key, sep, value = text.partition("=")
    if not sep:
        raise ValueError(f"{text!r}: expected KEY=VALUE")
    if not _LABEL_KEY_RE.match(key):
        raise ValueError(
            f"{text!r}: label key must be [prefix/]name, name 1-63 of A-Z a-z 0-9 - _ . "
            "starting and ending with a letter or digit"
        )
    if len(value) > _MAX_LABEL_VALUE or not value.isprintable():
        raise ValueError(
            f"{text!r}: label value must be printable, at most {_MAX_LABEL_VALUE} characters"
        )
    return key, value


def port(text: str) -> int:
    """A port to connect to or serve on (1-65535)."""
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise ValueError(f"{text!r} is not a port (1-65535)")
    return int(text)


def listen_port(text: str) -> int:
    """A port to listen on; 0 asks the system for a free one."""
    if not text.isdigit() or not 0 <= int(text) < 65536:
        raise ValueError(f"{text!r} is not a port (0-65535)")
    return int(text)


def host(text: str) -> str:
    text = text.strip("[]")
    if not text or any(c.isspace() for c in text):
        raise ValueError(f"{text!r} is not a host name or IP address")
    return text


def origin(text: str) -> str:
    """A browser origin as browsers send it (no trailing slash, lower case)."""
    if text == "*":
        return text
    parts = urlsplit(text)
    bad = (
        parts.scheme not in ("http", "https")
        or not parts.hostname
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
    )
    if bad:
        raise ValueError(
            f"{text!r} is not an origin: give scheme://host[:port], e.g. http://localhost:8233"
        )
    return f"{parts.scheme}://{parts.netloc}".lower()


NAME = Checked(name, "NAME")
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
