"""The fit rule of :mod:`forge.core.quota`, asked once per replica of a queued job.

One :class:`Admission` per pass: each queue's usage, the cohorts' pools, and the
answers the admit stage (:mod:`forge.core.admitting`) needs: does it fit (and on
which GPU models), does it borrow, and what is the queue's fair share. It keeps a
running total of what each cohort's members draw on their pool, so an answer costs
O(resources asked), not O(queues in the cohort): a pass asks once per replica.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from forge.core.limits import GPU_MILLI
from forge.core.quota import DEFAULT_QUEUE, QueueSpec, Usage, gpu_key
from forge.core.request import Request

__all__ = ["Admission"]


class Admission:
    """One pass's quota ledger: each queue's usage, asked before a replica of a queued
    job is placed and told what was bound. Built from the usage the bindings hold
    at the start of the place phase (O(queues x resources) with a carry's running
    totals)."""

    def __init__(self, queues: Mapping[str, QueueSpec], usage: Mapping[str, Usage]) -> None:
        self.queues = queues
        self.usage: dict[str, Usage] = {q: dict(u) for q, u in usage.items()}
        self._limits = {name: q.limits() for name, q in queues.items()}
        self._models = {
            name: tuple(k[4:] for k in limits if k.startswith("gpu:"))
            for name, limits in self._limits.items()
        }
        cohorts: dict[str, list[str]] = {}
        for name in sorted(queues):
            cohort = queues[name].cohort
            if cohort is not None:
                cohorts.setdefault(cohort, []).append(name)
        self._members = {n: cohorts[c] for c in cohorts for n in cohorts[c]}
        #: per cohort and resource: what its members lend (the pool borrowing draws
        #: on), and what they draw on it (each member's usage above its unlent part)
        self._lendable: dict[str, Usage] = {c: {} for c in cohorts}
        self._drawn: dict[str, Usage] = {c: {} for c in cohorts}
        for c, members in cohorts.items():
            for m in members:
                for key, (nominal, _, lend) in self._limits[m].items():
                    self._lendable[c][key] = self._lendable[c].get(key, 0) + lend
                    draws = max(self.usage.get(m, {}).get(key, 0) - (nominal - lend), 0)
                    self._drawn[c][key] = self._drawn[c].get(key, 0) + draws
        #: per queue in a cohort, what the cohort lends of the resources it names,
        #: every GPU model together as ``gpu`` (the fair share's denominators)
        self._pools: dict[str, Usage] = {}
        for name in self._members:
            lent, mine = self._lendable[queues[name].cohort or ""], Usage()
            for key in self._limits[name]:
                kind = "gpu" if key.startswith("gpu:") else key
                mine[kind] = mine.get(kind, 0) + lent.get(key, 0)
            self._pools[name] = mine

    def limited(self, queue: str) -> bool:
        """Whether the queue's replicas wait for admission (all but ``default``'s: a
        queue deleted while a job was submitted to it admits nothing)."""
        return queue != DEFAULT_QUEUE

    def gpu_models(self, queue: str) -> tuple[str, ...] | None:
        """The GPU models a queue's replicas may use (None: any)."""
        return self._models.get(queue) or None

    def plainly(self, queue: str, req: Request, times: int = 1) -> bool:
        """The common case in one look: ``times`` replicas asking ``req`` (no GPU
        model to choose) fit within the queue's nominal quota and its cohort's pool,
        so they are admitted without borrowing (False: ask :meth:`admit`)."""
        limits = self._limits.get(queue)
        if limits is None or (req.gpu and self._models[queue]):
            return False
        used = self.usage.get(queue, {})
        cohort = self.queues[queue].cohort
        for key, amount in (("cpu", req.cpu * times), ("memory", req.memory * times)):
            lim = limits.get(key)
            if lim is None:
                continue
            held = used.get(key, 0)
            if held + amount > lim[0]:
                return False
            if cohort is not None:
                own = lim[0] - lim[2]
                others = self._drawn[cohort].get(key, 0) - max(held - own, 0)
                if others + max(held + amount - own, 0) > self._lendable[cohort].get(key, 0):
                    return False
        return True

    def why_not(self, queue: str, ask: Usage, times: int = 1) -> str | None:
        """Why ``times`` more of ``ask`` do not fit the queue's quota (None: they do)."""
        limits = self._limits.get(queue)
        if limits is None:
            return None if queue == DEFAULT_QUEUE else f"no queue {queue!r} (forge queue apply)"
        for key in sorted(ask):
            why = self._key(queue, key, ask[key] * times)
            if why is not None:
                return why
        return None

    def _key(self, queue: str, key: str, amount: int) -> str | None:
        """Why ``amount`` more of one resource does not fit (None: it does)."""
        if amount <= 0:
            return None
        lim = self._limits[queue].get(key)
        if lim is None:
            if key.startswith("gpu:") and self._models[queue]:
                return f"queue {queue} has no quota for {_label(key)}"
            return None
        used = self.usage.get(queue, {})
        held = used.get(key, 0)
        nominal, borrow, lend = lim
        cohort = self.queues[queue].cohort
        if cohort is None:
            if held + amount > nominal:
                return f"queue {queue}: {_label(key)} quota {_show(key, held, nominal)} in use"
            return None
        if held + amount > nominal + borrow:
            top = _show(key, held, nominal + borrow)
            return f"queue {queue}: {_label(key)} {top} in use (nominal + borrowing_limit)"
        own = nominal - lend
        mine = max(held - own, 0)
        others = self._drawn[cohort].get(key, 0) - mine
        pool = self._lendable[cohort].get(key, 0)
        if others + max(held + amount - own, 0) > pool:
            left = max(pool - others - mine, 0)
            return (
                f"queue {queue}: {_label(key)} quota {_show(key, held, nominal)} in use, "
                f"cohort {cohort} has {_amount(key, left)} to lend"
            )
        return None

    def admit(self, queue: str, req: Request, times: int = 1) -> tuple[tuple[str, ...] | None, str]:
        """Whether ``times`` replicas asking ``req`` fit the queue's quota: the GPU
        models they may be placed on (None: any the request allows) and "", or the
        reason they wait. A GPU request is admitted on each model the queue has room
        for; the placer is then held to those."""
        base: Usage = {"cpu": req.cpu, "memory": req.memory}
        models = self.gpu_models(queue)
        why = self.why_not(queue, base, times)
        if req.gpu == 0 or models is None:
            return None, why or ""
        allowed = [m for m in models if not req.gpu_models or m in req.gpu_models]
        if not allowed:
            return (), f"queue {queue} has no quota for the gpu models the group asks"
        if why:  # as the first model's whole ask says it (its keys in order)
            return (), self.why_not(queue, {**base, gpu_key(allowed[0]): req.milli}, times) or why
        fits = []
        for m in allowed:
            reason = self._key(queue, gpu_key(m), req.milli * times)
            if reason is None:
                fits.append(m)
            elif not why:
                why = reason
        return (tuple(fits), "") if fits else ((), why or "")

    def contested(self, queue: str) -> bool:
        """Whether the queue shares a cohort: what it borrows goes in fair-share order."""
        members = self._members.get(queue)
        return members is not None and len(members) > 1

    def borrowing(self, queue: str, req: Request, times: int = 1) -> Usage | None:
        """What ``times`` replicas asking ``req`` hold (a GPU one on the first model it
        may use), when they take a queue sharing a cohort above its nominal quota
        (a GPU one: on every model it may use); None when they do not."""
        if not self.contested(queue):
            return None
        limits, used = self._limits[queue], self.usage.get(queue, {})
        ask: Usage = {"cpu": req.cpu * times, "memory": req.memory * times}
        above = False
        for key, amount in ask.items():
            lim = limits.get(key)
            above = above or (lim is not None and used.get(key, 0) + amount > lim[0])
        models = self._models[queue]
        if req.gpu and models:
            allowed = [m for m in models if not req.gpu_models or m in req.gpu_models]
            if not allowed:
                return None  # refused by admit(), not set aside
            amount = req.milli * times  # (milli: every device's together)
            nominal = [limits[gpu_key(m)][0] for m in allowed]
            held = [used.get(gpu_key(m), 0) for m in allowed]
            above = above or all(h + amount > n for h, n in zip(held, nominal, strict=True))
            ask[gpu_key(allowed[0])] = amount
        return ask if above else None

    def within(self, queue: str, req: Request, times: int = 1) -> bool:
        """Whether ``times`` replicas asking ``req`` keep a queue of a cohort within
        its nominal quota (a GPU one: on some model it may use): what it may reclaim
        from the cohort's borrowers when the pool has nothing left to lend."""
        if queue not in self._members:
            return False
        limits, used = self._limits[queue], self.usage.get(queue, {})
        for key, amount in (("cpu", req.cpu * times), ("memory", req.memory * times)):
            lim = limits.get(key)
            if lim is not None and used.get(key, 0) + amount > lim[0]:
                return False
        models = self._models[queue]
        if not req.gpu or not models:
            return True
        amount = req.milli * times
        return any(
            used.get(gpu_key(m), 0) + amount <= limits[gpu_key(m)][0]
            for m in models
            if not req.gpu_models or m in req.gpu_models
        )

    def fair_claim(self, queue: str, req: Request) -> float | None:
        """What the queue's weighted share would be holding one more replica asking
        ``req`` above its nominal quota, when some other queue of its cohort that is
        borrowing holds a larger one: the share a fair-share preemption may take it
        to (None: no queue is richer, or the queue would not borrow). O(members)."""
        ask = self.borrowing(queue, req)
        if ask is None:
            return None
        final = self.share(queue, ask)
        for other in self._members[queue]:
            if other != queue and self.borrowed(other) and self.share(other) > final:
                return final
        return None

    def keys(self, queue: str, req: Request) -> frozenset[str]:
        """The quota keys of ``queue`` a replica asking ``req`` would take from."""
        limits = self._limits.get(queue, {})
        out: set[str] = {k for k in ("cpu", "memory") if k in limits and getattr(req, k)}
        if req.gpu:
            out.update(
                gpu_key(m)
                for m in self._models.get(queue, ())
                if not req.gpu_models or m in req.gpu_models
            )
        return frozenset(out)

    def members(self, queue: str) -> list[str]:
        """The queues of ``queue``'s cohort, itself included (none: no cohort)."""
        return self._members.get(queue, [])

    def borrowing_in(self, queue: str, keys: Iterable[str]) -> bool:
        """Whether the queue holds more than its nominal quota of one of ``keys``."""
        used, limits = self.usage.get(queue, {}), self._limits.get(queue, {})
        return any(k in limits and used.get(k, 0) > limits[k][0] for k in keys)

    def borrowed(self, queue: str) -> bool:
        """Whether the queue holds more than its nominal quota of some resource."""
        used = self.usage.get(queue, {})
        return any(used.get(k, 0) > lim[0] for k, lim in self._limits.get(queue, {}).items())

    def share(self, queue: str, more: Usage | None = None) -> float:
        """The queue's weighted dominant share of its cohort's pool (Kueue's fair
        sharing, DRF over what it borrows), holding ``more`` besides what it holds:
        per resource, its usage above nominal over what the cohort lends; the
        largest, divided by the queue's weight. GPUs count as one resource here,
        every model's devices together (quotas stay per model): a queue holding a
        rare model's 8 devices is no richer than one holding 8 of a common one's."""
        spec = self.queues.get(queue)
        if spec is None or spec.cohort is None:
            return 0.0
        used, more, pools = self.usage.get(queue, {}), more or {}, self._pools[queue]
        over: dict[str, int] = {}
        for key, (nominal, _, _) in self._limits[queue].items():
            above = used.get(key, 0) + more.get(key, 0) - nominal
            if above > 0:
                kind = "gpu" if key.startswith("gpu:") else key
                over[kind] = over.get(kind, 0) + above
        top = max((v / pools[k] if pools.get(k) else 1.0 for k, v in over.items()), default=0.0)
        return top / spec.weight

    def take(self, queue: str, use: Usage) -> None:
        """A replica of ``queue`` was bound holding ``use``."""
        self._add(queue, use, 1)

    def give(self, queue: str, use: Usage) -> None:
        """A replica of ``queue`` holding ``use`` was released."""
        self._add(queue, use, -1)

    def _add(self, queue: str, use: Usage, sign: int) -> None:
        if queue == DEFAULT_QUEUE:
            return
        mine = self.usage.setdefault(queue, {})
        limits, spec = self._limits.get(queue, {}), self.queues.get(queue)
        drawn = self._drawn[spec.cohort] if spec is not None and spec.cohort else None
        for key, amount in use.items():
            before = mine.get(key, 0)
            mine[key] = before + sign * amount
            lim = limits.get(key)
            if drawn is not None and lim is not None:
                own = lim[0] - lim[2]
                change = max(mine[key] - own, 0) - max(before - own, 0)
                drawn[key] = drawn.get(key, 0) + change


def _label(key: str) -> str:
    return f"gpu {key[4:]}" if key.startswith("gpu:") else key


def _amount(key: str, value: int) -> str:
    if key.startswith("gpu:"):
        return f"{value / GPU_MILLI:g}"
    return f"{value}{' MiB' if key == 'memory' else 'm'}"


def _show(key: str, held: int, top: int) -> str:
    if key.startswith("gpu:"):
        return f"{held / GPU_MILLI:g}/{top / GPU_MILLI:g}"
    return f"{held}/{top}"
