"""How Forge's payload models leave optional fields out of their JSON.

A field added to a model that crosses Temporal (a checkpoint, a published status,
an activity's answer) or that the store keeps changes the bytes every older
payload serialises to, and some of those bytes are compared: the persist digest
that recorded histories must reproduce, a checkpoint replayed by an older run. So
such a field is left out of the JSON while it holds its default, and an old
payload reads back the same. :func:`omit_defaults` is that rule, written once.

A leaf (pydantic only) so that the wire and the stores, which may not import each
other's upper parts, both use it.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, SerializerFunctionWrapHandler, model_serializer

__all__ = ["omit_defaults"]


def omit_defaults(*names: str) -> Any:
    """A wrap serializer for a model's body: the fields ``names`` are left out of
    its dump (Python and JSON) while they equal their default (``None``, ``0``,
    an empty list or dict); every other field is dumped as pydantic does::

        class ReportsOut(BaseModel):
            health: dict[str, bool] = Field(default_factory=dict)

            _omit = omit_defaults("health")
    """

    def serialize(self: BaseModel, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        if isinstance(data, dict):
            fields = type(self).model_fields
            for name in names:
                if getattr(self, name) == fields[name].get_default(call_default_factory=True):
                    data.pop(name, None)
        return data

    return model_serializer(mode="wrap")(serialize)
