"""The field types and base classes every Forge model is built from.

Every model is strict (no silent coercion of ``"500"`` into 500), frozen, and
forbids unknown fields, so a typo in a job file is an error that names the field
instead of a setting that silently does nothing.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    Strict,
    model_serializer,
)

from forge.core.limits import MAX_CPU, MAX_MEMORY, MAX_STRING, NAME_PATTERN

__all__ = [
    "Bool",
    "Cpu",
    "Evolving",
    "Float",
    "Id",
    "Int",
    "IntAsStr",
    "Memory",
    "Model",
    "Name",
    "Seconds",
    "ShortStr",
    "int_as_str",
    "no_control",
]

Name = Annotated[str, Field(pattern=NAME_PATTERN, description="1-63 of [A-Za-z0-9._-]")]


def int_as_str(value: Any) -> Any:
    """A JSON integer as its decimal string; anything else unchanged (and then
    validated as a string: ``true`` and ``1.0`` stay errors)."""
    return str(value) if type(value) is int else value  # type(): True is an int too


#: A string id that may also arrive as a JSON integer (GPU device ids are 0, 1, ...
#: in nvidia-smi and most inventories): ``0`` is read as ``"0"``.
IntAsStr = BeforeValidator(int_as_str)
#: A Name (an id) that may be given as an integer: ``{"id": 0}`` is ``"0"``.
Id = Annotated[Name, IntAsStr]
# Numbers and booleans are strict (``"500"`` or ``"yes"`` is an error, not a
# coercion); containers are lax so YAML lists fill tuple fields and strings fill
# enums.
Int = Annotated[int, Strict()]
Float = Annotated[float, Strict()]
Bool = Annotated[bool, Strict()]
Cpu = Annotated[int, Strict(), Field(ge=0, le=MAX_CPU, description="millicores")]
Memory = Annotated[int, Strict(), Field(ge=0, le=MAX_MEMORY, description="MiB")]
ShortStr = Annotated[str, Field(max_length=MAX_STRING)]
Seconds = Annotated[float, Strict(), Field(ge=0, le=365 * 24 * 3600)]


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Evolving(Model):
    """A model that gained fields after workflow histories were recorded with it.

    Fields named in ``_new_fields`` are left out of a dump while they hold their
    default, so a model that does not use them dumps exactly as before: the
    workflow hashes node dumps (the persist digest) and measures job dumps (batch
    sizes), and a replayed history must see the same bytes.
    """

    _new_fields: ClassVar[tuple[str, ...]] = ()

    @model_serializer(mode="wrap")
    def _omit_unused_new_fields(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        if isinstance(data, dict):
            for name in self._new_fields:
                if name in data and getattr(self, name) == type(self).model_fields[name].default:
                    del data[name]
        return data


def no_control(value: str, what: str) -> str:
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise ValueError(f"{what} must not contain control characters")
    return value
