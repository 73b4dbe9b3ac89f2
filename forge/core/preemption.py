"""Preemption: which lower-priority replicas to evict so that a replica that fits
nowhere runs, chosen as kube-scheduler's DefaultPreemption chooses.

Pure and deterministic, beside placement: it reads the pass's :class:`Cluster`
(simulating evictions on a node's allocation and restoring it exactly) and says
where and whom; the reconcile pass releases the victims and binds the preemptor
in the same plan, so the store receives both in one fenced delta and no replica
is ever "nominated" to a node without holding it.

The rules (issue 21, after Nomad's and Borg's):

* a victim's job priority is at least ``min_gap`` below the preemptor's, and at
  most its ``cap`` (a replica that was itself preempted may not take anything
  within ``min_gap`` of the priority that preempted it: no cascades);
* a replica preempted within the cooldown is no victim (no thrash);
* a group's disruption budget (``disruption.max_unavailable``) is never exceeded;
* work that asks no GPU never evicts a replica holding GPUs: the devices it would
  free are what the GPU reservation keeps from such work, and would sit idle;
* among the nodes where evicting makes the replica fit, the choice is by the
  lowest highest-victim priority, then the smallest sum of victim priorities,
  then the fewest victims, then the node order (the pass's seeded order);
* the victims are minimal: every candidate whose return leaves the replica
  fitting is put back (highest priority first), as kube-scheduler's reprieve.

Like kube-scheduler (``minCandidateNodesPercentage``), the search stops after a
bounded number of feasible nodes (``candidates``), starting where the previous
search of the pass stopped, so preempting for 5,000 replicas does not cost 5,000
sweeps of the cluster; the work is counted in the pass's budget like placement.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from forge.core.models import Request
from forge.core.placement import Binding, NodeAlloc

__all__ = [
    "DEFAULT_MIN_GAP",
    "PREEMPT_CANDIDATES",
    "Holder",
    "Preemption",
    "Search",
    "find",
]

#: Nomad's rule: a victim is at least this many priority points below.
DEFAULT_MIN_GAP = 10
#: Feasible nodes compared per search (kube-scheduler compares at least 100 of
#: 5,000; the choice key rarely improves past a few dozen on a full cluster).
PREEMPT_CANDIDATES = 32


@dataclass(frozen=True, slots=True)
class Holder:
    """A bound replica that could be evicted: its binding and its job's priority."""

    wid: str
    binding: Binding
    priority: int

    @property
    def group(self) -> tuple[str, str]:
        return (self.binding.job, self.binding.group)


@dataclass(frozen=True, slots=True)
class Preemption:
    """Evict ``victims`` from ``node`` and the preemptor fits there."""

    node: NodeAlloc
    victims: tuple[Holder, ...]

    @property
    def key(self) -> tuple[int, int, int]:
        """The choice order: lowest highest victim, smallest sum, fewest victims."""
        prios = [v.priority for v in self.victims]
        return (max(prios, default=0), sum(prios), len(prios))


@dataclass(frozen=True, slots=True)
class Search:
    """What one search may take: victims at or below ``limit`` priority, none that
    is ``cooling`` (preempted within the cooldown), and of a group at most what
    ``budget`` says (None: the group has no disruption budget)."""

    limit: int
    cooling: Callable[[str], bool]
    budget: Callable[[tuple[str, str]], int | None]


def find(
    req: Request,
    nodes: Sequence[NodeAlloc],
    holders: Callable[[str], Sequence[Holder]],
    search: Search,
    *,
    start: int = 0,
    candidates: int = PREEMPT_CANDIDATES,
    work_left: int = 0,
    node_cost: int = 1,
) -> tuple[Preemption | None, int, int]:
    """The best preemption for ``req`` among ``nodes`` (the statically eligible
    ones, in the pass's order), looking from ``start`` round the list until
    ``candidates`` feasible nodes were compared or ``work_left`` units (0: no
    limit) are spent, each node costing ``node_cost`` units besides its candidates
    (more than one where ``holders`` reads more than it returns). Returns (the choice
    or None, the work spent, where the next search of the pass should start). The
    nodes are left as they were."""
    best: Preemption | None = None
    best_pos = 0
    found = 0
    work = 0
    n = len(nodes)
    pos = start % n if n else 0
    for step in range(n):
        i = (pos + step) % n
        node = nodes[i]
        held = holders(node.node.id)
        work += node_cost + len(held)
        choice = _on_node(node, req, held, search, best.key if best is not None else None)
        if choice is not None:
            found += 1
            if isinstance(choice, Preemption) and (best is None or choice.key < best.key):
                best, best_pos = choice, i
            if found >= candidates:
                break
        if work_left and work >= work_left:
            break
    return best, work, (best_pos + 1 if best is not None else pos)


