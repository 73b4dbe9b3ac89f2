"""Encryption at rest: the AES-GCM payload codec after compression, keys by id
(rotation), and the errors an operator acts on. No server: the converter alone."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from temporalio.api.common.v1 import Payload
from temporalio.converter import DataConverter

from forge.wire.codec import ENCODING, ZlibCodec, data_converter
from forge.wire.encryption import (
    ENCRYPTED,
    KEY_ID,
    CodecKeyError,
    CodecKeys,
    TamperedPayload,
    format_key,
    new_key,
)

SECRET = "sk-live-0123456789abcdef"


def keys(*ids: str) -> CodecKeys:
    return CodecKeys.parse(",".join(format_key(i, new_key()) for i in ids))


def spec(n: int = 40) -> dict[str, Any]:
    """A job-like value with a secret, big enough to be compressed first."""
    return {
        "name": "db",
        "env": {"DB_PASSWORD": SECRET},
        "tasks": [{"name": f"t{i}", "cpu": 100} for i in range(n)],
    }


async def encode(converter: DataConverter, *values: Any) -> list[Payload]:
    return await converter.encode(list(values))


async def test_a_round_trip_gives_back_every_value_and_stores_only_ciphertext() -> None:
    k = keys("k1")
    converter = data_converter(k)
    big, small = spec(), {"env": {"X": SECRET}}  # one compressed, one too small to be
    payloads = await encode(converter, big, small, "tiny", None)
    assert [p.metadata["encoding"] for p in payloads] == [ENCRYPTED] * 4
    assert all(p.metadata[KEY_ID] == b"k1" for p in payloads)
    for p in payloads:
        assert SECRET.encode() not in p.SerializeToString()
        assert b"json/plain" not in p.data and ENCODING not in p.data  # inner metadata too
    assert await converter.decode(payloads, [dict, dict, str, type(None)]) == [
        big,
        small,
        "tiny",
        None,
    ]


async def test_compression_runs_before_encryption() -> None:
    """Ciphertext does not compress: encrypted first, the payload would be as big
    as its JSON."""
    value = spec(400)
    [plain] = await DataConverter.default.encode([value])
    converter = data_converter(keys("k1"))
    [sealed] = await encode(converter, value)
    assert len(sealed.data) < len(plain.data) / 4
    assert converter.payload_codec is not None
    [inner] = await converter.payload_codec.decode([sealed])
    assert inner.metadata["encoding"] == b"json/plain"


async def test_each_payload_gets_its_own_nonce() -> None:
    converter = data_converter(keys("k1"))
    a, b = await encode(converter, "same", "same")
    assert a.data != b.data and a.data[:12] != b.data[:12]


async def test_rotation_the_old_key_still_decrypts_and_the_new_one_encrypts() -> None:
    old = keys("2024-a")
    old_converter = data_converter(old)
    written_before = await encode(old_converter, spec())
    # step 1: the new key is added after the current one (decrypt only)
    standby = keys("2025-b")
    step1 = data_converter(old + standby)
    assert (await encode(step1, "x"))[0].metadata[KEY_ID] == b"2024-a"
    # step 2: the new key first; the old one kept for what history already holds
    rotated = data_converter(standby + old)
    written_after = await encode(rotated, spec())
    assert written_after[0].metadata[KEY_ID] == b"2025-b"
    assert await rotated.decode(written_before, [dict]) == [spec()]
    assert await rotated.decode(written_after, [dict]) == [spec()]
    # a process still on step 1 reads what a rotated one wrote: no downtime
    assert await step1.decode(written_after, [dict]) == [spec()]
    # a process that never got the new key cannot, and says which key it lacks
    with pytest.raises(CodecKeyError, match="'2025-b'"):
        await old_converter.decode(written_after, [dict])


async def test_an_unknown_key_id_is_an_error_naming_it_and_what_to_set() -> None:
    payloads = await encode(data_converter(keys("prod-7")), spec())
    with pytest.raises(CodecKeyError) as err:
        await data_converter(keys("dev-1", "dev-2")).decode(payloads, [dict])
    message = str(err.value)
    assert "'prod-7'" in message and "'dev-1', 'dev-2'" in message
    assert "FORGE_CODEC_KEYS" in message and "FORGE_CODEC_KEY_FILE" in message
    with pytest.raises(CodecKeyError, match=r"'prod-7'.*no codec keys"):
        await data_converter().decode(payloads, [dict])


async def test_tampered_ciphertext_is_rejected() -> None:
    converter = data_converter(keys("k1"))
    [p] = await encode(converter, spec())
    for at in (0, 12, len(p.data) // 2, len(p.data) - 1):  # nonce, body, tag
        bad = Payload()
        bad.CopyFrom(p)
        flipped = bytearray(p.data)
        flipped[at] ^= 0x01
        bad.data = bytes(flipped)
        with pytest.raises(TamperedPayload, match=r"'k1'.*failed authentication"):
            await converter.decode([bad], [dict])
    truncated = Payload(metadata=p.metadata, data=p.data[:20])
    with pytest.raises(TamperedPayload):
        await converter.decode([truncated], [dict])


async def test_the_key_id_is_bound_to_the_ciphertext() -> None:
    """Two ids with the same key material: relabelling a payload from one to the
    other still fails, because the id is authenticated as associated data."""
    key = new_key()
    shared = CodecKeys.parse(f"{format_key('a', key)},{format_key('b', key)}")
    converter = data_converter(shared)
    [p] = await encode(converter, spec())
    relabelled = Payload(metadata={**p.metadata, KEY_ID: b"b"}, data=p.data)
    with pytest.raises(TamperedPayload, match="'b'"):
        await converter.decode([relabelled], [dict])
    assert await converter.decode([p], [dict]) == [spec()]


async def test_payloads_from_before_encryption_still_decode() -> None:
    """An old history holds json/plain and binary/zlib payloads: the encrypting
    converter reads them as they are (replay depends on it)."""
    old = await encode(data_converter(), spec(), "small")
    assert old[0].metadata["encoding"] == ENCODING and old[1].metadata["encoding"] != ENCRYPTED
    assert await data_converter(keys("k1")).decode(old, [dict, str]) == [spec(), "small"]


async def test_without_keys_the_converter_compresses_only_as_before() -> None:
    [p] = await encode(data_converter(), spec())
    assert p.metadata["encoding"] == ENCODING
    assert KEY_ID not in p.metadata
    [inner] = await ZlibCodec().decode([p])
    assert SECRET in inner.data.decode()


# -------------------------------------------------------------------------- keys


def test_keys_parse_ids_in_order_the_first_current() -> None:
    k1, k2 = base64.b64encode(new_key()).decode(), base64.b64encode(new_key()).decode()
    text = f"# rotated 2025-01\nnew:{k2}\n\n old : {k1} , # trailing comment\n"
    parsed = CodecKeys.parse(text)
    assert parsed.ids == ["new", "old"] and parsed.current == "new"
    assert parsed.get("old") == base64.b64decode(k1)
    assert not CodecKeys.parse("  \n# nothing\n") and CodecKeys.parse("").current is None


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("nocolon", "entry 1 is not id:base64key"),
        (":" + base64.b64encode(b"k" * 32).decode(), "entry 1 is not id:base64key"),
        ("k1:***notbase64***", "key 'k1': not base64"),
        ("k1:" + base64.b64encode(b"short").decode(), "key 'k1': 5 bytes"),
        ("bad id:" + base64.b64encode(b"k" * 32).decode(), "key id 'bad id'"),
        (
            f"k1:{base64.b64encode(b'a' * 32).decode()},k1:{base64.b64encode(b'b' * 32).decode()}",
            "'k1' is listed twice",
        ),
    ],
)
def test_bad_keys_are_refused_without_showing_key_material(text: str, problem: str) -> None:
    with pytest.raises(ValueError) as err:
        CodecKeys.parse(text)
    assert problem in str(err.value)
    material = text.rpartition(":")[2]
    assert len(material) < 8 or material not in str(err.value)


def test_the_same_key_listed_twice_is_one_key() -> None:
    entry = format_key("k1", new_key())
    assert CodecKeys.parse(f"{entry}\n{entry}").ids == ["k1"]


def test_repr_shows_ids_never_key_bytes() -> None:
    key = new_key()
    k = CodecKeys.parse(format_key("k1", key))
    assert repr(k) == "CodecKeys(ids=['k1'])"
    assert base64.b64encode(key).decode() not in repr(k) + str(k)
    assert json.dumps(k.ids) == '["k1"]'
