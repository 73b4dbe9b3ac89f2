"""``forge codec-key``: make and rotate the payload encryption keys
(``FORGE_CODEC_KEY_FILE``); the file format and why it is written this way are in
:mod:`forge.services.codec_keys`."""

from __future__ import annotations

from pathlib import Path

import click

from forge.cli.text import verbatim
from forge.errors import InvalidInput

__all__ = ["COMMANDS", "codec_key"]

_ROTATION = """\
Payload encryption keys for FORGE_CODEC_KEY_FILE: one id:base64key a line, the
first encrypts, every one decrypts. Rotation without downtime, with the file
shared by every worker, client and codec server:

  forge codec-key new FILE --standby     # 1. a new key, decrypting only
  (restart every process: all of them can now read the new key)
  forge codec-key promote FILE ID        # 2. the new key encrypts
  (restart every process again; keep the old key while history needs it)
"""

_FILE = click.Path(dir_okay=False, path_type=Path)


@click.group(
    "codec-key",
    subcommand_metavar="COMMAND",
    short_help="make and rotate payload encryption keys (FORGE_CODEC_KEY_FILE)",
    help=verbatim(_ROTATION),
)
def codec_key() -> None:
    pass


@codec_key.command(short_help="add a new random key (creates the file)")
@click.argument("path", metavar="FILE", type=_FILE)
@click.option("--id", "key_id", metavar="ID", help="the key's id (default: today's date + hex)")
@click.option("--standby", is_flag=True, help="add it last, decrypting only (rotation step 1)")
@click.option("--if-missing", is_flag=True, help="do nothing if FILE exists (set-up scripts)")
def new(path: Path, key_id: str | None, standby: bool, if_missing: bool) -> int:
    """Add a new random AES-256 key to FILE, current unless --standby. FILE `-`
    prints one id:base64key entry instead, for FORGE_CODEC_KEYS."""
    from forge.services.codec_keys import KeyFileError, add_key, new_key_id, read_keys
    from forge.wire.encryption import format_key, new_key

    try:
        if str(path) == "-":
            print(format_key(key_id or new_key_id(), new_key()))
            return 0
        if if_missing and path.exists():
            print(f"{path}: exists, keys {', '.join(read_keys(path).ids)}; left as it is")
            return 0
        added = add_key(path, key_id, standby=standby)
        keys = read_keys(path)
    except (KeyFileError, ValueError) as err:
        raise InvalidInput(str(err)) from None
    role = "current" if keys.current == added else "decrypting only"
    print(f"{path}: key {added} added ({role}); keys {', '.join(keys.ids)}")
    return 0


@codec_key.command(short_help="make a key of FILE the current one (rotation step 2)")
@click.argument("path", metavar="FILE", type=_FILE)
@click.argument("ident", metavar="ID")  # (not "key_id": no parameter is named for a secret)
def promote(path: Path, ident: str) -> int:
    from forge.services.codec_keys import KeyFileError, promote_key, read_keys

    try:
        promote_key(path, ident)
        keys = read_keys(path)
    except KeyFileError as err:
        raise InvalidInput(str(err)) from None
    print(f"{path}: key {ident} is current; keys {', '.join(keys.ids)}")
    return 0


@codec_key.command("list", short_help="the key ids of FILE, current first")
@click.argument("path", metavar="FILE", type=_FILE)
def list_keys(path: Path) -> int:
    from forge.services.codec_keys import KeyFileError, read_keys

    try:
        keys = read_keys(path)
    except KeyFileError as err:
        raise InvalidInput(str(err)) from None
    for key_id in keys.ids:
        print(f"{key_id}{'  (current)' if key_id == keys.current else ''}")
    return 0


COMMANDS = [codec_key]
