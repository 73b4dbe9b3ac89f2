"""Reaching the cluster: settings, the Temporal connection, the store, and turning
their failures into :mod:`forge.errors` kinds (which :func:`forge.cli.main` maps to
exit codes).

Temporal and the settings (which read the Temporal environment configuration
through the SDK) are imported here lazily: ``forge plan`` and ``forge job validate``
never talk to a server, so they do not pay for importing the SDK.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from forge.cli.params import NAME_HELP, address_problem
from forge.client.failures import Where, connect_failure, connect_problem, one_line, translate
from forge.core.limits import is_valid_name
from forge.errors import ForgeError, InvalidInput, Unavailable

if TYPE_CHECKING:
    from temporalio.service import ServiceClient

    from forge.client.client import ForgeClient
    from forge.settings import Settings
    from forge.stores import Store

__all__ = [
    "connect_client",
    "connect_problem",
    "one_line",
    "open_existing_store",
    "print_json",
    "remote",
    "remote_reader",
    "safe_url",
    "settings",
    "store_call",
    "web_ui_hint",
]

_T = TypeVar("_T")


def settings(
    *,
    address: str | None = None,
    namespace: str | None = None,
    cluster: str | None = None,
    task_queue: str | None = None,
    store: str | None = None,
) -> Settings:
    """``FORGE_*`` environment overridden by the flags the command has (flags win)."""
    from forge.settings import Settings, SettingsError

    s = Settings.from_env().override(
        address=address, namespace=namespace, cluster=cluster, task_queue=task_queue, store=store
    )
    if not is_valid_name(s.cluster):
        raise SettingsError(f"FORGE_CLUSTER={s.cluster!r}: a cluster name must be {NAME_HELP}")
    problem = address_problem(s.address)
    if problem:
        raise SettingsError(f"FORGE_TEMPORAL_ADDRESS: {problem}")
    if not s.task_queue.strip() or not s.namespace.strip():
        raise SettingsError("FORGE_TASK_QUEUE and FORGE_NAMESPACE must not be empty")
    return s


def print_json(obj: object) -> None:
    """One JSON document: indented on a terminal, one compact line for pipes."""
    indent = 2 if sys.stdout.isatty() else None
    print(json.dumps(obj, indent=indent))


def web_ui_hint(s: Settings) -> str:
    """Where to see the workflow; a dev server's UI is the gRPC port + 1000."""
    from forge.wire.contract import workflow_id

    wid = workflow_id(s.cluster)
    host, _, port = s.address.rpartition(":")
    if host in ("localhost", "127.0.0.1", "[::1]") and port.isdigit():
        return (
            f"Web UI (dev server): http://{host}:{int(port) + 1000}/namespaces/"
            f"{s.namespace}/workflows/{wid}"
        )
    return f"Web UI: open workflow {wid} in namespace {s.namespace}"


# ------------------------------------------------------------------------ Temporal


async def _connect(
    s: Settings, timeout: float, connect: Callable[[], Awaitable[_T]] | None = None
) -> _T:
    """``connect()`` (default: the SDK's ``Client``) within ``timeout``, its failures
    as :mod:`forge.errors` kinds."""
    from forge.settings import SettingsError

    try:
        client: _T = await asyncio.wait_for((connect or s.connect)(), timeout)
    except TimeoutError:
        raise Unavailable(
            f"cannot connect to Temporal at {s.address}: no answer within {timeout:g} s"
        ) from None
    except SettingsError:
        raise  # an unreadable TLS file: bad input (exit 2), not a connection failure
    except (RuntimeError, OSError, ValueError) as err:
        raise connect_failure(err, s.address) from None
    return client


async def connect_client(s: Settings, timeout: float) -> Any:
    """The SDK's ``Client`` (Forge's data converter) within ``timeout``, its
    failures as :mod:`forge.errors` kinds."""
    return await _connect(s, timeout)


def _where(s: Settings) -> Where:
    from forge.wire.names import workflow_id

    return Where(s.address, s.namespace, s.cluster, s.task_queue, workflow_id(s.cluster))


def remote(
    s: Settings,
    timeout: float,
    action: Callable[[ForgeClient], Awaitable[int]],
    *,
    reads_store: bool = False,
) -> int:
    """Connect with the command's settings, run ``action``, turn SDK errors into
    Forge's. ``reads_store``: the command reads what the loop published to the store."""
    return asyncio.run(_run_remote(s, timeout, action, reads_store))


