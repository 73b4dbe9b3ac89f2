"""Key files for payload encryption (``FORGE_CODEC_KEY_FILE``): made, extended for a
rotation, and a standby key made current.

The file is plain text, one ``id:base64key`` a line (``#`` comments allowed), the
first key current: what :meth:`forge.wire.encryption.CodecKeys.parse` reads. It
is written here rather than by hand because a key must come from a CSPRNG, the
file must never be readable by others (mode 0600 from the moment it exists, not
after a ``chmod``), and a rewrite must be atomic: a worker starting while the file
is half written would otherwise read no key, or half of one.

Used by ``forge codec-key`` and by ``forge dev`` (a key of its own in its data
directory, made on first start and reused after).
"""

from __future__ import annotations

import os
import secrets
import tempfile
import time
from pathlib import Path

from forge.wire.encryption import ID_HELP, CodecKeys, format_key, new_key

__all__ = ["HEADER", "KeyFileError", "add_key", "new_key_id", "promote_key", "read_keys"]

HEADER = """\
# Forge payload encryption keys (FORGE_CODEC_KEY_FILE): id:base64key, one a line.
# The first key encrypts; every key listed decrypts. Keep this file secret and
# backed up: the workflow history these keys encrypted cannot be read without them.
"""


class KeyFileError(ValueError):
    """A key file that cannot be read, written or changed as asked (the message
    names the file)."""


def new_key_id() -> str:
    """A fresh key id: the UTC date (which key is older reads at a glance) and
    random hex (two keys made the same day differ)."""
    return f"{time.strftime('%Y%m%d', time.gmtime())}-{secrets.token_hex(3)}"


def read_keys(path: Path) -> CodecKeys:
    try:
        return CodecKeys.parse(path.read_text())
    except OSError as err:
        raise KeyFileError(f"{path}: cannot read: {err.strerror or err}") from None
    except (ValueError, UnicodeDecodeError) as err:
        raise KeyFileError(f"{path}: {err}") from None


def add_key(path: Path, key_id: str | None = None, *, standby: bool = False) -> str:
    """Add a new random key to ``path`` (created if missing) and return its id:
    first, so it becomes current, or with ``standby`` last, decrypting only (the
    first step of a rotation without downtime)."""
    key_id = key_id or new_key_id()
    try:
        entry = format_key(key_id, new_key())
    except ValueError:
        raise KeyFileError(f"key id {key_id!r}: a key id is {ID_HELP}") from None
    if not path.exists():
        _write(path, HEADER + entry + "\n", create=True)
        return key_id
    if key_id in read_keys(path).ids:
        raise KeyFileError(f"{path}: already holds a key {key_id!r}")
    lines = path.read_text().splitlines()
    if standby:
        lines.append(entry)
    else:
        lines.insert(_first_key_line(lines), entry)
    _write(path, "\n".join(lines) + "\n")
    return key_id


def promote_key(path: Path, key_id: str) -> None:
    """Make the key ``key_id`` of ``path`` current (its line first), the other
    keys kept for decryption."""
    keys = read_keys(path)
    if key_id not in keys.ids:
        held = ", ".join(keys.ids) or "no key"
        raise KeyFileError(f"{path}: holds no key {key_id!r} (it holds {held})")
    lines = path.read_text().splitlines()
    mine = [i for i, line in enumerate(lines) if _line_id(line) == key_id]
    moved = [lines[i] for i in mine]
    rest = [line for i, line in enumerate(lines) if i not in mine]
    at = _first_key_line(rest)
    _write(path, "\n".join(rest[:at] + moved + rest[at:]) + "\n")


def _line_id(line: str) -> str | None:
    text = line.split("#")[0].strip()
    return text.partition(":")[0].strip() if ":" in text else None


def _first_key_line(lines: list[str]) -> int:
    return next((i for i, line in enumerate(lines) if _line_id(line)), len(lines))


def _write(path: Path, text: str, *, create: bool = False) -> None:
    """Write ``text`` to ``path`` atomically, readable by its owner only."""
    try:
        if create:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(text)
            return
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # mode 0600
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as err:
        raise KeyFileError(f"{path}: cannot write: {err.strerror or err}") from None
