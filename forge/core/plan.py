"""What a reconcile pass is told and what it returns: its options, the plan, and
the pending and failure records the cluster workflow keeps between passes.

``PendingEntry`` and ``FailureHistory`` are part of the workflow's state (carried
through continue-as-new, published in the loop status): their fields and the
reason texts in them are kept byte for byte.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

from forge.core.fields import Evolving
from forge.core.placement import DEFAULT_CANDIDATES, Binding
from forge.core.placement.scorers import Algorithm

if TYPE_CHECKING:
    from forge.core.models import Job, Request, TaskGroup
    from forge.core.placement import Choice
    from forge.core.release import Carry
    from forge.core.rolling import RolloutPlan

__all__ = [
    "DEFAULT_GPU_RESERVE",
    "Algorithm",
    "FailureHistory",
    "PendingEntry",
    "Plan",
    "Preempted",
    "ReconcileOptions",
    "binding",
]


#: The GPU reservation, per mille of each free GPU's share
#: of its node's cpu and memory. bench/gpu_placement.py measured 0-1000: 250-1000
#: all meet the original on every figure; 1000 strands the fewest GPUs and keeps
#: a node added for a pending GPU job whole for it (README "Benchmarks").
DEFAULT_GPU_RESERVE = 1000


class ReconcileOptions(Evolving):
    """How a pass places. Every field that changes placement choices defaults to the
    behaviour old workflow histories were made with: the workflow turns new
    behaviour on under ``workflow.patched`` so replay never diverges.

    Work that asks no GPU may use a GPU node's cpu and memory only beyond its free
    GPUs' reservation (``gpu_reserve`` per mille of each free GPU's share;
    :data:`DEFAULT_GPU_RESERVE` unless set).
    """

    _new_fields = (
        "preemption",
        "min_gap",
        "preemption_cooldown",
        "disruption_budgets",
        "topology",
        "gangs",
        "spread_down",
        "held_back_deferred",
        "settle_superseded",
        "refill_waiting",
        "gang_attempts",
    )

    algorithm: Algorithm = "binpack"
    candidates: int = Field(
        default=DEFAULT_CANDIDATES, ge=0, description="nodes scored per replica; 0 = all"
    )
    backoff_base: float = Field(default=1.0, gt=0)
    backoff_cap: float = Field(default=300.0, gt=0)
    max_placements: int = Field(
        default=20_000, ge=1, description="placements per pass; the rest go next pass"
    )
    max_work: int = Field(
        default=0,
        ge=0,
        description="node checks and scores per pass before the rest is deferred to the "
        "next pass (0 = no limit); the workflow sets it, so one pass stays far inside "
        "Temporal's 2 s activation limit whatever the cluster",
    )
    pending_units: int = Field(
        default=1,
        ge=1,
        le=100,
        description="work units a replica tried and left pending costs (formatting why, "
        "its backoff entry): the workflow charges more than a node check under "
        "work-budget-2, so retrying thousands of unplaceable replicas stays in budget",
    )
    seed: int = 0
    placement_version: int = Field(
        default=2,
        ge=1,
        le=2,
        description="ignored: there is one placement (version 1, without the GPU "
        "reservation, was folded into it); accepted because recorded workflow inputs "
        "name it",
    )
    gpu_reserve: int | None = Field(
        default=None, ge=0, le=1000, description="per mille; None: DEFAULT_GPU_RESERVE"
    )
    rollouts: bool = Field(
        default=False,
        description="rolling updates (forge.core.rolling): a changed task spec replaces "
        "replicas in waves instead of releasing them all; placements record their version",
    )
    health_checks: bool = Field(
        default=False,
        description="with rollouts: a replica of a group that declares a check counts "
        "healthy only once its check passed (the health given to reconcile)",
    )
    preemption: bool = Field(
        default=True,
        description="a replica that fits nowhere may evict replicas of jobs at least "
        "min_gap priority points lower (forge.core.preemption); the workflow turns it on "
        "under a patch, so histories recorded before it replay without",
    )
    min_gap: int = Field(
        default=10, ge=1, le=99, description="priority points a victim is below its preemptor"
    )
    preemption_cooldown: float = Field(
        default=600.0,
        ge=0,
        le=7 * 24 * 3600,
        description="seconds during which a preempted replica is not preempted again",
    )

    disruption_budgets: bool = Field(
        default=True,
        description="a group's disruption budget bounds node drains and rolling-update "
        "waves as well as preemption, all together (forge.core.disruption); off: drains "
        "release at once, rollouts go by max_parallel only and preemption counts alone. "
        "The workflow turns it on under a patch, so histories recorded before it replay",
    )

    topology: bool = Field(
        default=True,
        description="groups' distinct_hosts and spread rules (forge.core.placement."
        "topology); the workflow turns them on under a patch, so histories recorded "
        "before them replay without",
    )

    gangs: bool = Field(
        default=True,
        description="groups with gang: true are placed all or nothing and, with "
        "on_member_loss restart_all, released whole when a member is lost; the workflow "
        "turns it on under a patch, so histories recorded before it replay without",
    )

    spread_down: bool = Field(
        default=True,
        description="a scale-down of a group with do_not_schedule spread rules that "
        "leaves a rule past max_skew moves kept replicas off the most loaded value into "
        "the slots the scale-down freed (forge.core.spread_down), as if it released from "
        "the most loaded value first; the workflow turns it on under a patch",
    )
    held_back_deferred: bool = Field(
        default=True,
        description="replicas the GPU reservation turned away that the pass's placement "
        "limit then kept from their retry are deferred to the next pass (tried at once) "
        "instead of keeping a backoff while a node could take them; the workflow turns "
        "it on under a patch",
    )
    settle_superseded: bool = Field(
        default=True,
        description="with rollouts: a spec changed while a rollout's last wave settles "
        "waits for that wave, and the rollout's version, now completed, becomes the new "
        "rollout's revert target (forge.core.rolling); off: the new spec takes over at "
        "once and reverts to the version before; the workflow turns it on under a patch",
    )
    refill_waiting: bool = Field(
        default=True,
        description="the room a pass's preemptions free is offered to the replicas "
        "still waiting out an earlier backoff as well, in placement order with those "
        "refused this pass (forge.core.preempting ``refill``), not only to those and "
        "the victims: a backed-off replica is not left pending while a node can take "
        "it; the workflow turns it on under a patch",
    )

    gang_attempts: bool = Field(
        default=True,
        description="a batch gang restarted whole because a member failed spends one "
        "attempt of the gang: every member carries the gang's failure times (forge.core."
        "releasing); off: each member counts its own; the workflow turns it on under a patch",
    )

    @property
    def effective_gpu_reserve(self) -> int:
        return DEFAULT_GPU_RESERVE if self.gpu_reserve is None else self.gpu_reserve


class PendingEntry(BaseModel):
    """Why a desired replica is unbound and when it may be tried again.

    kind: ``backoff`` (no node fit), ``reschedule`` (failed; waiting the policy's
    delay), ``exhausted`` (failed too often within the policy's interval: tried
    again at ``not_before``), ``queued`` (its queue's quota is spent: tried at the
    next pass, forge.core.admitting), ``failed`` (never tried again: its end was
    fatal, ``FailureHistory.fatal``; no deadline, so nothing wakes the loop for it).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["backoff", "reschedule", "exhausted", "deferred", "failed", "queued"] = "backoff"
    attempts: int = 0
    not_before: float = 0.0
    reasons: tuple[str, ...] = ()


