"""Queues from a client: apply them, read them (forge.wire.queues).

The update goes to the cluster workflow: durable once accepted, it returns after
the pass that planned with it (a raised quota admits at once), whose published
status holds the queues. Reads go to that status in the store, as ``forge status``
does; without a store, to the ``queues`` query (best-effort while a worker takes
the run over, and each one a query the worker answers).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import TYPE_CHECKING, Any

from forge.client import failures, finish
from forge.core.quota import QueueSpec
from forge.wire import queues as q

if TYPE_CHECKING:
    from forge.client.client import ForgeClient

__all__ = ["apply_queues", "read_queues"]


async def apply_queues(
    fc: ForgeClient, put: Sequence[QueueSpec], delete: Sequence[str] = ()
) -> q.QueuesView:
    """Create or replace ``put`` and remove ``delete`` (all or nothing); the queues after."""
    req = q.ApplyQueues(queues=tuple(put), delete=tuple(delete))
    return await _forge_errors(fc, fc._update(q.UPDATE_APPLY_QUEUES, req, q.QueuesView))


async def read_queues(fc: ForgeClient) -> q.QueuesView:
    if fc.store is not None:
        from forge.client import reads

        found = await asyncio.to_thread(reads.queues, fc.store, fc.cluster)
        if found is not None:  # else nothing published yet: only the loop knows
            return q.QueuesView(queues=found)
    call = fc.handle().query(
        q.QUERY_QUEUES, result_type=q.QueuesView, rpc_timeout=finish.QUERY_TIMEOUT
    )
    return await _forge_errors(fc, call)


async def _forge_errors(fc: ForgeClient, call: Awaitable[Any]) -> q.QueuesView:
    """What Temporal raises leaves as a forge.errors kind, as ForgeClient's own do."""
    try:
        view: q.QueuesView = await call
    except Exception as err:
        kind = failures.translate(err, fc._where())
        if kind is None:
            raise
        raise kind from err
    return view
