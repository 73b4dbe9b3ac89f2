"""Encryption at rest: an AES-GCM payload codec with keys by id.

Job specs (task env values among them) travel in update and activity payloads, and
Temporal keeps every payload in the workflow's history for as long as the namespace
retains it. Anyone who can read the namespace (the Web UI, ``temporal workflow
show``, a history export) could read them. The codec encrypts each payload before
it leaves the process, so the server only ever stores ciphertext; a codec server
(:mod:`forge.services.codec_server`) decrypts for the users who hold its token.

Why it is built this way:

- **AES-GCM, a random 96-bit nonce per payload.** Authenticated encryption: a
  payload altered in history (or a relabelled one) fails to decrypt instead of
  decoding to something else. With random nonces one key is good for about 2**32
  payloads (NIST SP 800-38D); rotate keys well before that.
- **Keys by id, the first current.** Every payload records the id of the key that
  encrypted it (metadata ``encryption-key-id``). A process encrypts with its
  current key and decrypts with any key it holds, so a new key can be rolled out
  first as a decrypt-only key, then made current, without a moment in which some
  worker cannot read what another wrote.
- **The encoding and the key id are bound as associated data.** They travel in
  clear metadata (the decoder must read them before it can decrypt), so they are
  authenticated with the ciphertext: a payload cannot be passed off as written with
  another key or as another encoding.
- **The whole inner payload is encrypted**, its metadata too (the inner encoding
  says ``binary/zlib`` or ``json/plain``, which is no one's business either).
- **After compression** (:mod:`forge.wire.codec` chains zlib first): ciphertext
  does not compress. The payload's length still shows, as it does for any
  encryption.
- **Payloads without the encrypted encoding pass through decode**, so histories
  recorded before encryption was turned on replay and read as before; a process
  without keys encodes as before (compression only) and refuses an encrypted
  payload with an error naming the key id it would need.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from temporalio.api.common.v1 import Payload
from temporalio.converter import PayloadCodec

__all__ = [
    "ENCRYPTED",
    "KEY_ID",
    "KEY_SIZE",
    "AesGcmCodec",
    "CodecKeyError",
    "CodecKeys",
    "TamperedPayload",
    "format_key",
    "new_key",
]

#: The ``encoding`` metadata of an encrypted payload.
ENCRYPTED = b"binary/encrypted"
#: The metadata key naming the key that encrypted a payload.
KEY_ID = "encryption-key-id"
#: The key size Forge generates (AES-256); 16- and 24-byte keys are accepted too.
KEY_SIZE = 32
NONCE_SIZE = 12
_KEY_SIZES = (16, 24, 32)
_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
ID_HELP = "1-64 of A-Z a-z 0-9 . _ - (starting with a letter or digit)"


class CodecKeyError(ValueError):
    """A payload was encrypted with a key this process does not hold; the message
    names the key id, which is what the operator has to go and find."""


class TamperedPayload(ValueError):
    """An encrypted payload failed authentication: altered in history, or
    encrypted with different key material under the same id."""


@dataclass(frozen=True)
class CodecKeys:
    """Key id -> AES key, in order: the first is current (encrypts), every one
    decrypts. Empty: no encryption. ``repr`` shows the ids, never key bytes."""

    entries: tuple[tuple[str, bytes], ...] = ()
    _by_id: dict[str, bytes] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_id: dict[str, bytes] = {}
        for key_id, key in self.entries:
            if not _ID_RE.match(key_id):
                raise ValueError(f"key id {key_id!r}: a key id is {ID_HELP}")
            if len(key) not in _KEY_SIZES:
                raise ValueError(
                    f"key {key_id!r}: {len(key)} bytes; an AES key is 16, 24 or 32 bytes"
                )
            if key_id in by_id and by_id[key_id] != key:
                raise ValueError(f"key id {key_id!r} is listed twice with different keys")
            by_id.setdefault(key_id, key)
        object.__setattr__(self, "_by_id", by_id)

    def __repr__(self) -> str:
        return f"CodecKeys(ids={self.ids!r})"

    def __bool__(self) -> bool:
        return bool(self.entries)

    @property
    def ids(self) -> list[str]:
        """The key ids, current first (duplicates once)."""
        return list(self._by_id)

    @property
    def current(self) -> str | None:
        return self.entries[0][0] if self.entries else None

    def get(self, key_id: str) -> bytes | None:
        return self._by_id.get(key_id)

    def items(self) -> list[tuple[str, bytes]]:
        """(id, key) pairs, current first, each id once."""
        return list(self._by_id.items())

    def __add__(self, other: CodecKeys) -> CodecKeys:
        """These keys, then ``other``'s: the current key stays this one's."""
        return CodecKeys(self.entries + other.entries)

    @classmethod
    def parse(cls, text: str) -> CodecKeys:
        """``id:base64key`` entries separated by commas or lines; blank lines and
        ``#`` comments are skipped. Errors name the entry's id or position, never
        the key material."""
        entries: list[tuple[str, bytes]] = []
        items = (i.strip() for line in text.splitlines() for i in line.split("#")[0].split(","))
        for n, item in enumerate((i for i in items if i), start=1):
            key_id, sep, encoded = item.partition(":")
            key_id = key_id.strip()
            if not sep or not key_id:
                raise ValueError(f"entry {n} is not id:base64key")
            try:
                key = base64.b64decode(encoded.strip(), validate=True)
            except (binascii.Error, ValueError):
                raise ValueError(f"key {key_id!r}: not base64") from None
            entries.append((key_id, key))
        return cls(tuple(entries))


def new_key() -> bytes:
    """A fresh AES-256 key from the operating system's CSPRNG."""
    return os.urandom(KEY_SIZE)


