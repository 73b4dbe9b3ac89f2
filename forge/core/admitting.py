"""The admit stage of a pass: between "what is missing" and "where it goes".

A replica of a job in a queue with a quota (:mod:`forge.core.quota`) is placed
only when its queue admits it: the place phase asks the gate first, and a refusal
leaves the replica ``queued`` with its queue's reason (``forge explain`` shows it).
A gang is admitted whole or not at all. A GPU request is admitted on the models
its queue has room for and the placer is held to those, so a binding never lands
on a model its queue has no quota left for. What a pass binds is taken from the
quota at once (the carry's ledger sees its releases and evictions, as they happen,
for the next pass: every queued replica is admitted before the preempt phase).

A replica that would take its queue above its nominal quota borrows from its
cohort, and borrowing goes in **fair-share** order (Kueue's fair sharing): the
place phase walks in priority order, so the borrowers are set aside there and
offered the cohort's pool after the walk, one at a time to the queue whose
weighted dominant share of the pool is lowest (:meth:`Admission.share`), each
queue's in its own priority order. Two queues wanting more than the pool split it
by their weights, whoever's jobs have the higher priority.

A replica its queue refuses while the queue is within its nominal quota (the cohort
lent it all) may **reclaim** it: the preempt phase evicts replicas of the cohort's
borrowing queues for it (:meth:`Gate.may_evict`, :meth:`Gate.trade`). Past its
nominal, a queue whose weighted share is below a borrower's takes its **fair share**
the same way (Kueue's fair-sharing preemption), one replica at a time while the
borrower stays at least as rich: a queue that arrives owning nothing is not left
with nothing by those that came first. Replicas of
jobs without a queue (``default``) pass without a look: a cluster without queues
plans exactly as before.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from heapq import heapify, heappop, heappush

from forge.core.admission import Admission
from forge.core.models import Job, Node, Request
from forge.core.placement import Binding
from forge.core.plan import PendingEntry, Plan
from forge.core.quota import (
    DEFAULT_QUEUE,
    Ledger,
    QueueSpec,
    Usage,
    held,
)

__all__ = ["Gate", "gate"]


class Gate:
    """One pass's admission: asks the queues' quotas, records what was bound."""

    def __init__(
        self, admission: Admission, plan: Plan, now: float, reclaim: bool, ledger: Ledger
    ) -> None:
        self.admission, self.plan, self.now = admission, plan, now
        #: what the bindings of queued jobs held when the pass began (reclaim's index)
        self.ledger = ledger
        #: whether a queue within its nominal may reclaim it (the pass preempts)
        self.reclaim = reclaim
        #: the narrowed requests, one object per (request, models): the placer's
        #: per-class caches are keyed by identity
        self._narrowed: dict[tuple[int, tuple[str, ...]], Request] = {}
        self._entries: dict[str, PendingEntry] = {}
        #: what each binding it saw made holds (for the carry's ledger: Ledger.fresh)
        self.fresh: dict[str, Usage] = {}
        #: replicas refused while their queue is within its nominal quota, or below
        #: a borrower's fair share (they may preempt: :meth:`trade`)
        self._reclaim: set[str] = set()
        #: per (queue, request): whether some borrower of its cohort is richer
        self._fair: dict[tuple[str, int], bool] = {}
        #: the group being walked, when its queue admits all it may ask (begin)
        self._bulk: _Bulk | None = None
        #: what the pass wrote a queued entry for, by queue (the pass's tally)
        self._waiting: list[tuple[str, tuple[str, ...]]] = []
        #: per queue, its borrowers set aside by the walk: (their ids, what they
        #: would hold, the retry)
        self._later: dict[str, deque[tuple[tuple[str, ...], Usage, Callable[[], object]]]] = {}

    def begin(self, job: Job, req: Request, n: int) -> bool:
        """A group's walk is about to ask for up to ``n`` replicas of ``job`` asking
        ``req``: when all ``n`` fit its queue plainly (:meth:`Admission.plainly`),
        each ask is answered without a look and the usage they take is added once,
        at :meth:`end` (the same sum: quota is linear in what is taken, and nothing
        else asks the queues during one group's walk). The common case of a queue
        within its quota then costs O(1) a replica, not a check and a take each.
        True when it does (no replica of the group then waits for its queue)."""
        self._bulk = None
        queue = job.queue
        if n > 1 and self.admission.plainly(queue, req, n):
            self._bulk = _Bulk(queue, req, {"cpu": req.cpu, "memory": req.memory})
        return self._bulk is not None

    def end(self) -> None:
        """Take what the group's walk bound under :meth:`begin`'s answer."""
        bulk, self._bulk = self._bulk, None
        if bulk is not None and bulk.count:
            n, use = bulk.count, bulk.use
            self.admission.take(bulk.queue, {k: v * n for k, v in use.items()})

    def limited(self, job: Job) -> bool:
        """Whether the job's replicas wait for their queue's admission."""
        return self.admission.limited(job.queue)

    def ask(
        self,
        job: Job,
        req: Request,
        wids: Iterable[str],
        later: Callable[[], Callable[[], object]] | None = None,
    ) -> Request | None:
        """The request to place ``wids`` with (all of them together: a gang's
        missing members), or None: they wait, each with the queue's reason. With
        ``later`` (the walk), a borrower of a shared cohort is set aside for
        :meth:`share_out`, which calls what ``later()`` returns in its turn (made
        only then: most replicas never borrow)."""
        queue = job.queue
        if not self.admission.limited(queue):
            return req
        bulk = self._bulk
        if bulk is not None and bulk.req is req and bulk.queue == queue:
            return req  # admitted with its group (begin)
        wids = tuple(wids)
        if self.admission.plainly(queue, req, len(wids)):
            return req
        use = None if later is None else self.admission.borrowing(queue, req, len(wids))
        if use is not None and later is not None:  # admitted (or not) in its turn
            cohort = self.admission.queues[queue].cohort
            self._later.setdefault(queue, deque()).append((wids, use, later()))
            why = f"queue {queue}: borrowing from cohort {cohort}, in fair-share order"
            self._wait(queue, wids, why)
            return None
        models, why = self.admission.admit(queue, req, len(wids))
        if why:
            self._wait(queue, wids, why)
            if self.reclaim and len(wids) == 1 and self._may_take(queue, req):
                self._reclaim.add(wids[0])  # its own quota lent, or a richer borrower
            return None
        if models is None or models == req.gpu_models:
            return req
        key = (id(req), models)
        narrowed = self._narrowed.get(key)
        if narrowed is None:
            narrowed = self._narrowed[key] = req.model_copy(update={"gpu_models": models})
        return narrowed

    def _may_take(self, queue: str, req: Request) -> bool:
        """Whether a refused replica may preempt for its queue's due: its nominal
        quota (reclaim), its fair share (a richer borrower of its cohort), or, where
        the queue allows it, its own queue's replicas of lower priority. Asked per
        refused replica, so the fair-share look is kept per (queue, request) for
        the pass (:meth:`trade` checks each victim exactly)."""
        adm = self.admission
        rules = adm.queues[queue].preemption if queue in adm.queues else None
        if rules is None:
            return False
        if rules.within_queue != "never" and adm.usage.get(queue):
            return True
        if rules.reclaim_within_cohort == "never":
            return False
        if adm.within(queue, req):
            return True
        key = (queue, id(req))
        fair = self._fair.get(key)
        if fair is None:
            fair = self._fair[key] = adm.fair_claim(queue, req) is not None
        return fair

    def reclaims(self, wid: str) -> bool:
        """Whether ``wid`` was refused with a due its queue may preempt for (its
        nominal, its fair share, or its own lower-priority replicas: :meth:`claim`)."""
        return wid in self._reclaim

    def may_reclaim(self, job: Job, req: Request) -> bool:
        """Whether a replica of ``job`` no node took may preempt: any job's but a
        queued one's, which may reclaim while its queue is within its nominal, or
        claim its fair share from a richer borrower (its queue admitted it, but the
        nodes are full of what the cohort's borrowers hold)."""
        queue = job.queue
        return not self.admission.limited(queue) or (self.reclaim and self._may_take(queue, req))

    def claim(self, job: Job, req: Request) -> Claim:
        """What a replica of ``job`` asking ``req`` may evict (:class:`Claim`), asked
        once per preemption search: each holder is then asked in O(its usage)."""
        adm, mine = self.admission, job.queue
        rules = adm.queues[mine].preemption
        keys, within = adm.keys(mine, req), adm.within(mine, req)
        share = None if within else adm.fair_claim(mine, req)
        others: frozenset[str] = frozenset()
        if rules.reclaim_within_cohort != "never" and (share is not None or within):
            others = frozenset(
                q for q in adm.members(mine) if q != mine and adm.borrowing_in(q, keys)
            )
        return Claim(
            queue=mine,
            share=share,
            keys=keys,
            others=others,
            own=rules.within_queue == "lower_priority",
            lower_only=rules.reclaim_within_cohort == "lower_priority",
            priority=job.priority,
        )

    def may_evict(self, claim: Claim, victim: Job, use: Usage) -> bool:
        """Whether ``claim`` may evict a replica of ``victim`` holding ``use``: its own
        queue's of lower priority where the queue allows it; another's of its cohort
        that borrows, beyond its nominal, a resource the claim asks and the replica
        holds (evicting it gives that back: no two queues trade one resource for
        another back and forth), at the priority the rules allow, and (a fair-share
        claim) that keeps a weighted share no smaller than the claim without it."""
        theirs, lower = victim.queue, victim.priority < claim.priority
        if theirs not in claim.others:
            return theirs == claim.queue and claim.own and lower
        if claim.lower_only and not lower:
            return False
        adm = self.admission
        if not adm.borrowing_in(theirs, claim.keys.intersection(use)):
            return False
        return (
            claim.share is None or adm.share(theirs, {k: -v for k, v in use.items()}) >= claim.share
        )

    def trade(
        self,
        job: Job,
        req: Request,
        on: tuple[str, ...],
        victims: list[tuple[Job, Usage]],
        claim: Claim | None = None,
    ) -> bool:
        """Whether evicting ``victims`` (their jobs, what each holds), in order, admits
        one replica of ``job`` asking ``req`` (on a node of the GPU models ``on``), each victim's
        queue still borrowing when its turn comes (Kueue's reclaim: a queue is taken
        back down to its nominal, and the reclaiming one, within its own, is never a
        victim: no two queues reclaim from each other back and forth).

        Beyond its nominal, a queue takes its **fair share** (Kueue's fair-sharing
        preemption, ``LessThanOrEqualToFinalShare``): each victim's queue must keep a
        weighted share, without the victim, no smaller than the one the claimant
        reaches with its replica, so the two end no further apart than one replica
        and neither can take it back. Victims of its own queue free its own quota,
        where the queue allows it (``preemption.within_queue``: lower priority only);
        ``reclaim_within_cohort`` says at what priority other queues' may go. Kept
        when True, undone when False."""
        adm, given, ok = self.admission, [], True
        claim = claim or self.claim(job, req)  # (given: made on the usage as it is now)
        for v, use in victims:  # each asked at its turn, after those before it went
            if not self.may_evict(claim, v, use):
                ok = False
                break
            adm.give(v.queue, use)
            given.append((v.queue, use))
        if ok:
            models, why = adm.admit(job.queue, req)
            ok = not why and (models is None or all(m in models for m in on))
        if not ok:
            for queue, use in given:
                adm.take(queue, use)
        return ok

    def share_out(self, room: Callable[[int], bool]) -> list[tuple[str, ...]]:
        """Offer the borrowers the walk set aside, one at a time to the queue whose
        weighted share would be the lowest with it (ties by name; so each queue
        ends within one replica of its weighted part), each queue's in walk order,
        while ``room(n)`` says the pass may still place ``n``; returns the ids of
        those the pass had no room left for (each still has its pending entry)."""
        share, later = self.admission.share, self._later
        heap = [(share(q, later[q][0][1]), q) for q in sorted(later)]
        heapify(heap)
        while heap:
            _, queue = heappop(heap)
            todo = later[queue]
            wids, _, retry = todo[0]
            if not room(len(wids)):
                continue  # this queue's turn is over: the rest of it is left
            todo.popleft()
            retry()
            if todo:
                heappush(heap, (share(queue, todo[0][1]), queue))
        left = [item[0] for q in sorted(self._later) for item in self._later[q]]
        self._later.clear()
        return left

    def tally(self) -> dict[str, int]:
        """Per queue, the replicas this pass left queued (bounded: those it asked)."""
        out: dict[str, int] = {}
        pending, seen = self.plan.pending, set()
        for queue, wids in self._waiting:
            for wid in wids:  # (a borrower is asked twice: in the walk, in its turn)
                entry = pending.get(wid)
                if entry is not None and entry.kind == "queued" and wid not in seen:
                    seen.add(wid)
                    out[queue] = out.get(queue, 0) + 1
        return out

    def _wait(self, queue: str, wids: tuple[str, ...], why: str) -> None:
        self._waiting.append((queue, wids))
        entry = self._entries.get(why)
        if entry is None:
            entry = self._entries[why] = PendingEntry(
                kind="queued", not_before=self.now, reasons=(why,)
            )
        for wid in wids:
            self.plan.pending[wid] = entry

    def bound(self, job: Job, b: Binding, node: Node, wid: str | None = None) -> None:
        """``b`` was bound on ``node``: its queue holds it from now on (``wid``: its
        workload id, when the caller has it: a binding builds it anew each time)."""
        if self.admission.limited(job.queue):
            wid = wid or b.workload_id
            bulk = self._bulk
            if bulk is not None and bulk.queue == job.queue and not b.gpu_ids:
                self.fresh[wid] = bulk.use  # (read-only: shared)
                bulk.count += 1
                return
            use = self.fresh[wid] = held(b, node)
            self.admission.take(job.queue, use)


@dataclass(frozen=True)
class Claim:
    """What one replica may evict for its queue's due (:meth:`Gate.claim`): ``share``
    None reclaims its nominal quota, a number claims a fair share up to it; ``keys``
    the quota keys it asks; ``others`` the cohort's queues borrowing one of them
    (those it may evict from, when the rules allow any); ``own`` whether its queue
    lets it evict its own replicas of lower priority."""

    queue: str
    share: float | None
    keys: frozenset[str]
    others: frozenset[str]
    own: bool
    lower_only: bool
    priority: int


class _Bulk:
    """One group's walk admitted at once: its queue, its request, what one replica
    holds, and how many it bound."""

    __slots__ = ("count", "queue", "req", "use")

    def __init__(self, queue: str, req: Request, use: Usage) -> None:
        self.queue, self.req, self.use, self.count = queue, req, use, 0


def gate(
    queues: Mapping[str, QueueSpec],
    plan: Plan,
    now: float,
    ledger: Ledger | None,
    jobs: Mapping[str, Job],
    nodes: Mapping[str, Node],
    reclaim: bool = True,
) -> Gate | None:
    """The pass's gate (None without queues: nothing to ask). Usage is the carry's
    ``ledger``, or (a pass without a carry) what the kept bindings hold."""
    if not queues:
        return None
    if ledger is None:
        ledger = Ledger()
        for wid, b in plan.bindings.items():
            job, node = jobs.get(b.job), nodes.get(b.node)
            if job is not None and node is not None and job.queue != DEFAULT_QUEUE:
                ledger.hold(wid, job.queue, b, node)
    return Gate(Admission(queues, ledger.usage), plan, now, reclaim, ledger)
