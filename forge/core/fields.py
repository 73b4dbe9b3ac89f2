"""The field types and base classes every Forge model is built from.

Every model is strict (no silent coercion of ``"500"`` into 500), frozen, and
forbids unknown fields, so a typo in a job file is an error that names the field
instead of a setting that silently does nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, ClassVar

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
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

    Done with each field's ``exclude_if`` (set once per class, here) rather than a
    wrap serializer: the dump stays in pydantic's compiled serializer, which made
    dumping a job ~2x faster, and a loop that measures and writes 50,000 submitted
    jobs dumps each more than once.
    """

    _new_fields: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        if not cls._new_fields:
            return
        for name in cls._new_fields:
            info = cls.model_fields[name]
            # a default_factory field has no default to equal: always dumped (as before)
            info.exclude_if = _equals(info.default)
        cls.model_rebuild(force=True)


def _equals(default: Any) -> Callable[[Any], bool]:
    def same(value: Any) -> bool:
        return bool(value == default)

    return same


def no_control(value: str, what: str) -> str:
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise ValueError(f"{what} must not contain control characters")
    return value