class _Worse:
    """A node where preemption would work but cannot beat the best found so far."""


WORSE = _Worse()


def _on_node(
    node: NodeAlloc,
    req: Request,
    held: Sequence[Holder],
    search: Search,
    beat: tuple[int, int, int] | None = None,
) -> Preemption | _Worse | None:
    """The minimal victims on ``node`` that let ``req`` fit, or None. Simulated on
    the node's allocation (unhold, then hold back), which is restored exactly.

    ``beat``: the key of the best choice so far. A node that is feasible but whose
    every victim set would rank after it is :data:`WORSE`, told without the
    simulation when that is exact: a request asking no GPU (its candidates hold
    none, so the GPU reservation stays as it is and it fits with them gone exactly
    when cpu and memory room do), no candidate's group under a budget (the minimal
    set is always allowed), the node short as it is (one victim at least) and every
    candidate above ``beat``'s highest victim."""
    limit, cooling = search.limit, search.cooling
    budgets: dict[tuple[str, str], int | None] = {}
    cands = []
    gpu = bool(req.gpu)
    for h in held:
        if h.priority > limit or cooling(h.wid) or (h.binding.gpu_ids and not gpu):
            continue
        key = h.group
        if key not in budgets:
            budgets[key] = search.budget(key)
        left = budgets[key]
        if left is None or left > 0:
            cands.append(h)
    if not cands:
        return None
    # cheap first: even with every candidate gone, is there cpu and memory enough?
    if node.cpu_free + sum(h.binding.cpu for h in cands) < req.cpu:
        return None
    if node.mem_free + sum(h.binding.memory for h in cands) < req.memory:
        return None
    if beat is not None and not gpu and all(budgets[h.group] is None for h in cands):
        cpu_room, mem_room = node.cpu_room(req), node.mem_room(req)
        if cpu_room + sum(h.binding.cpu for h in cands) < req.cpu:
            return None
        if mem_room + sum(h.binding.memory for h in cands) < req.memory:
            return None
        if (cpu_room < req.cpu or mem_room < req.memory) and _cannot_beat(
            beat, cands, req.cpu - cpu_room, req.memory - mem_room
        ):
            return WORSE
    for h in cands:
        node.unhold(h.binding)
    if not node.fits(req):
        _hold_all(node, cands)
        return None
    # reprieve: put back the most important first; what must stay out is a victim
    victims: list[Holder] = []
    for h in sorted(cands, key=lambda h: (-h.priority, h.wid)):
        _hold(node, h)
        if not node.fits(req):
            node.unhold(h.binding)
            victims.append(h)
    _hold_all(node, victims)
    per_group: dict[tuple[str, str], int] = {}
    for v in victims:
        per_group[v.group] = per_group.get(v.group, 0) + 1
    for g, n in per_group.items():
        left = budgets[g]
        if left is not None and n > left:
            return None  # the minimal set would break a disruption budget
    victims.sort(key=lambda h: h.wid)
    return Preemption(node, tuple(victims))


def _cannot_beat(beat: tuple[int, int, int], cands: Sequence[Holder], cpu: int, mem: int) -> bool:
    """No victim set among ``cands`` freeing ``cpu`` and ``mem`` ranks before
    ``beat``: every candidate is above its highest victim, or as high as it is
    and the fewest victims that could free enough (the largest first) would already
    sum to no less with no fewer victims (each then has exactly that priority)."""
    low = min(h.priority for h in cands)
    if low != beat[0]:
        return low > beat[0]
    k = max(
        _fewest([h.binding.cpu for h in cands], cpu),
        _fewest([h.binding.memory for h in cands], mem),
    )
    return (low * k, k) >= beat[1:]


def _fewest(sizes: list[int], need: int) -> int:
    """How many of ``sizes`` at least add up to ``need`` (largest first)."""
    if need <= 0:
        return 0
    got = 0
    for k, size in enumerate(sorted(sizes, reverse=True), 1):
        got += size
        if got >= need:
            return k
    return len(sizes) + 1  # (not reached: the caller checked the sum)


def _hold(node: NodeAlloc, h: Holder) -> None:
    if not node.hold(h.binding):  # it was held before the simulation removed it
        raise AssertionError(f"preemption: {h.wid} no longer fits {node.id}")


def _hold_all(node: NodeAlloc, holders: Sequence[Holder]) -> None:
    for h in holders:
        _hold(node, h)
