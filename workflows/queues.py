"""Queues through the loop (forge.core.quota): the update that changes them, the
query that shows them (a job's ``queue`` is checked at submission: workflows.inputs).

The update posts a :class:`QueueWrite` to the mail like every change (workflows.mail):
the loop takes it at a recorded intake, so a replay plans each pass with the queues
it had live, whatever activation the handler ran in. The queues live in the loop's
state and its checkpoint (they are few: ``MAX_QUEUES``), and each pass hands them
to reconcile's admit stage. The persist after a change writes them all to the
store (:func:`unpersisted`), and a run started afresh reads them back with its
first page of jobs (:func:`restore`). The handlers are a base class of the workflow's
(:class:`QueueHandlers`): the kind of object keeps one module.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from temporalio import workflow
from temporalio.common import RawValue

from workflows.inputs import busy, refuse, update_arg

with workflow.unsafe.imports_passed_through():
    from forge.core.quota import Ledger, QueueSpec, check_queues
    from forge.wire import queues as q

if TYPE_CHECKING:
    from workflows.handlers import Handlers
    from workflows.state import LoopState

__all__ = ["QueueHandlers", "QueueWrite", "apply", "restore", "unpersisted", "view"]


@dataclass(frozen=True, slots=True)
class QueueWrite:
    """Queues to create or replace, and names to remove (workflows.mail)."""

    put: tuple[QueueSpec, ...]
    delete: tuple[str, ...]


def apply(st: LoopState, item: QueueWrite) -> None:
    """Make ``item`` part of the loop's queues (at an intake), kept sorted by name."""
    queues = dict(st.queues)
    for spec in item.put:
        queues[spec.name] = spec
    for name in item.delete:
        queues.pop(name, None)
    st.queues = {name: queues[name] for name in sorted(queues)}


def restore(st: LoopState, stored: list[QueueSpec] | None) -> None:
    """The queues a full load read from the store become the loop's when it has
    none: a run started afresh on the store (a terminated cluster started again)
    gets them back; a continued run carries its own in its checkpoint."""
    if stored and not st.queues:
        st.queues = {spec.name: spec for spec in sorted(stored, key=lambda s: s.name)}


def unpersisted(
    queues: dict[str, QueueSpec], persisted: dict[str, QueueSpec]
) -> list[QueueSpec] | None:
    """All the queues, for the pass's persist, when they changed since the run's last
    persist (each change makes a new map: compared by identity, bounded); None:
    unchanged. Never a write where neither has any: a cluster without queues persists
    exactly as before them."""
    if queues is persisted or not (queues or persisted):
        return None
    return list(queues.values())


class QueueHandlers:
    """The queue update (with its validator) and query, as methods the workflow
    inherits (workflows.handlers.Handlers): the SDK reads handlers off the class."""

    @workflow.update(name=q.UPDATE_APPLY_QUEUES)
    async def apply_queues(self, raw: RawValue) -> q.QueuesView:
        wf = cast("Handlers", self)
        req = update_arg(q.ApplyQueues, raw)
        wf.updates += 1
        await workflow.wait_condition(lambda: wf.ready)
        await wf._planned(wf._post(QueueWrite(req.queues, req.delete)))
        return view(wf)

    @apply_queues.validator
    def _validate_queues(self, raw: RawValue) -> None:
        wf = cast("Handlers", self)
        wf._refuse_if_busy()
        req = update_arg(q.ApplyQueues, raw)
        try:
            put = check_queues(req.queues)
        except ValueError as err:
            raise refuse(f"queues: {err}") from None
        if set(put) & set(req.delete):
            raise refuse(f"queues: {sorted(set(put) & set(req.delete))[0]!r} put and deleted")
        if len(set(wf.st.queues) | set(put)) > q.MAX_QUEUES:
            raise refuse(f"queues: a cluster holds at most {q.MAX_QUEUES}")
        if req.delete:  # bounded: the carry's per-queue counts, not a walk over the jobs
            carry = wf.st.carry
            if carry is None:
                raise busy()  # a run that has not planned yet: the client retries
            for name in sorted(set(req.delete)):
                bound, queued = carry.ledger.count.get(name, 0), carry.ledger.queued.get(name, 0)
                if bound or queued:
                    raise refuse(
                        f"delete: queue {name!r} has work admitted or waiting ({bound} "
                        f"replica(s) bound, {queued} queued); stop its jobs or move them "
                        "to another queue first"
                    )

    @workflow.query(name=q.QUERY_QUEUES)
    def queues_view(self) -> q.QueuesView:
        return view(cast("Handlers", self))


def view(wf: Handlers) -> q.QueuesView:
    """Each queue with what its bound replicas hold and how many wait, from the
    carry's running totals (bounded: no walk over the bindings; a run that has not
    planned yet shows no usage)."""
    st = wf.st
    ledger = st.carry.ledger if st.carry is not None else Ledger()
    return q.QueuesView(queues=views_of(st.queues, ledger))


def views_of(specs: Mapping[str, QueueSpec], ledger: Ledger) -> list[q.QueueView]:
    """``specs`` with ``ledger``'s totals: what the query answers and each pass
    publishes (at most :data:`forge.wire.queues.MAX_QUEUES`)."""
    return [
        q.QueueView(
            spec=spec,
            usage={k: v for k, v in ledger.usage.get(name, {}).items() if v},
            bound=ledger.count.get(name, 0),
            queued=ledger.queued.get(name, 0),
        )
        for name, spec in specs.items()
    ]
