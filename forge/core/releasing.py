"""Phase 1 of a pass: what leaves its node, and why.

:class:`Releasing` is the release half of :class:`forge.core.reconcile._Pass`: it
holds the steps that take bindings away, in the order the driver runs them:
**release** what is no longer wanted where it is (:mod:`forge.core.release`), the
**drain** of draining nodes within each group's disruption budget, the **roll** of
rolling updates' waves (:mod:`forge.core.rolling`), and the **gang** restarts that a
lost member causes. Every release goes through one method (:meth:`Releasing._release`),
which keeps the failure histories, so the place phase that follows sees one
consistent plan.

It is a base class rather than a set of functions because the steps share the
pass's state (the plan, the bound counts, the groups a budget held back) and run
once per pass each: nothing here is on the per-replica placement path. Pure like the
rest of :mod:`forge.core`: no clock, no I/O, deterministic orders only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from forge.core.disruption import budget_left
from forge.core.groups import Bound, Group, GroupKey
from forge.core.models import Job, Node, TaskGroup, workload_id
from forge.core.placement import Binding, Cluster
from forge.core.plan import FailureHistory, PendingEntry, Plan, ReconcileOptions
from forge.core.recheck import release_changed
from forge.core.release import DRAINING, Carry, release_all
from forge.core.rolling import GroupRollout, plan_rollouts
from forge.core.rollout import BUDGET_WAIT
from forge.core.spread_down import SPREAD_DOWN, spread_moves

__all__ = ["COMPLETE", "MEMBER_LOST", "RELEASE_UNITS", "Releasing", "restarts_a_batch_gang"]

#: The release reason of a batch replica whose tasks all exited 0.
COMPLETE = "complete"

#: Work units one binding costs the release phase (a node check costs one).
RELEASE_UNITS = 2

#: Release reasons that break a gang (a restart_all gang then releases the rest, to
#: be placed again together): a member lost, or replaced by a rolling update's wave
#: (a gang runs one version: it is updated whole). Not a scale-down or a stop.
MEMBER_LOST = frozenset(
    {
        "node removed",
        "node lost",
        "node draining",
        "failed",
        "node capacity changed",
        "constraints changed",
        "rollout",
    }
)


class Releasing:
    """The release steps of a pass (1, 1a-1d); the pass sets every attribute
    below in its ``__init__`` before the driver calls them."""

    jobs: Mapping[str, Job]
    nodes: Mapping[str, Node]
    pending: Mapping[str, PendingEntry]
    now: float
    options: ReconcileOptions
    carry: Carry | None
    given_failures: Mapping[str, FailureHistory]
    failures: dict[str, FailureHistory]
    failed: set[str]
    completed: set[str]
    just_failed: set[str]
    node_ok: dict[tuple[str, GroupKey], bool]
    changed_jobs: list[str]
    groups: dict[GroupKey, Group]
    release_work: int
    cluster: Cluster
    plan: Plan
    bound: Bound | dict[GroupKey, int]
    held: list[tuple[str, Binding]] | None
    limited: set[GroupKey]

    def _release(self, wid: str, b: Binding, reason: str) -> None:
        """Release one binding; a failed one enters its failure history. A batch
        replica that completed is released as failed ones are (it is in ``failed``)
        but says so and is no failure."""
        if reason == "failed" and wid in self.completed:
            reason = COMPLETE
        self.plan.released.append((wid, reason))
        self.plan.dropped.append(b)
        if reason == "failed":
            entry = self.groups.get((b.job, b.group))
            self.just_failed.add(wid)
            past = self.given_failures.get(wid, FailureHistory())
            window = entry.spec.reschedule.interval if entry else 0.0
            now = self.now
            times = (*tuple(t for t in past.times if t > now - window), now)
            self.failures[wid] = FailureHistory(
                times=times[-64:], last_node=b.node, fatal=past.fatal
            )

    def release(self, bindings: Mapping[str, Binding]) -> None:
        """1. Release what is no longer wanted where it is (forge.core.release)."""
        carry, rolling = self.carry, self.options.rollouts
        if carry is None:
            checked = len(bindings)
            self.bound = release_all(
                self.plan.bindings,
                bindings,
                self.groups,
                self.cluster,
                self.failed,
                self.node_ok,
                self._release,
                rolling,
                self.held,
            )
        else:
            checked = release_changed(
                carry,
                self.jobs,
                self.nodes,
                self.groups,
                self.changed_jobs,
                self.failed,
                self.node_ok,
                self._release,
                rolling,
                self.held,
            )
            self.bound = Bound(carry.by_group)
        self.release_work = RELEASE_UNITS * checked

    def disruption_left(self, key: GroupKey) -> int | None:
        """What the group's disruption budget lets go now (forge.core.disruption)."""
        bound = self.bound
        return budget_left(self.groups, key, lambda k: bound.get(k, 0))

    def _unbind(self, wid: str, b: Binding) -> None:
        """Take a kept binding off its node and out of the plan (and the bound count)."""
        self.cluster.by_id[b.node].unhold(b)
        if self.carry is not None:
            self.carry.drop(wid, b)  # (the group's bound count with it)
        else:
            del self.plan.bindings[wid]
            assert isinstance(self.bound, dict)
            self.bound[(b.job, b.group)] -= 1

    def drain(self) -> None:
        """1a. Release the replicas held on draining nodes (budgeted groups'), each
        while its group's disruption budget lets; the rest wait on their node."""
        held = self.held
        if not held:
            if self.carry is not None:
                self.carry.draining = {}
            return
        waiting: dict[str, None] = {}
        for wid, b in sorted(held, key=lambda x: x[0]):  # one order, carried or not
            key = (b.job, b.group)
            left = self.disruption_left(key)
            if left is not None and left <= 0:
                waiting[wid] = None
                self.limited.add(key)
                continue
            self._unbind(wid, b)
            self._release(wid, b, DRAINING)
        self.plan.drain_held = list(waiting)
        if self.carry is not None:
            self.carry.draining = waiting

    def roll(
        self,
        rollouts: Mapping[str, GroupRollout],
        since: Mapping[str, float],
        promoted: Mapping[str, None],
        health: Mapping[str, bool] | None,
    ) -> None:
        """1b. Rolling updates: old versions replaced in waves (forge.core.rolling)."""
        plan, carry = self.plan, self.carry
        pairs = zip(plan.released, plan.dropped, strict=True)
        failed_now = {w: b for (w, why), b in pairs if why == "failed"}
        # A group with no binding has no replica off its version; one with bindings
        # all compared with their group's version before (versions_seen), whose job
        # did not change, has none either: neither needs looking at (beside the
        # groups rolling now, which plan_rollouts adds).
        if carry is not None and carry.versions_seen:
            only = set(carry.roll_check)
            jobs = self.jobs
            only.update((j, g.name) for j in self.changed_jobs if j in jobs for g in jobs[j].groups)
        else:
            only = {k for k, n in self.bound.items() if n}  # every bound group
        plan.rollouts = plan_rollouts(
            groups=self.groups,
            bindings=plan.bindings,
            rollouts=rollouts,
            since=since,
            failed=failed_now,
            promoted=promoted,
            health=health,
            now=self.now,
            only=only,
            budget=self.disruption_left if self.options.disruption_budgets else None,
            settle=self.options.settle_superseded,
        )
        for wid in plan.rollouts.stop:
            b = plan.bindings[wid]
            self._unbind(wid, b)
            self._release(wid, b, "rollout")
        for name, s in plan.rollouts.steps.items():
            if s.waiting == BUDGET_WAIT:
                job_id, group = name.split("/", 1)
                self.limited.add((job_id, group))

    def release_gangs(self) -> None:
        """1c. A gang (``on_member_loss: restart_all``) that lost a member in this
        pass (its node lost, drained, removed or shrunk, a task failed, a rolling
        update's wave) releases the rest, so the place phase places it again,
        together (after a rollout's first wave: all of it on the new version)."""
        plan, carry = self.plan, self.carry
        lost: set[GroupKey] = set()
        for (_, why), b in zip(plan.released, plan.dropped, strict=True):
            if why in MEMBER_LOST:
                lost.add((b.job, b.group))
        for key in sorted(lost):
            entry = self.groups.get(key)
            if entry is None or not entry.spec.gang or entry.spec.on_member_loss != "restart_all":
                continue
            job, g, _ = entry
            for ordinal in range(g.scaling.desired):
                wid = workload_id(job.id, g.name, ordinal)
                held = plan.bindings.get(wid)
                if held is None:
                    continue
                self.cluster.by_id[held.node].unhold(held)
                if carry is not None:
                    carry.drop(wid, held)
                else:
                    del plan.bindings[wid]
                    assert isinstance(self.bound, dict)
                    self.bound[key] -= 1
                self._release(wid, held, "gang member lost")
            if self.options.gang_attempts and job.type == "batch":
                self.share_attempts(job.id, g)

    def share_attempts(self, job_id: str, g: TaskGroup) -> None:
        """A batch gang restarted because a member failed in this pass spends one
        attempt of the gang: every member carries the union of the members' failure
        times (members failing in one pass add one time), so ``reschedule.attempts``
        bounds the gang's restarts, not each member's (a gang of n would else run up
        to n x attempts + 1 times)."""
        wids = [workload_id(job_id, g.name, o) for o in range(g.scaling.desired)]
        if not any(w in self.just_failed for w in wids):
            return  # lost with a node, preempted, drained: no attempt spent
        hists = [self.failures.get(w, FailureHistory()) for w in wids]
        times = tuple(sorted({t for h in hists for t in h.times}))[-64:]
        for w, h in zip(wids, hists, strict=True):
            if h.times != times:
                self.failures[w] = h.model_copy(update={"times": times})

    def spread_down(self) -> None:
        """1d. A group with ``do_not_schedule`` spread rules scaled down in this pass
        and left past a rule's ``max_skew``: kept replicas move off the most loaded
        value into the slots the scale-down freed (forge.core.spread_down)."""
        plan, carry = self.plan, self.carry
        down: dict[GroupKey, list[Binding]] = {}
        for (_, why), b in zip(plan.released, plan.dropped, strict=True):
            if why == "scaled down":
                down.setdefault((b.job, b.group), []).append(b)
        for key in sorted(down):
            entry = self.groups.get(key)
            if entry is None or not entry.spec.spread or (entry.spec.gang and self.options.gangs):
                continue
            job, g, _ = entry
            kept = [
                held
                for ordinal in range(g.scaling.desired)
                if (held := plan.bindings.get(workload_id(job.id, g.name, ordinal))) is not None
            ]
            nodes = self.cluster.nodes
            self.release_work += len(nodes)  # the group's domains
            for m in spread_moves(job.id, g, nodes, self.cluster.by_id, kept, down[key]):
                self._unbind(m.wid, m.old)
                self._release(m.wid, m.old, SPREAD_DOWN)
                taken = self.cluster.by_id[m.new.node].hold(m.new)
                assert taken, "a scaled-down replica's slot is free"
                if carry is not None:
                    carry.add(m.wid, m.new)
                else:
                    plan.bindings[m.wid] = m.new
                    assert isinstance(self.bound, dict)
                    self.bound[key] += 1
                plan.placed.append(m.new)


def restarts_a_batch_gang(jobs: Mapping[str, Job], failed: Iterable[str]) -> bool:
    """Whether a replica in ``failed`` is a member of a batch gang that restarts
    whole when one fails (``on_member_loss: restart_all``): the one pass whose plan
    the gang's shared attempt count changes (``Releasing.share_attempts``),
    so the loop asks its patch there alone. Bounded by ``failed`` (a pass's reports)."""
    for wid in failed:
        job_id, group, _ = wid.rsplit("/", 2)
        job = jobs.get(job_id)
        g = job.group(group) if job is not None and job.type == "batch" else None
        if g is not None and g.gang and g.on_member_loss == "restart_all":
            return True
    return False
