"""The data converter shared by the worker and every client: pydantic JSON plus a
zlib payload codec.

Compression matters here because a pass's persist delta and a snapshot page are
repetitive JSON (the same job, group and node names over and over): zlib shrinks
them about tenfold, which keeps them far below Temporal's 512 KiB payload warning
and the history small. Small payloads are left alone (compressing 40 bytes costs
more than it saves), and a payload is only marked compressed when it got smaller,
so the codec is safe to add to a namespace that already has history.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Sequence

from temporalio.api.common.v1 import Payload
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import DataConverter, PayloadCodec

__all__ = ["ENCODING", "ZlibCodec", "data_converter"]

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


def data_converter() -> DataConverter:
    return dataclasses.replace(pydantic_data_converter, payload_codec=ZlibCodec())
