"""``omit_defaults``: the named fields leave the dump while they hold their default,
and only they; an old payload (without them) reads back equal."""

from __future__ import annotations

from pydantic import BaseModel, Field

from forge.serialize import omit_defaults


class _M(BaseModel):
    seq: int = 0
    health: dict[str, bool] = Field(default_factory=dict)
    healthy: bool | None = None
    count: int = 0
    kept: list[int] = Field(default_factory=list)

    _omit = omit_defaults("health", "healthy", "count")


def test_the_named_fields_are_left_out_while_default() -> None:
    assert _M().model_dump() == {"seq": 0, "kept": []}
    assert _M().model_dump_json() == '{"seq":0,"kept":[]}'


def test_a_value_other_than_the_default_is_kept_even_when_falsy() -> None:
    m = _M(healthy=False, health={"a": False}, count=3)
    assert m.model_dump() == {
        "seq": 0,
        "health": {"a": False},
        "healthy": False,
        "count": 3,
        "kept": [],
    }
    assert _M.model_validate_json(m.model_dump_json()) == m


def test_an_old_payload_reads_back_equal() -> None:
    assert _M.model_validate_json('{"seq": 4, "kept": []}') == _M(seq=4)