class FailureHistory(Evolving):
    """Recent failures of one replica, for its group's reschedule policy, and its
    last preemption (kept for the cooldown): who preempted it, when, and the
    priority it may preempt up to since (``preempted_cap``: no cascades).
    ``fatal``: why its last end can never be retried (forge.core.kinds.fatal; set by
    the loop as it hears the end): it waits as ``failed`` for good."""

    _new_fields = ("preempted_at", "preempted_by", "preempted_cap", "fatal")

    times: tuple[float, ...] = ()
    last_node: str = ""
    preempted_at: float = 0.0
    preempted_by: str = ""
    preempted_cap: int = 0
    fatal: str = ""

    def cooling(self, now: float, cooldown: float) -> bool:
        """Preempted within the cooldown: not a victim again yet."""
        return bool(self.preempted_by) and now < self.preempted_at + cooldown


@dataclass(frozen=True, slots=True)
class Preempted:
    """One preemption of a pass: ``preemptor`` bound to ``node`` in place of
    ``victims`` (workload ids), at ``at``."""

    preemptor: str
    node: str
    victims: tuple[str, ...]
    at: float


@dataclass(slots=True)
class Plan:
    """The outcome of a pass. ``bindings`` is the complete new actual state."""

    bindings: dict[str, Binding]
    placed: list[Binding] = field(default_factory=list)
    released: list[tuple[str, str]] = field(default_factory=list)  # (workload id, reason)
    pending: dict[str, PendingEntry] = field(default_factory=dict)
    failures: dict[str, FailureHistory] = field(default_factory=dict)
    next_wake: float | None = None
    deferred: int = 0
    desired: int = 0
    work: int = 0  # node checks and scores the pass spent (bounded by max_work)
    dropped: list[Binding] = field(default_factory=list)  # the bindings ``released`` names
    carry: Carry | None = None  # hand it to the next pass (see Carry)
    rollouts: RolloutPlan | None = None  # with options.rollouts: what rolling decided
    preemptions: list[Preempted] = field(default_factory=list)
    #: replicas kept on draining nodes this pass: their groups' budgets are spent
    drain_held: list[str] = field(default_factory=list)
    #: the next pass should run at once: a group whose budget held a drain or a
    #: wave back got a replica bound again, so the next one may go
    again: bool = False
    #: this pass's preemptions freed capacity after its placements, which its
    #: refill may not have used all of (a placement limit or the work budget, or
    #: replicas backed off before the eviction that the refill does not retry):
    #: the next pass runs at once and as one that freed capacity (every backed-off
    #: replica tried), so nothing that fits waits out a backoff (invariant 4)
    freed: bool = False

    @property
    def changed(self) -> bool:
        return bool(self.placed or self.released)


def binding(
    job: Job, g: TaskGroup, ordinal: int, choice: Choice, req: Request, options: ReconcileOptions
) -> Binding:
    """The binding a placement makes (with rollouts on, recording the group version)."""
    return Binding(
        job.id,
        g.name,
        ordinal,
        choice.node.id,
        choice.gpu_ids,
        req.cpu,
        req.memory,
        gpu_milli=req.gpu_milli,
        version=g.version if options.rollouts else "",
    )
