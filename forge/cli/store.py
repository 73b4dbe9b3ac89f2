"""``forge store``: store maintenance."""

from __future__ import annotations

import click

from forge.cli.params import store_option
from forge.cli.remote import safe_url, settings, store_call
from forge.errors import InvalidInput

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


COMMANDS = [store]
