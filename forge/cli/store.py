"""``forge store``: store maintenance, and the store roles of node agents."""

from __future__ import annotations

import sys

import click

from forge.cli.params import NAME, cluster_option, store_option
from forge.cli.remote import safe_url, settings, store_call
from forge.errors import InvalidInput, NotFound

__all__ = ["COMMANDS", "store"]


@click.group(subcommand_metavar="COMMAND", short_help="store maintenance")
def store() -> None:
    pass


@store.command(short_help="create or upgrade the store's schema")
@store_option
def migrate(store: str | None) -> int:
    from forge.stores import migrate_url

    url = settings(store=store).store_url
    try:
        version = store_call(lambda: migrate_url(url), url)
    except ValueError as err:  # not a store URL
        raise InvalidInput(str(err)) from None
    print(f"store {safe_url(url)}: schema version {version}")
    return 0


def _postgres_url(store: str | None, cluster: str | None) -> tuple[str, str]:
    """The store URL and cluster, refusing every store but PostgreSQL: only it has
    users to give an agent fewer rights than the worker."""
    from forge.stores import store_kind

    s = settings(store=store, cluster=cluster)
    try:
        kind = store_kind(s.store_url)
    except ValueError as err:
        raise InvalidInput(str(err)) from None
    if kind != "postgres":
        raise InvalidInput(
            f"store {safe_url(s.store_url)} is {kind}: agent roles need the PostgreSQL "
            "store (a SQLite file has no users: every process that opens it can write all "
            "of it). Point --store or FORGE_STORE at postgresql://… as the store's owner"
        )
    return s.store_url, s.cluster


@store.command(
    "grant-agent",
    short_help="make NODE's agent a PostgreSQL role of its own; print its store URL",
    help=(
        "Create the PostgreSQL role of node NODE's agent (or replace its password) and "
        "print the store URL to give that agent as FORGE_STORE. The role may only "
        "heartbeat and report for NODE and read NODE, its bindings and the groups of "
        "their jobs. Run as the store's owner with CREATEROLE, or as a superuser. "
        "PostgreSQL only."
    ),
)
@store_option
@cluster_option
@click.option(
    "--no-password",
    is_flag=True,
    help="no password (the server authenticates agents otherwise: certificates, GSSAPI)",
)
@click.argument("node_id", metavar="NODE", type=NAME)
def grant_agent(store: str | None, cluster: str | None, no_password: bool, node_id: str) -> int:
    from forge.stores.agent_roles import grant_agent as grant

    url, cluster_name = _postgres_url(store, cluster)
    granted = store_call(lambda: grant(url, cluster_name, node_id, password=not no_password), url)
    how = ("created" if granted.created else "password replaced") + (
        ", no password" if no_password else ""
    )
    print(
        f"store role {granted.role} for node {node_id} of cluster {cluster_name} ({how}); "
        "give that agent this store URL as FORGE_STORE:",
        file=sys.stderr,
    )
    print(granted.url)  # stdout holds only the URL: FORGE_STORE=$(forge store grant-agent N)
    return 0


@store.command(
    "revoke-agent",
    short_help="drop NODE's agent role: its store URL stops working",
)
@store_option
@cluster_option
@click.argument("node_id", metavar="NODE", type=NAME)
def revoke_agent(store: str | None, cluster: str | None, node_id: str) -> int:
    from forge.stores.agent_roles import revoke_agent as revoke

    url, cluster_name = _postgres_url(store, cluster)
    role = store_call(lambda: revoke(url, cluster_name, node_id), url)
    if role is None:
        raise NotFound(f"node {node_id} of cluster {cluster_name} has no agent role to revoke")
    print(f"store role {role} of node {node_id} in cluster {cluster_name} dropped")
    return 0


COMMANDS = [store]
