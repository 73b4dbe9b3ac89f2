"""``forge worker``, ``forge dev`` and ``forge codec-server``: long-running
processes. The flags live here; what the processes do lives in
:mod:`forge.services` and ``worker.py``."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from forge.cli.params import (
    Checked,
    cluster_option,
    host,
    listen_port,
    origin,
    port,
    seconds,
    store_option,
    temporal_options,
    verbatim,
)
from forge.cli.remote import connect_problem, settings
from forge.errors import Unavailable
from forge.services import codec_server, dev

__all__ = ["COMMANDS", "codec_server_command", "dev_command", "worker"]

_PORT = Checked(port, "INTEGER")


@click.command(
    short_help="run a worker in this process (like `python -m worker`)",
    help="Run the worker that hosts the cluster workflow and its activities.",
)
@temporal_options
@store_option
def worker(connect_timeout: float, **flags: str | None) -> int:
    s = settings(**flags)  # validates flags and environment first
    for var, value in (
        ("FORGE_TEMPORAL_ADDRESS", s.address),
        ("FORGE_NAMESPACE", s.namespace),
        ("FORGE_CLUSTER", s.cluster),
        ("FORGE_TASK_QUEUE", s.task_queue),
        ("FORGE_STORE", s.store),
    ):
        if value:
            os.environ[var] = value  # the worker reads its settings from the environment
    import worker as worker_module  # lazily: forge must not depend on it at import time

    try:
        code: Any = worker_module.main()
    except RuntimeError as err:  # the SDK's connect failure; anything else is a bug
        if not str(err).startswith("Failed client connect"):
            raise
        raise Unavailable(
            f"cannot connect to Temporal at {s.address}: {connect_problem(err)}"
        ) from None
    return int(code or 0)


@click.command(
    "dev",
    short_help="run a local Temporal dev server + worker (+ --demo)",
    help=verbatim(dev.DESCRIPTION),
)
@click.option("--port", type=_PORT, default=7233, help="gRPC port (default 7233)")
@click.option(
    "--ui-port", type=_PORT, default=None, help="Web UI port (default: --port + 1000, 8233)"
)
@click.option(
    "--codec-port",
    type=_PORT,
    default=None,
    help="codec server port (default: --ui-port + 1, 8234, or a free one if taken)",
)
@click.option(
    "--data-dir",
    type=click.Path(path_type=Path),
    default=None,
    metavar="DIR",
    help="where state and logs go (default: FORGE_DATA_DIR, else .forge)",
)
@cluster_option
@click.option("--task-queue", help="task queue (FORGE_TASK_QUEUE, default 'forge')")
@click.option("--demo", is_flag=True, help="load the examples and watch them place")
@click.option("--once", is_flag=True, help="set up, print status, stop (for tests)")
@click.option(
    "--startup-timeout",
    type=Checked(seconds, "SECONDS"),
    default=60.0,
    help="how long the server may take to answer (default 60.0)",
)
def dev_command(**options: Any) -> int:
    return dev.run(**options)


@click.command(
    "codec-server",
    short_help="serve Temporal's codec protocol so the Web UI and CLI read Forge's payloads",
    help=verbatim(codec_server.DESCRIPTION),
)
@click.option(
    "--host",
    type=Checked(host, "TEXT"),
    default="127.0.0.1",
    help="address to listen on (default 127.0.0.1: this machine only)",
)
@click.option(
    "--port",
    type=Checked(listen_port, "INTEGER"),
    default=codec_server.DEFAULT_PORT,
    help=f"port (default {codec_server.DEFAULT_PORT}; 0 picks a free one and prints it)",
)
@click.option(
    "--allow-origin",
    type=Checked(origin, "ORIGIN"),
    multiple=True,
    help="a Web UI origin the browser may call from, e.g. http://localhost:8233 "
    "(repeatable; * allows any)",
)
@click.option(
    "--auth-file",
    type=click.Path(path_type=Path),
    metavar="FILE",
    help=f"require this token in Authorization (default: {codec_server.TOKEN_ENV}, else no auth)",
)
@click.option(
    "--allow-no-auth",
    is_flag=True,
    help="with codec keys, serve off loopback without a token (only where something "
    "else guards the port, e.g. a container port published on the host's loopback)",
)
def codec_server_command(
    host: str,
    port: int,
    allow_origin: Sequence[str],
    auth_file: Path | None,
    allow_no_auth: bool,
) -> int:
    return codec_server.run(
        host=host,
        port=port,
        allow_origin=allow_origin,
        auth_file=auth_file,
        allow_no_auth=allow_no_auth,
    )


COMMANDS = [worker, dev_command, codec_server_command]
