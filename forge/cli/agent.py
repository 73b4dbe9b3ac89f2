"""``forge agent`` and ``forge logs``: the node agent and its task logs. The flags
live here; what the agent does lives in :mod:`forge.agent`."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import click

from forge.cli.params import (
    GPU,
    LABEL,
    NAME,
    Checked,
    cluster_option,
    nonnegative_int,
    positive_float,
    store_option,
    temporal_options,
)
from forge.cli.remote import open_existing_store, settings

__all__ = ["COMMANDS", "agent", "logs"]

_SECONDS = Checked(positive_float, "SECONDS")
TOKEN_ENV = "FORGE_AGENT_TOKEN"


@click.command(
    short_help="run a node agent: register this machine, run the replicas bound to it",
    help=(
        "Register node ID (capacity detected from the machine unless given), heartbeat "
        "through the store and run the replicas bound to it as processes. Tasks keep "
        "running when the agent exits; a restarted agent adopts them."
    ),
)
@temporal_options
@store_option
@click.option("--node-id", required=True, type=NAME, metavar="ID")
@click.option("--cpu", type=Checked(nonnegative_int, "MILLICORES"), help="default: detected")
@click.option("--memory", type=Checked(nonnegative_int, "MIB"), help="default: detected")
@click.option("--gpu", type=GPU, multiple=True, help="one GPU device per use (default: nvidia-smi)")
@click.option("--label", type=LABEL, multiple=True, help="node label (repeatable)")
@click.option(
    "--data-dir", type=click.Path(path_type=Path), help="default: FORGE_DATA_DIR/agent-ID"
)
@click.option(
    "--check",
    is_flag=True,
    help="print what this machine gives tasks (GPUs, address, limits) and exit",
)
@click.option("--logs-address", default="127.0.0.1:0", metavar="HOST:PORT")
@click.option(
    "--advertise-address",
    default="",
    metavar="HOST",
    help="where peers reach this node (default: the logs host off loopback, else the host's)",
)
@click.option("--poll", type=_SECONDS, default=0.5, help="store poll period (default 0.5)")
@click.option("--heartbeat-every", type=_SECONDS, default=5.0, help="default 5")
@click.option("--usage-every", type=_SECONDS, default=10.0, help="default 10")
@click.option("--stop-tasks-on-exit", is_flag=True, help="stop the replicas when the agent stops")
def agent(
    connect_timeout: float,
    node_id: str,
    cpu: int | None,
    memory: int | None,
    gpu: Sequence[tuple[str, int]],
    label: Sequence[tuple[str, str]],
    data_dir: Path | None,
    check: bool,
    logs_address: str,
    advertise_address: str,
    poll: float,
    heartbeat_every: float,
    usage_every: float,
    stop_tasks_on_exit: bool,
    **flags: str | None,
) -> int:
    from forge.agent.config import build_config
    from forge.agent.run import run_agent

    s = settings(**flags)
    config = build_config(  # AgentConfigError is an InvalidInput: exit 2
        node_id=node_id,
        data_dir=data_dir or s.data_dir / f"agent-{node_id}",
        cluster=s.cluster,
        store_url=s.store_url,
        cpu=cpu,
        memory=memory,
        gpus=list(gpu) or None,
        labels=list(label),
        logs_address=logs_address,
        advertise_address=advertise_address,
        token=os.environ.get(TOKEN_ENV, ""),  # never a flag: flags show in `ps`
        poll=poll,
        heartbeat_every=heartbeat_every,
        usage_every=usage_every,
    )
    if check:  # nothing connected, nothing written
        from forge.agent.check import check_lines

        for line in check_lines(config):
            click.echo(f"forge agent: {line}")
        return 0
    return run_agent(config, s, stop_tasks_on_exit=stop_tasks_on_exit)


@click.command(short_help="print a replica's task log")
@store_option
@cluster_option
@click.argument("workload_id", metavar="JOB/GROUP/ORDINAL")
@click.option("--task", default="", help="task name (default: the first)")
@click.option("-f", "--follow", is_flag=True, help="keep printing as the log grows")
def logs(store: str | None, cluster: str | None, workload_id: str, task: str, follow: bool) -> int:
    from forge.agent.run import fetch_logs

    s = settings(store=store, cluster=cluster)
    opened = open_existing_store(s.store_url)
    try:  # LogsError is an Unavailable: exit 1
        return fetch_logs(
            opened,
            s.cluster,
            workload_id,
            task=task,
            follow=follow,
            token=os.environ.get(TOKEN_ENV, ""),  # never a flag: flags show in `ps`
        )
    finally:
        opened.close()


COMMANDS = [agent, logs]
