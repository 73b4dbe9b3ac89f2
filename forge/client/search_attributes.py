"""Forge's search attributes: which, and creating them where the server lets us."""

from __future__ import annotations

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import (
    AddSearchAttributesRequest,
    ListSearchAttributesRequest,
)
from temporalio.client import Client

from forge.wire import contract as c

__all__ = ["SEARCH_ATTRIBUTES", "ensure_search_attributes"]

#: name -> type, registered by ``forge dev`` and by the worker at start.
SEARCH_ATTRIBUTES: dict[str, str] = {
    c.SA_CLUSTER: "Keyword",
    c.SA_PENDING: "Int",
    c.SA_BOUND: "Int",
    c.SA_NODES: "Int",
}
_SA_TYPES = {
    "Keyword": IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD,
    "Int": IndexedValueType.INDEXED_VALUE_TYPE_INT,
}


async def ensure_search_attributes(client: Client, namespace: str) -> list[str]:
    """Create Forge's search attributes where missing; returns the ones created.

    Raises ``RPCError`` when the server refuses (e.g. Temporal Cloud, where they
    are managed in the cloud console): the caller logs it and carries on, and the
    workflow then simply does not upsert them.
    """
    listed = await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=namespace)
    )
    have = set(listed.custom_attributes) | set(listed.system_attributes)
    missing = {k: _SA_TYPES[v] for k, v in SEARCH_ATTRIBUTES.items() if k not in have}
    if missing:
        await client.operator_service.add_search_attributes(
            AddSearchAttributesRequest(namespace=namespace, search_attributes=missing)
        )
    return sorted(missing)
