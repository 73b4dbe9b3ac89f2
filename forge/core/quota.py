"""Queues and their quotas: how much of the cluster a team may hold, and the fit rule.

A job names its ``queue`` (``default``: no quota, today's behaviour). A queue limits
the resources it names, per resource: ``cpu`` (millicores), ``memory`` (MiB) and
each GPU model (devices; a shared replica counts its share, 300 milli = 0.3). What
a queue does not name it does not limit, except GPUs: a queue that names any GPU
model may use only the models it names (an ``A100`` quota is not a ``T4`` quota).

The fit rule is Kueue's ClusterQueue rule, per resource:

* without a ``cohort``, a queue holds at most its ``nominal``;
* in a cohort, it may hold up to ``nominal + borrowing_limit`` (no limit: as much as
  the cohort lends), and the cohort's members together never hold more than their
  pooled nominal: a member's ``nominal - lending_limit`` is its own (never lent), the
  rest is the cohort's to share. A queue above its own part draws on the pool.

Usage counts bound replicas (Kueue counts admitted workloads: Forge admits a
replica at the moment it is placed, so the two are the same here). Pure: the pass
(:mod:`forge.core.reconcile`) asks :class:`forge.core.admission.Admission` before
placing a replica of a queued job.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar, Literal, Protocol, Self

from pydantic import Field, model_validator

from forge.core.fields import Evolving, Model, Name
from forge.core.limits import GPU_MILLI, MAX_CPU, MAX_MEMORY
from forge.core.nodes import GpuDevice

__all__ = [
    "DEFAULT_QUEUE",
    "Ledger",
    "Limit",
    "QueuePreemption",
    "QueueSpec",
    "Quota",
    "Usage",
    "check_queues",
    "cost",
    "gpu_key",
    "held",
]

#: The queue a job is in unless it names one: no quota, never limited.
DEFAULT_QUEUE = "default"
#: A queue's usage: resource key -> amount (cpu millicores, memory MiB, GPU milli).
Usage = dict[str, int]
_NO_LIMIT = 1 << 62
_BIG = MAX_CPU * 1_000_000 + MAX_MEMORY


def gpu_key(model: str) -> str:
    """The usage key of one GPU model's devices (in milli)."""
    return f"gpu:{model}"


class Limit(Model):
    """One resource's quota in one queue (cpu millicores, memory MiB, GPU devices)."""

    nominal: int = Field(ge=0, le=_BIG)
    #: how far above ``nominal`` the queue may borrow from its cohort (None: no limit)
    borrowing_limit: int | None = Field(default=None, ge=0, le=_BIG)
    #: how much of ``nominal`` the cohort may borrow (None: all of it)
    lending_limit: int | None = Field(default=None, ge=0, le=_BIG)

    @model_validator(mode="after")
    def _lending(self) -> Self:
        if self.lending_limit is not None and self.lending_limit > self.nominal:
            raise ValueError(
                f"lending_limit ({self.lending_limit}) is above nominal ({self.nominal})"
            )
        return self


class Quota(Model):
    cpu: Limit | None = None
    memory: Limit | None = None
    #: by GPU model, in devices
    gpu: dict[Name, Limit] = Field(default_factory=dict, max_length=64)


class QueuePreemption(Model):
    """What a queue's replicas may preempt for it (Kueue's ``preemption``)."""

    #: the queue's own replicas of lower priority, for one its quota refused (or no
    #: node took): ``never`` (Kueue's default) or ``lower_priority``
    within_queue: Literal["never", "lower_priority"] = "never"
    #: replicas of the cohort's borrowing queues, to take back its nominal quota or
    #: claim its fair share: at ``any`` priority (today's), ``lower_priority``
    #: (strictly below the claimant's), or ``never``
    reclaim_within_cohort: Literal["any", "lower_priority", "never"] = "any"


