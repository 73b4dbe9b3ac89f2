"""Queues on the wire: the update that changes them and the query that shows them.

Both sides name them from here: ``forge queue`` (:mod:`forge.client.queues`), the
raw ``temporal workflow update execute --name apply_queues --input '{...}'``, and
the cluster workflow (:mod:`workflows.queues`). Payloads are plain JSON: a queue
as :class:`forge.core.quota.QueueSpec` writes it.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from forge.core.fields import Name
from forge.core.quota import QueueSpec, Usage

__all__ = [
    "MAX_QUEUES",
    "QUERY_QUEUES",
    "UPDATE_APPLY_QUEUES",
    "ApplyQueues",
    "QueueView",
    "QueuesView",
]

UPDATE_APPLY_QUEUES = "apply_queues"
QUERY_QUEUES = "queues"
#: Queues one cluster may hold: each pass's admission looks at a cohort's members,
#: and the checkpoint carries them all.
MAX_QUEUES = 256


class ApplyQueues(BaseModel):
    """Create or replace ``queues`` (by name) and remove ``delete``, all or nothing."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    queues: tuple[QueueSpec, ...] = Field(default=(), max_length=MAX_QUEUES)
    delete: tuple[Name, ...] = Field(default=(), max_length=MAX_QUEUES)


class QueueView(BaseModel):
    """One queue: as declared, what its bound replicas hold (cpu millicores, memory
    MiB, ``gpu:<model>`` in milli-devices), how many are bound, and how many the
    last pass left queued."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    spec: QueueSpec
    usage: Usage = Field(default_factory=dict)
    bound: int = 0
    queued: int = 0


class QueuesView(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    queues: list[QueueView] = Field(default_factory=list)
