"""What handlers hand the loop: one list in arrival order, taken by passes at points
history fixes.

Why not let handlers change the loop's state directly, as they did: a pass planned
from "whatever the handlers had done by now", and *when* a handler runs relative to
the loop is not something history fixes. On a cold worker Core may run an update (or
a query's trailing events, with an older clock) in a different activation than the
live run did (sdk-rust #1146, sdk-python #1591, RELIABILITY.md), so a replay could
plan a pass with one more or one fewer change and diverge from what the store holds.

So under ``workflows.patches.PASS_INTAKE`` a handler only *posts* an item here (in
the order Temporal delivered the handlers, which replay keeps), and the loop takes
items at an *intake*: a local activity that records how many items it saw (and the
clock, the watch, whether continue-as-new is due). Live, the intake's result is what
the loop saw; replayed, it is what history recorded, so each pass takes exactly the
items it took live, whatever activation the handlers ran in.
"""

from __future__ import annotations

from dataclasses import dataclass

from temporalio import workflow

from workflows.queues import QueueWrite

with workflow.unsafe.imports_passed_through():
    from forge.core.models import Job
    from forge.wire import contract as c

__all__ = [
    "Budget",
    "Dropped",
    "Failed",
    "Item",
    "JobWrite",
    "Mail",
    "NodeOps",
    "Promote",
    "Reset",
]


@dataclass(frozen=True, slots=True)
class JobWrite:
    """Put (or, with ``job`` None, delete) a job; ``size`` is its JSON size."""

    job_id: str
    job: Job | None
    size: int


@dataclass(frozen=True, slots=True)
class NodeOps:
    """Node operations (register, remove, lost, drain) in the order they came."""

    ops: tuple[c.NodeOp, ...]


@dataclass(frozen=True, slots=True)
class Failed:
    """Replicas reported failed, each on the node the sender saw it on (if said)."""

    workload_ids: tuple[str, ...]
    on: tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Promote:
    """Rollouts (``job/group``) promoted past their canaries."""

    names: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Budget:
    """The watchdog's lowered pass budget."""

    max_work: int


@dataclass(frozen=True, slots=True)
class Reset:
    """The watchdog's report that this run is a reset of ``from_run``."""

    from_run: str
    cause: str


@dataclass(frozen=True, slots=True)
class Dropped:
    """A signal that could not be used (shown by the next pass's status)."""

    name: str
    problem: str


Item = JobWrite | NodeOps | Failed | Promote | Budget | Reset | Dropped | QueueWrite


class Mail:
    """Items posted by handlers; ``taken`` of them moved into the loop's state by
    intakes, ``planned`` of them planned by a committed pass."""

    def __init__(self) -> None:
        self.items: list[Item] = []  # the untaken ones: items[0] is number taken + 1
        self.taken = 0
        self.planned = 0
        self.bytes = 0  # job JSON of the untaken items

    @property
    def total(self) -> int:
        """How many items were ever posted (the number an intake records)."""
        return self.taken + len(self.items)

    def pending(self) -> bool:
        return bool(self.items)

    def post(self, item: Item) -> int:
        """Post an item; returns its number (1-based), which a handler waits on."""
        self.items.append(item)
        if isinstance(item, JobWrite):
            self.bytes += item.size
        return self.total

    def take(self, upto: int, room: int) -> list[Item]:
        """The untaken items numbered up to ``upto``, in order, stopping before a job
        write that would take the job JSON past ``room`` bytes (never before the
        first item: a pass always makes progress)."""
        n = min(max(0, upto - self.taken), len(self.items))
        out: list[Item] = []
        for item in self.items[:n]:
            if isinstance(item, JobWrite):
                if out and item.size > room:
                    break
                room -= item.size
                self.bytes -= item.size
            out.append(item)
        del self.items[: len(out)]
        self.taken += len(out)
        return out

    def current(self, job_id: str) -> tuple[bool, Job | None]:
        """Whether an untaken item writes ``job_id``, and the newest such write (a
        job, or None for a delete)."""
        for item in reversed(self.items):
            if isinstance(item, JobWrite) and item.job_id == job_id:
                return True, item.job
        return False, None