def remote_reader(
    s: Settings,
    timeout: float,
    action: Callable[[ServiceClient], Awaitable[int]],
) -> int:
    """For a command that reads what the loop published to the store and asks
    Temporal only whether the workflow runs (``forge status``): ``action`` gets the
    bare gRPC service client (:mod:`forge.client.probe`), not the SDK's ``Client``,
    whose import costs more than the rest of such a command, and opens the store
    itself (:func:`open_existing_store`, or cheaper). Errors as ``remote``."""
    return asyncio.run(_run_reader(s, timeout, action))


async def _run_reader(
    s: Settings,
    timeout: float,
    action: Callable[[ServiceClient], Awaitable[int]],
) -> int:
    from forge.client import probe

    asyncio.get_running_loop().set_exception_handler(_quiet_sdk_orphans)
    service = await _connect(s, timeout, lambda: probe.connect(s))
    try:
        return await action(service)
    except Exception as err:
        raise _one_kind(err, s) from None


def _one_kind(err: Exception, s: Settings) -> Exception:
    """``err`` as a :mod:`forge.errors` kind in one line (Temporal's errors through
    :func:`forge.client.failures.translate`); anything else (a bug) as it is."""
    if isinstance(err, ForgeError):  # the cluster refused: keep the kind, one line
        err.args = (one_line(str(err)),)
        return err
    return translate(err, _where(s)) or err


async def _run_remote(
    s: Settings,
    timeout: float,
    action: Callable[[ForgeClient], Awaitable[int]],
    reads_store: bool,
) -> int:
    from forge.client.client import ForgeClient

    asyncio.get_running_loop().set_exception_handler(_quiet_sdk_orphans)
    client: Any = await _connect(s, timeout)
    store = open_existing_store(s.store_url) if reads_store else None
    fc = ForgeClient(client, cluster=s.cluster, task_queue=s.task_queue, store=store)
    try:
        return await action(fc)
    except Exception as err:  # ForgeClient raises Forge's kinds; the action may not
        raise _one_kind(err, s) from None
    finally:
        if store is not None:
            store.close()


def _quiet_sdk_orphans(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """Drop asyncio's "Future exception was never retrieved" for Temporal errors.

    A failed update-with-start also fails the start operation's workflow-handle
    future, which nobody awaits; asyncio then prints that error again, with a
    traceback, when the future is collected. The failure itself has already been
    reported as one line; anything else goes to the default handler.
    """
    from temporalio.exceptions import TemporalError

    orphan = str(context.get("message", "")).startswith("Future exception was never retrieved")
    if orphan and isinstance(context.get("exception"), TemporalError):
        return
    loop.default_exception_handler(context)


# --------------------------------------------------------------------------- store


def safe_url(url: str) -> str:
    """A store URL without its password (``user:PASSWORD@`` or ``?password=``), for
    messages."""
    url = re.sub(r"(://[^:/@]*):[^@/]*@", r"\1:***@", url)
    return re.sub(r"(?i)([?&](?:ssl)?password=)[^&#]*", r"\1***", url)


def open_existing_store(url: str) -> Store:
    """Open the store a worker already writes: refuse to create an empty one by
    accident (a wrong FORGE_DATA_DIR would otherwise look like an empty cluster)."""
    from forge.stores import open_store, store_kind
    from forge.stores.sqlite import sqlite_path

    try:
        kind = store_kind(url)
    except ValueError as err:
        raise InvalidInput(str(err)) from None
    if kind == "memory":
        raise InvalidInput(
            "memory:// lives inside the worker process; pass the worker's sqlite or "
            "postgres store with --store or FORGE_STORE"
        )
    if kind == "sqlite" and not os.path.exists(sqlite_path(url)):
        raise Unavailable(
            f"no store at {sqlite_path(url)}: point --store, FORGE_STORE or "
            "FORGE_DATA_DIR at the store the worker uses"
        )
    return store_call(lambda: open_store(url), url)


def store_call(fn: Callable[[], _T], url: str) -> _T:
    """Run a store operation; database failures become :class:`Unavailable` with the
    URL named (a stale fence stays a :class:`~forge.errors.Conflict`)."""
    import sqlite3

    from forge.stores import StoreError

    try:
        return fn()
    except Exception as err:
        # psycopg is imported by fn itself (when it opens a PostgreSQL store), so its
        # error class can only be looked up now
        pg = sys.modules.get("psycopg")
        errors: tuple[type[BaseException], ...] = (StoreError, OSError, sqlite3.Error)
        if not (isinstance(err, errors) or (pg is not None and isinstance(err, pg.Error))):
            raise
        message = f"store {safe_url(url)}: {one_line(str(err))}"
        if isinstance(err, ForgeError):  # keep its kind (a stale fence is a Conflict)
            err.args = (message,)
            raise err from None
        raise Unavailable(message) from None