class QueueSpec(Evolving):
    """A queue as users declare it (``forge queue apply``)."""

    _new_fields: ClassVar[tuple[str, ...]] = ("preemption",)

    name: Name
    cohort: Name | None = None
    #: fair-share weight in its cohort: what it borrows is divided by it, so a queue
    #: of weight 2 borrows twice what one of weight 1 does when both want more
    weight: int = Field(default=1, ge=1, le=1000)
    quota: Quota = Quota()
    preemption: QueuePreemption = QueuePreemption()

    @model_validator(mode="after")
    def _not_default(self) -> Self:
        if self.name == DEFAULT_QUEUE:
            raise ValueError(f"{DEFAULT_QUEUE!r} is the queue without a quota; name another")
        return self

    def limits(self) -> dict[str, tuple[int, int, int]]:
        """Per usage key: (nominal, borrowing limit, lending limit) in usage units."""
        q, out = self.quota, {}
        for key, lim, unit in (("cpu", q.cpu, 1), ("memory", q.memory, 1)):
            if lim is not None:
                out[key] = _units(lim, unit)
        for model in sorted(q.gpu):
            out[gpu_key(model)] = _units(q.gpu[model], GPU_MILLI)
        return out


def _units(lim: Limit, unit: int) -> tuple[int, int, int]:
    borrow = _NO_LIMIT if lim.borrowing_limit is None else lim.borrowing_limit * unit
    lend = lim.nominal if lim.lending_limit is None else lim.lending_limit
    return lim.nominal * unit, borrow, lend * unit


def check_queues(queues: Iterable[QueueSpec]) -> dict[str, QueueSpec]:
    """The queues by name, or ValueError naming the first duplicate."""
    out: dict[str, QueueSpec] = {}
    for q in queues:
        if q.name in out:
            raise ValueError(f"queue {q.name!r} is declared twice")
        out[q.name] = q
    return out


def cost(cpu: int, memory: int, models: Iterable[str], milli: int) -> Usage:
    """What one replica holds, as usage: ``models`` names its devices' models (one
    per device), ``milli`` each device's share (1000: whole)."""
    use: Usage = {"cpu": cpu, "memory": memory}
    for m in models:
        key = gpu_key(m)
        use[key] = use.get(key, 0) + milli
    return use


class Ledger:
    """What the bindings of queued jobs hold, per queue, kept as bindings come and go
    (``Carry.add`` / ``Carry.drop``), so a pass reads each queue's usage without a
    walk over the bindings. Each binding's charge is kept with it: a job that moves
    to another queue keeps its running replicas charged where they were admitted."""

    __slots__ = ("charged", "count", "fresh", "queued", "usage")

    def __init__(self) -> None:
        self.charged: dict[str, tuple[str, Usage]] = {}
        self.usage: dict[str, Usage] = {}
        #: per queue: its bound replicas, and those the last pass left queued
        self.count: dict[str, int] = {}
        self.queued: dict[str, int] = {}
        #: what the admit stage already computed for the bindings it made (taken
        #: once, by :meth:`hold`)
        self.fresh: dict[str, Usage] = {}

    def hold(self, wid: str, queue: str, b: _Held, node: _Devices) -> None:
        """Charge the binding ``wid`` of a job in ``queue`` (a binding charged
        before, restamped or moved, is charged again)."""
        if wid in self.charged:
            self.drop(wid)
        use = self.fresh.pop(wid, None) or held(b, node)
        self.charged[wid] = (queue, use)
        self.count[queue] = self.count.get(queue, 0) + 1
        mine = self.usage.setdefault(queue, {})
        for key, amount in use.items():
            mine[key] = mine.get(key, 0) + amount

    def drop(self, wid: str) -> None:
        """The binding ``wid`` is gone: its charge with it (none: nothing)."""
        held = self.charged.pop(wid, None)
        if held is not None:
            self.count[held[0]] -= 1
            mine = self.usage[held[0]]
            for key, amount in held[1].items():
                mine[key] -= amount


def held(b: _Held, node: _Devices) -> Usage:
    """What a binding holds on its node, as usage (its devices by their model)."""
    if not b.gpu_ids:  # the common case, once per binding of a queued job
        return {"cpu": b.cpu, "memory": b.memory}
    models = {d.id: d.model for d in node.gpus}
    return cost(b.cpu, b.memory, (models.get(i, "") for i in b.gpu_ids), b.gpu_milli or GPU_MILLI)


class _Held(Protocol):
    @property
    def cpu(self) -> int: ...
    @property
    def memory(self) -> int: ...
    @property
    def gpu_ids(self) -> tuple[str, ...]: ...
    @property
    def gpu_milli(self) -> int: ...


class _Devices(Protocol):
    @property
    def gpus(self) -> tuple[GpuDevice, ...]: ...
