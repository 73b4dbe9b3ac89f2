"""The data converter shared by the worker and every client: pydantic JSON, then a
zlib payload codec, then (with keys) the AES-GCM one of :mod:`forge.wire.encryption`.

Compression matters here because a pass's persist delta and a snapshot page are
repetitive JSON (the same job, group and node names over and over): zlib shrinks
them about tenfold, which keeps them far below Temporal's 512 KiB payload warning
and the history small. Small payloads are left alone (compressing 40 bytes costs
more than it saves), and a payload is only marked compressed when it got smaller,
so the codec is safe to add to a namespace that already has history.

Encryption comes after compression (ciphertext does not compress) and is undone
first. Every process that builds a converter (the worker, the CLI and
``ForgeClient``, ``forge dev``, ``forge codec-server``) builds it here, from the
same keys (``Settings.encryption_keys``), so none of them can write a payload
another cannot read.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Sequence

from temporalio.api.common.v1 import Payload
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import DataConverter, PayloadCodec

from forge.wire.encryption import ENCRYPTED, AesGcmCodec, CodecKeys

__all__ = ["ENCODING", "ENCRYPTED", "CodecChain", "ZlibCodec", "codec_chain", "data_converter"]

ENCODING = b"binary/zlib"
MIN_SIZE = 512


class ZlibCodec(PayloadCodec):
    """``max_decoded`` caps what one payload may inflate to. The worker leaves it
    unset (it only reads what it wrote itself); the codec server sets it, because it
    inflates whatever an HTTP client sends, and a few KiB of zlib can expand to
    gigabytes."""

    def __init__(self, max_decoded: int | None = None) -> None:
        self.max_decoded = max_decoded

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        out = []
        for p in payloads:
            raw = p.SerializeToString()
            if len(raw) < MIN_SIZE:
                out.append(p)
                continue
            packed = zlib.compress(raw, 6)
            if len(packed) >= len(raw):
                out.append(p)
                continue
            out.append(Payload(metadata={"encoding": ENCODING}, data=packed))
        return out

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        out = []
        for p in payloads:
            if p.metadata.get("encoding") != ENCODING:
                out.append(p)
                continue
            inner = Payload()
            inner.ParseFromString(self._inflate(p.data))
            out.append(inner)
        return out

    def _inflate(self, data: bytes) -> bytes:
        if self.max_decoded is None:
            return zlib.decompress(data)
        inflater = zlib.decompressobj()
        raw = inflater.decompress(data, self.max_decoded + 1)
        if len(raw) > self.max_decoded or inflater.unconsumed_tail:
            limit = f"{self.max_decoded:,}"
            raise ValueError(f"a {ENCODING.decode()} payload inflates past {limit} bytes")
        if not inflater.eof:
            raise zlib.error("truncated zlib stream")
        return raw


class CodecChain(PayloadCodec):
    """Codecs applied in order on encode and in reverse order on decode."""

    def __init__(self, codecs: Sequence[PayloadCodec]) -> None:
        self.codecs = tuple(codecs)

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        out = list(payloads)
        for codec in self.codecs:
            out = await codec.encode(out)
        return out

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        out = list(payloads)
        for codec in reversed(self.codecs):
            out = await codec.decode(out)
        return out


def codec_chain(keys: CodecKeys | None = None, *, max_decoded: int | None = None) -> CodecChain:
    """Compression, then encryption with ``keys``. Without keys the encryption
    stage encodes nothing and refuses an encrypted payload with an error naming
    its key id (rather than handing ciphertext on as if it were the value)."""
    return CodecChain([ZlibCodec(max_decoded=max_decoded), AesGcmCodec(keys or CodecKeys())])


def data_converter(keys: CodecKeys | None = None) -> DataConverter:
    """Forge's converter; ``keys`` from ``Settings.encryption_keys()`` (none: the
    payloads are compressed, not encrypted)."""
    return dataclasses.replace(pydantic_data_converter, payload_codec=codec_chain(keys))
