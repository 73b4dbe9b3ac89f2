"""Node operations are one typed union, and the wire error names are written once."""

from __future__ import annotations

import re
from pathlib import Path

import pydantic
import pytest

from forge.wire import contract as c
from forge.wire import errors

ROOT = Path(__file__).resolve().parents[2]


def test_a_node_operation_is_told_apart_by_its_op() -> None:
    adapter: pydantic.TypeAdapter[c.NodeOp] = pydantic.TypeAdapter(c.NodeOp)
    assert isinstance(adapter.validate_python({"op": "drain", "node_id": "n"}), c.DrainOp)
    assert isinstance(adapter.validate_python({"op": "lost", "node_id": "n"}), c.LostOp)
    with pytest.raises(pydantic.ValidationError):
        adapter.validate_python({"op": "reboot", "node_id": "n"})


def test_no_module_spells_a_wire_error_name_itself() -> None:
    names = {
        errors.BUSY,
        errors.INVALID_INPUT,
        errors.NOT_FOUND,
        errors.STALE_FENCE,
        errors.STORE_ERROR,
    }
    # as an ApplicationError type or compared with one (not a class in __all__)
    literal = re.compile(r"(type\s*=|==|_types=\[)\s*[\"'](" + "|".join(sorted(names)) + ")[\"']")
    offenders = [
        str(p.relative_to(ROOT))
        for d in ("forge", "workflows", "activities")
        for p in sorted((ROOT / d).rglob("*.py"))
        if p.name != "errors.py" and literal.search(p.read_text())
    ]
    assert offenders == []
