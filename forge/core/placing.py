"""The place phase of a pass: missing replicas, in priority order, onto nodes.

It walks the groups :mod:`forge.core.visiting` lists (in placement order) and, per
missing replica: wait (backoff, reschedule delay), defer (a placement or work limit
reached; :func:`forge.core.waiting.defer_groups` keeps their entries), bind, or
leave pending with the reason the placer gives. Replicas refused are remembered
for the phases after it: those asking no GPU that the GPU reservation turned away
are tried once more when it is lifted, and, with preemption on, every refused one
may evict lower-priority work (:mod:`forge.core.preempting`).

The per-replica loop is the hot path of a large first pass (50,000 replicas): it keeps
what it reads in local variables and calls out only for the rare cases."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import replace
from functools import partial
from math import inf

from forge.core.admitting import Gate
from forge.core.groups import Bound, Group, GroupKey, Groups
from forge.core.models import Constraint, Job, Request, TaskGroup, workload_id
from forge.core.placement import Choice, Diagnosis, Placer, Topology, diagnosis_text
from forge.core.plan import FailureHistory, PendingEntry, Plan, ReconcileOptions, binding
from forge.core.preempting import PREEMPTED, Wanted
from forge.core.queue import Parked, SortKey
from forge.core.waiting import Deferred, backoff_delay, past_cap, waiting

__all__ = ["Placing"]

DEFERRED = "deferred to the next pass (per-pass placement or work limit)"


class Placing:
    """One pass's placement of missing replicas (see the module docstring).

    Reads the plan's bindings and writes its placements, pending entries and
    deferred count; leaves behind what the later phases need: ``placed`` (the
    count), ``visited`` (work units beside the placer's), ``held_back``, ``wanted``,
    ``deferred`` and ``gpu_waiting`` (a GPU replica some node could take is
    unbound, so the reservation must hold)."""

    def __init__(
        self,
        *,
        plan: Plan,
        groups: Groups,
        placer: Placer,
        pending: Mapping[str, PendingEntry],
        failures: Mapping[str, FailureHistory],
        just_failed: Collection[str],
        bound: Bound | Mapping[GroupKey, int],
        options: ReconcileOptions,
        now: float,
        capacity_freed: bool,
        budget: int,
        parked: dict[GroupKey, Parked[PendingEntry]] | None = None,
        done: Mapping[GroupKey, Collection[int]] | None = None,
        gate: Gate | None = None,
    ) -> None:
        self.plan, self.groups, self.placer = plan, groups, placer
        #: the admit stage (forge.core.admitting; None: no queue has a quota)
        self.gate = gate
        #: batch groups' completed ordinals: never placed again (forge.core.kinds)
        self.done: Mapping[GroupKey, Collection[int]] = done or {}
        #: groups whose replicas all waited, carried between passes (Parked); a pass
        #: without a carry keeps its own, so it plans exactly what a carried one does
        self.parked: dict[GroupKey, Parked[PendingEntry]] = {} if parked is None else parked
        self.pending, self.failures, self.just_failed = pending, failures, just_failed
        self.bound, self.options, self.now = bound, options, now
        self.capacity_freed, self.budget = capacity_freed, budget
        self.placed = self.visited = 0
        self.gpu_waiting = False
        self.held_back: list[Wanted] = []
        self.wanted: list[Wanted] = []
        self.deferred: list[Deferred] = []
        #: with ``refill_waiting``: the groups (in placement order) some of whose
        #: replicas kept a backoff from an earlier pass untried; a preemption's
        #: freed room is offered to them too (forge.core.preempting.waiters)
        self.waited: list[GroupKey] = []
        #: where in ``visit`` the budget stopped the pass: the groups from here on
        #: were deferred whole, untouched (None: every group was visited)
        self.stop: int | None = None
        #: the groups deferred whole from ``stop`` on, and their replicas left
        self.tail: list[GroupKey] = []
        self.tail_left = 0
        # one shared instance: 100,000 deferred replicas are cheap
        self._deferred_entry = PendingEntry(kind="deferred", not_before=now, reasons=(DEFERRED,))
        self._backoff: dict[tuple[int, tuple[str, ...]], PendingEntry] = {}
        # per class and pass: a pending class's answers do not change within the pass
        # (could_ever_fit looks at total capacity; a diagnosis is formatted once), keyed
        # by identity: a group's request and constraints, a class's diagnosis.
        self._ever_fits: dict[tuple[int, int], bool] = {}
        self._texts: dict[int, tuple[Diagnosis, str]] = {}
        # groups whose rules look at their own replicas (distinct_hosts, spread)
        self._topologies: dict[GroupKey, Topology] = {}
        # gangs the GPU reservation turned away, with their unbound members
        self._held_gangs: list[tuple[Group, list[tuple[int, str]]]] = []

    def run(self, visit: list[tuple[SortKey, GroupKey]], last_asking: SortKey | None) -> None:
        """Visit the groups in order, then retry the held-back replicas."""
        placer, groups, bound = self.placer, self.groups, self.bound
        # GPU nodes are kept for GPU work until the last job asking GPUs had its turn with
        # none unbound (else a tight cluster with unwanted GPUs leaves work pending).
        lift_checked = not placer.reserving  # checked once, as a walk would
        for i, (order, key) in enumerate(visit):
            if not lift_checked and (last_asking is None or order > last_asking):
                lift_checked = True  # past the last job asking GPUs
                if placer.reserving and not self.gpu_waiting:
                    placer.lift_reservation()
            stop = self._group(groups[key], bound.get(key, 0))
            if self.gate is not None:  # what a group admitted at once is taken now
                self.gate.end()
            if stop:
                self.stop = i + 1
                break
        if self.stop is not None and self.stop < len(visit):
            # The rest is deferred whole, in one sweep with nothing else per group
            # (a pass behind a big backlog costs its budget, not the backlog's
            # length); the reservation is lifted as a walk through them would.
            tail = visit[self.stop :]
            past = last_asking is None or tail[-1][0] > last_asking
            if not lift_checked and past and placer.reserving and not self.gpu_waiting:
                placer.lift_reservation()
            self.tail = [key for _, key in tail]
            if isinstance(bound, Bound):
                held = bound.by_group
                self.tail_left = sum(
                    groups[key].spec.scaling.desired - len(held.get(key) or ()) for key in self.tail
                )
            else:
                self.tail_left = sum(
                    groups[key].spec.scaling.desired - bound.get(key, 0) for key in self.tail
                )
            if self.done:
                self.tail_left -= sum(len(self.done.get(key) or ()) for key in self.tail)
        if self.gate is not None:  # the borrowers the walk set aside, in fair-share order
            limit = self.options.max_placements
            for wids in self.gate.share_out(lambda n: self.placed + n <= limit):
                self._defer(wids)  # (a pass's placement limit left them)
        self._retry_held_back()

    def _group(self, entry: Group, bound: int) -> bool:
        """Place one group's missing replicas; True when the work budget or the
        placement limit stops the pass here (with a budget, the groups after are
        deferred whole: the pass's cost stays bounded by the budget, not by how
        much is pending)."""
        job, g, req = entry
        constraints, policy, desired = g.constraints, g.reschedule, g.scaling.desired
        plan, placer, options = self.plan, self.placer, self.options
        bindings, pending, failures = plan.bindings, self.pending, self.failures
        just_failed, now, freed = self.just_failed, self.now, self.capacity_freed
        budget, limit = self.budget, options.max_placements
        topo = self._topology(entry) if g.topology and options.topology else None
        if g.gang and options.gangs:
            return self._gang(entry, topo)
        key = (job.id, g.name)
        finished, room = self._runs(key, g, bound)
        bound += len(finished)  # done ordinals count as held: nothing to place
        if topo is None and self._still_parked(key, entry, bound):
            return False
        queued = self.gate is not None and self.gate.limited(job)  # queued ones never refill
        waiting_now, note_wait = 0, options.refill_waiting and room is None and not queued
        gate = self.gate  # a group its queue admits whole (begin) waits for nothing
        asks = queued and not (gate and topo is None and gate.begin(job, req, desired - bound))
        walked: dict[str, PendingEntry] | None = {} if topo is None else None
        for ordinal in range(desired):
            wid = workload_id(job.id, g.name, ordinal)
            if wid in bindings or ordinal in finished:
                continue
            self.visited += 1
            prev, hist = pending.get(wid), failures.get(wid)
            wait = waiting(prev, hist, policy, wid in just_failed, now, freed)
            if wait is not None:
                plan.pending[wid] = wait
                waiting_now += 1
                if note_wait and wait.kind == "backoff":
                    self.waited.append(key)
                    note_wait = False  # once per group
                self._note_gpu(req, constraints)
                if walked is not None:
                    walked[wid] = wait
                continue
            walked = None  # not every unbound replica waits: nothing to park
            if room is not None and (room := room - 1) < 0:  # the rest wait for runs to end
                past_cap(plan, entry, ordinal, finished, pending, failures, just_failed, now)
                break
            if budget and (self.placed >= limit or placer.work + self.visited >= budget):
                self._note_gpu(req, constraints)
                # this group's replicas from here on; those before are settled
                self.deferred.append(Deferred(job.id, g.name, desired - bound - waiting_now))
                return True
            if self.placed >= limit:
                plan.deferred += 1
                plan.pending[wid] = self._deferred_entry
                self._note_gpu(req, constraints)
                continue
            w = Wanted(wid, job, g, ordinal, req) if asks else None
            later = partial(partial, self._borrow, w, topo, prev) if w else None
            want, ok = self._place(job, g, ordinal, wid, req, topo, later)
            if not ok:
                if want is not None:  # refused by the placer
                    self._refused(Wanted(wid, job, g, ordinal, want), prev, topo)
                elif w and topo is None and self.gate and self.gate.reclaims(wid):
                    self.wanted.append(w)  # queued below its nominal: may reclaim
                waiting_now += 1
                continue
            bound += 1
        self._park(key, entry, bound, walked)
        return False

    def _place(
        self,
        job: Job,
        g: TaskGroup,
        ordinal: int,
        wid: str,
        req: Request,
        topo: Topology | None,
        later: partial[partial[None]] | None = None,
    ) -> tuple[Request | None, bool]:
        """Admit (with a gate) and place one replica: the request it was placed
        with or refused (None: its queue did not admit it, or set it aside to
        borrow in fair-share order: ``later``), and whether it was bound."""
        gate = self.gate
        want = req if gate is None else gate.ask(job, req, (wid,), later)
        if want is None:
            return None, False
        hist = self.failures.get(wid)
        avoid = hist.last_node if hist else None
        if topo is None:
            choice = self.placer.place(want, g.constraints, avoid=avoid)
        else:
            choice = self.placer.place_with(want, g.constraints, topo, avoid=avoid)
        if choice is None:
            return want, False
        if topo is not None:
            topo.add(choice.node.node)
        b = binding(job, g, ordinal, choice, want, self.options)
        if gate is not None:
            gate.bound(job, b, choice.node.node, wid)
        self.plan.bindings[wid] = b
        self.plan.placed.append(b)
        self.placed += 1
        return want, True

    def _borrow(self, w: Wanted, topo: Topology | None, prev: PendingEntry | None) -> None:
        """A borrower's turn in the fair-share round (:meth:`Gate.share_out`)."""
        want, ok = self._place(w.job, w.group, w.ordinal, w.wid, w.req, topo)
        if ok:
            del self.plan.pending[w.wid]  # the entry it waited its turn with
        elif want is not None:
            self._refused(replace(w, req=want), prev, topo)
        elif topo is None and self.gate is not None and self.gate.reclaims(w.wid):
            self.wanted.append(w)  # below a richer borrower's share: may take it

    def _runs(self, key: GroupKey, g: TaskGroup, bound: int) -> tuple[Collection[int], int | None]:
        """A batch group's done ordinals, and how many runs its ``parallelism`` lets
        this pass try (placed or refused; None: no cap; refills ignore a cap)."""
        cap = g.scaling.parallelism
        return (self.done.get(key, ()) if self.done else ()), (cap - bound if cap else None)

    def _still_parked(self, key: GroupKey, entry: Group, bound: int) -> bool:
        """Take a parked group's entries whole when the walk would leave exactly
        them (see :class:`forge.core.queue.Parked`): the same entries in the same
        order, the same work counted, the same GPU note. False: walk it."""
        rec = self.parked.get(key)
        if rec is None:
            return False
        if (
            rec.group is not entry
            or rec.bound != bound
            or self.now >= rec.until
            or (rec.backoff and self.capacity_freed)
        ):
            del self.parked[key]
            return False
        pending, bindings, failed = self.pending, self.plan.bindings, self.just_failed
        for wid, wait in rec.entries.items():
            if pending.get(wid) is not wait or wid in bindings or wid in failed:
                del self.parked[key]
                return False
        self.plan.pending.update(rec.entries)
        self.visited += len(rec.entries)
        if rec.backoff and self.options.refill_waiting:
            self.waited.append(key)  # as the walk would have noted it
        _, g, req = entry
        self._note_gpu(req, g.constraints)
        return True

    def _park(
        self, key: GroupKey, entry: Group, bound: int, walked: dict[str, PendingEntry] | None
    ) -> None:
        """Park a group whose unbound replicas all waited (``walked``); else unpark it
        (a run failed for good has no delay to end: only a change unparks it)."""
        if not walked:
            self.parked.pop(key, None)
            return
        until = min((w.not_before for w in walked.values() if w.kind != "failed"), default=inf)
        backoff = any(w.kind == "backoff" for w in walked.values())
        self.parked[key] = Parked(entry, bound, until, backoff, walked)

    def _gang(self, entry: Group, topo: Topology | None) -> bool:
        """Place a gang's missing replicas together or not at all (see
        :meth:`Placer.place_gang`); True when the pass stops here, as in
        :meth:`_group`. A gang waits as a whole: while one of its missing members
        waits out a delay, the others wait with it. It never preempts."""
        job, g, req = entry
        plan, placer, options = self.plan, self.placer, self.options
        bindings, pending, failures = plan.bindings, self.pending, self.failures
        missing: list[tuple[int, str]] = []
        waits: dict[str, PendingEntry] = {}
        finished = self.done.get((job.id, g.name)) if self.done else None
        for ordinal in range(g.scaling.desired):
            wid = workload_id(job.id, g.name, ordinal)
            if wid in bindings or (finished and ordinal in finished):
                continue
            self.visited += 1
            missing.append((ordinal, wid))
            wait = waiting(
                pending.get(wid),
                failures.get(wid),
                g.reschedule,
                wid in self.just_failed,
                self.now,
                self.capacity_freed,
            )
            if wait is not None:
                waits[wid] = wait
        n = len(missing)
        if not n:
            return False
        limit, budget = options.max_placements, self.budget
        if waits:
            latest = max(w.not_before for w in waits.values())
            for _, wid in missing:
                plan.pending[wid] = waits.get(wid) or PendingEntry(
                    kind="backoff",
                    attempts=_attempts(pending.get(wid)) - 1,
                    not_before=latest,
                    reasons=("gang: waiting for a member's delay",),
                )
        elif (
            n <= limit
            and budget
            and (self.placed + n > limit or placer.work + self.visited >= budget)
        ):
            self.deferred.append(Deferred(job.id, g.name, n))
            self._note_gpu(req, g.constraints)
            return True
        elif n <= limit and self.placed + n > limit:
            plan.deferred += n
            for _, wid in missing:
                plan.pending[wid] = self._deferred_entry
        else:
            self._try_gang(entry, missing, topo, refused=True, later=True)
            return False
        self._note_gpu(req, g.constraints)
        return False

    def _try_gang(
        self,
        entry: Group,
        missing: list[tuple[int, str]],
        topo: Topology | None,
        *,
        refused: bool,
        later: bool = False,
    ) -> bool:
        """One all-or-nothing try; binds every member or (``refused``) backs each
        off with the gang's reason. True when bound."""
        job, g, req = entry
        plan, options, n, gate = self.plan, self.options, len(missing), self.gate
        if gate is not None:  # admitted whole or not at all
            again = partial(partial, self._try_gang, entry, missing, topo, refused=True)
            want = gate.ask(job, req, (wid for _, wid in missing), again if later else None)
            if want is None:
                return False
            req = want
        if n > options.max_placements:
            result: list[Choice] | tuple[int, Diagnosis | None] = (0, None)
        else:
            result = self.placer.place_gang(req, g.constraints, n, topo)
        if isinstance(result, list):
            for (ordinal, wid), choice in zip(missing, result, strict=True):
                b = binding(job, g, ordinal, choice, req, options)
                if gate is not None:
                    gate.bound(job, b, choice.node.node)
                plan.bindings[wid] = b
                plan.placed.append(b)
                plan.pending.pop(wid, None)
                self.placed += 1
                if topo is not None:
                    topo.add(choice.node.node)
            return True
        if not refused:
            return False
        fit, diagnosis = result
        why = (
            f"gang: {fit} of {n} fit; {diagnosis_text(diagnosis)}"
            if diagnosis is not None
            else f"gang: {n} replicas exceed the {options.max_placements} placements of a pass"
        )
        for _, wid in missing:
            attempts = _attempts(self.pending.get(wid))
            plan.pending[wid] = PendingEntry(
                kind="backoff",
                attempts=attempts,
                not_before=self.now + backoff_delay(attempts, options),
                reasons=(why,),
            )
        self.visited += n * (options.pending_units - 1)
        if not req.gpu and self.placer.reserving:
            self._held_gangs.append((entry, missing))
        return False

    def _refused(self, w: Wanted, prev: PendingEntry | None, topo: Topology | None) -> None:
        """No node took ``w``: back it off with the placer's reason, remember it.
        A replica of a topology group does not preempt: the preemption search
        knows capacity, not the group's own rules."""
        placer, req, constraints = self.placer, w.req, w.group.constraints
        if not req.gpu and placer.reserving:
            self.held_back.append(w)
        gate = self.gate  # (a queued job's preempts only to reclaim its nominal)
        if self.options.preemption and topo is None and (not gate or gate.may_reclaim(w.job, req)):
            self.wanted.append(w)
        attempts = (prev.attempts if prev and prev.kind == "backoff" else 0) + 1
        if topo is not None and topo.why is not None:
            diagnosis = topo.why
        else:
            diagnosis = placer.why_not(req, constraints)
        said = self._texts.get(id(diagnosis))
        if said is None:  # (the diagnosis is kept with its text: alive)
            said = self._texts[id(diagnosis)] = (diagnosis, diagnosis_text(diagnosis))
        reasons: tuple[str, ...] = (said[1],)
        if prev is not None and prev.reasons and prev.reasons[0].startswith(PREEMPTED):
            # a victim tried again (a pass after the one that preempted it uses the
            # room that pass freed) still says who preempted it
            reasons = (prev.reasons[0], said[1])
        shared = self._backoff.get((attempts, reasons))
        if shared is None:
            shared = self._backoff[(attempts, reasons)] = PendingEntry(
                kind="backoff",
                attempts=attempts,
                not_before=self.now + backoff_delay(attempts, self.options),
                reasons=reasons,
            )
        self.plan.pending[w.wid] = shared
        self.visited += self.options.pending_units - 1  # (one was counted already)
        self._note_gpu(req, constraints)

    def _topology(self, entry: Group) -> Topology:
        """The group's :class:`Topology` for this pass: its spread domains (values
        on its eligible nodes) and the replicas it holds (by ordinal; those of the
        current version count towards spread)."""
        job, g, req = entry
        key = (job.id, g.name)
        topo = self._topologies.get(key)
        if topo is None:
            placer, bindings = self.placer, self.plan.bindings
            by_id = placer.cluster.by_id
            version = g.version
            held = []
            for ordinal in range(g.scaling.desired):
                b = bindings.get(workload_id(job.id, g.name, ordinal))
                alloc = by_id.get(b.node) if b is not None else None
                if b is not None and alloc is not None:
                    held.append((alloc.node, not b.version or b.version == version))
            self.visited += g.scaling.desired
            values = placer.domains(req, g.constraints, g.spread) if g.spread else ()
            topo = Topology.of(g, values, held)
            self._topologies[key] = topo
        return topo

    def _note_gpu(self, req: Request, constraints: tuple[Constraint, ...]) -> None:
        """A replica is left unbound: if it asks GPUs some node could give, the
        reservation must hold for the rest of the pass."""
        if self.gpu_waiting or not (req.gpu and self.placer.reserving):
            return
        key = (id(req), id(constraints))
        fits = self._ever_fits.get(key)
        if fits is None:
            fits = self._ever_fits[key] = self.placer.could_ever_fit(req, constraints)
        self.gpu_waiting = fits

    def _retry_held_back(self) -> None:
        """Replicas without GPUs (and gangs, whole) the reservation refused: tried again
        once it is lifted or GPU placements freed reservation (the placer re-admits
        those nodes), so nothing that fits is left pending (invariant 4)."""
        placer, plan, limit = self.placer, self.plan, self.options.max_placements
        held = self.held_back or self._held_gangs
        if held and placer.reserving and not self.gpu_waiting:
            placer.lift_reservation()  # the last job was one asking GPUs; all bound
        for entry, missing in self._held_gangs:
            if self.placed + len(missing) <= limit:
                key = (entry.job.id, entry.spec.name)
                self._try_gang(entry, missing, self._topologies.get(key), refused=False)
        for n, w in enumerate(self.held_back):
            if self.placed >= limit:
                if self.options.held_back_deferred:
                    self._defer_held_back(self.held_back[n:])
                break  # (before held_back_deferred they kept their backoff entries)
            topo = self._topologies.get((w.job.id, w.group.name))
            if self._place(w.job, w.group, w.ordinal, w.wid, w.req, topo)[1]:
                del plan.pending[w.wid]

    def _defer_held_back(self, held: list[Wanted]) -> None:
        """The held-back replicas the placement limit kept from their retry: deferred
        like those the limit stopped before (the next pass runs at once), not left
        waiting out a refusal that no longer holds; nor do they preempt."""
        deferred = [w.wid for w in held]  # in order: the plan's entries are ordered
        self.wanted = [w for w in self.wanted if w.wid not in set(deferred)]
        self._defer(deferred)

    def _defer(self, wids: Collection[str]) -> None:
        """Defer ``wids`` to the next pass, which runs at once (a budgeted pass: no entry)."""
        plan = self.plan
        plan.deferred += len(wids)
        for wid in wids:
            if self.budget:
                del plan.pending[wid]
            else:
                plan.pending[wid] = self._deferred_entry


def _attempts(prev: PendingEntry | None) -> int:
    """The attempt a refusal now makes, after ``prev``."""
    return (prev.attempts if prev and prev.kind == "backoff" else 0) + 1