def format_key(key_id: str, key: bytes) -> str:
    """One ``id:base64key`` entry, as :meth:`CodecKeys.parse` reads it."""
    CodecKeys(((key_id, key),))  # the same checks as when it is read back
    return f"{key_id}:{base64.b64encode(key).decode()}"


def _associated_data(key_id: str) -> bytes:
    return ENCRYPTED + b"\0" + key_id.encode()


class AesGcmCodec(PayloadCodec):
    """Encrypts every payload with the current key; decrypts with any held key;
    passes through payloads that are not encrypted (and, without keys, encodes
    nothing)."""

    def __init__(self, keys: CodecKeys) -> None:
        self.keys = keys
        self._ciphers = {key_id: AESGCM(key) for key_id, key in keys.items()}

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        current = self.keys.current
        if current is None:
            return list(payloads)
        cipher, aad = self._ciphers[current], _associated_data(current)
        out = []
        for p in payloads:
            nonce = os.urandom(NONCE_SIZE)
            sealed = cipher.encrypt(nonce, p.SerializeToString(), aad)
            out.append(
                Payload(
                    metadata={"encoding": ENCRYPTED, KEY_ID: current.encode()}, data=nonce + sealed
                )
            )
        return out

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        out = []
        for p in payloads:
            if p.metadata.get("encoding") != ENCRYPTED:
                out.append(p)
                continue
            key_id = p.metadata.get(KEY_ID, b"").decode(errors="replace")
            cipher = self._ciphers.get(key_id)
            if cipher is None:
                raise CodecKeyError(self._unknown(key_id))
            try:
                nonce, sealed = p.data[:NONCE_SIZE], p.data[NONCE_SIZE:]
                raw = cipher.decrypt(nonce, sealed, _associated_data(key_id))
            except InvalidTag:
                raise TamperedPayload(
                    f"a payload encrypted with codec key {key_id!r} failed authentication: "
                    "it was altered, or that id names different key material here"
                ) from None
            inner = Payload()
            inner.ParseFromString(raw)
            out.append(inner)
        return out

    def _unknown(self, key_id: str) -> str:
        if not key_id:
            return f"an {ENCRYPTED.decode()} payload names no key id ({KEY_ID})"
        held = ", ".join(repr(i) for i in self.keys.ids)
        have = f"this process holds {held}" if held else "this process has no codec keys"
        return (
            f"a payload is encrypted with codec key {key_id!r}, and {have}: "
            "add that key to FORGE_CODEC_KEYS or FORGE_CODEC_KEY_FILE"
        )
