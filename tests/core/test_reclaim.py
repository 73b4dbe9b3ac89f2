"""Reclaim (issue 34): a queue within its nominal quota whose cohort lent everything
takes it back from the queues that borrowed it, at any priority, and never more:
a borrower is taken down to its nominal, a queue within its own is never a victim,
and a queue asking beyond its nominal borrows in its turn instead."""

from __future__ import annotations

from forge.core.models import Job, Node
from forge.core.quota import QueueSpec
from forge.core.reconcile import Plan, ReconcileOptions, reconcile
from tests.core.test_fair_share import _held, _prio, _queue
from tests.core.test_quota import _job, _nodes


def _passes(
    first: list[Job],
    then: list[Job],
    queues: list[QueueSpec],
    nodes: dict[str, Node] | None = None,
    preemption: bool = True,
) -> tuple[dict[str, int], Plan]:
    """The first pass's count per job (its bindings are the second's carry), and the
    second pass; on one node of 8 cpus unless ``nodes`` says otherwise."""
    specs = {q.name: q for q in queues}
    nodes = _nodes(1) if nodes is None else nodes
    options = ReconcileOptions(gangs=True, preemption=preemption)
    one = reconcile(
        jobs={j.id: j for j in first},
        nodes=nodes,
        bindings={},
        pending={},
        failures={},
        now=100.0,
        options=options,
        queues=specs,
    )
    held = {j.id: _held(one, j.id) for j in first}
    two = reconcile(
        jobs={j.id: j for j in first + then},
        nodes=nodes,
        bindings=one.bindings,
        pending=one.pending,
        failures=one.failures,
        now=200.0,
        options=options,
        carry=one.carry,
        queues=specs,
    )
    return held, two


def _victims(plan: Plan) -> list[str]:
    return sorted(v for p in plan.preemptions for v in p.victims)


def test_a_queue_takes_back_its_nominal_from_a_borrower_whatever_the_priority() -> None:
    queues = [_queue("a", cpu=4000), _queue("b", cpu=4000)]
    one, two = _passes([_prio(_job("bb", 8, "b"), 90)], [_prio(_job("aa", 4, "a"), 10)], queues)
    assert one == {"bb": 8}  # b borrowed all that a lends
    assert (_held(two, "aa"), _held(two, "bb")) == (4, 4)
    assert len(_victims(two)) == 4 and all(v.startswith("bb/") for v in _victims(two))
    assert two.pending["bb/w/7"].reasons[0].startswith("preempted by aa/w/")
    assert two.carry is not None and two.carry.ledger.usage["b"]["cpu"] == 4000


def test_a_queue_within_its_own_nominal_is_never_a_victim() -> None:
    queues = [_queue("a", cpu=4000), _queue("b", cpu=4000), _queue("c")]
    # b within its nominal, c borrows 4; b's jobs the cheaper victims by priority
    first = [_prio(_job("bb", 4, "b"), 10), _prio(_job("cc", 4, "c"), 90)]
    _, two = _passes(first, [_job("aa", 4, "a")], queues)
    assert (_held(two, "aa"), _held(two, "bb"), _held(two, "cc")) == (4, 4, 0)
    assert all(v.startswith("cc/") for v in _victims(two))


def test_what_is_beyond_nominal_is_not_reclaimed() -> None:
    queues = [_queue("a", cpu=4000), _queue("b", cpu=4000)]
    _, two = _passes([_job("bb", 8, "b")], [_job("aa", 6, "a")], queues)
    assert (_held(two, "aa"), _held(two, "bb")) == (4, 4)
    assert two.pending["aa/w/5"].kind == "queued"
    assert len(_victims(two)) == 4


def test_no_reclaim_without_preemption() -> None:
    queues = [_queue("a", cpu=4000), _queue("b", cpu=4000)]
    _, two = _passes([_job("bb", 8, "b")], [_job("aa", 4, "a")], queues, preemption=False)
    assert (_held(two, "aa"), _held(two, "bb")) == (0, 8) and not two.preemptions


def test_a_reclaim_frees_quota_where_the_nodes_have_room_too() -> None:
    """Two nodes (16 cpus) for a cohort of 8: b holds all 8 and the nodes have room
    for a's 4, but the pool has none: a takes its 4 back from b, and the cohort
    never holds more than its 8."""
    queues = [_queue("a", cpu=4000), _queue("b", cpu=4000)]
    _, two = _passes([_job("bb", 8, "b")], [_job("aa", 4, "a")], queues, _nodes(2))
    assert (_held(two, "aa"), _held(two, "bb")) == (4, 4)
    assert len(_victims(two)) == 4


def test_a_reclaim_binds_only_what_the_freed_quota_admits() -> None:
    """The trade is checked against the quota, not only the node: evicting what a
    node needs must also free what the queue is owed, or nothing happens."""
    queues = [_queue("a", cpu=4000), _queue("b", cpu=4000)]
    _, two = _passes([_job("bb", 8, "b")], [_job("aa", 1, "a", cpu=3000)], queues, _nodes(2))
    held = {q: sum(b.cpu for b in two.bindings.values() if b.job[0] == q[0]) for q in "ab"}
    assert held["a"] + held["b"] <= 8000, held  # never above the cohort's pool
    assert _held(two, "aa") == 1 and held["b"] == 5000, (held, _victims(two))


def test_a_reclaim_where_no_node_has_room_stops_at_the_nominal() -> None:
    """c lends the cohort 8 it does not use, so the pool is not what is short: the one
    node is, full of b's replicas (6 of them borrowed). a's replicas are admitted and
    no node takes them: a takes back room for its nominal 4 from b, then one more by
    fair share (each then borrows 1 of the cohort's 14), not all 6: b would then
    borrow nothing while a borrowed 2 (tests/core/test_fair_preemption.py)."""
    queues = [_queue("a", cpu=4000), _queue("b", cpu=2000), _queue("c", cpu=8000)]
    one, two = _passes([_job("bb", 8, "b")], [_job("aa", 6, "a")], queues)
    assert one == {"bb": 8}
    assert (_held(two, "aa"), _held(two, "bb")) == (5, 3)
    assert len(_victims(two)) == 5


def test_a_reclaim_where_the_node_has_room_evicts_by_quota() -> None:
    """One 16-cpu node, a cohort of 8: b holds all 8 and the node has room for a's 2,
    so the node needs no victim; the quota does: two of b's, the most recent first."""
    big = Node.model_validate({"id": "big", "cpu": 16000, "memory": 65536})
    queues = [_queue("a", cpu=4000), _queue("b", cpu=4000)]
    _, two = _passes([_job("bb", 8, "b")], [_job("aa", 2, "a")], queues, {"big": big})
    assert (_held(two, "aa"), _held(two, "bb")) == (2, 6)
    assert _victims(two) == ["bb/w/6", "bb/w/7"]


def test_a_reclaim_takes_only_from_a_queue_borrowing_what_it_asks() -> None:
    """b holds its cpu nominal and borrows memory (c lends it); a, within its cpu
    nominal, finds the node full: b's replicas are no victims for it (evicting them
    would give back memory a does not ask). A queue borrowing one resource and one
    within another took replicas from each other pass after pass (5k/50k, 20 queues)."""
    queues = [
        _queue("a", cpu=4000),
        QueueSpec.model_validate(
            {"name": "b", "cohort": "research",
             "quota": {"cpu": {"nominal": 4000}, "memory": {"nominal": 2048}}}
        ),
        QueueSpec.model_validate(
            {"name": "c", "cohort": "research", "quota": {"memory": {"nominal": 8192}}}
        ),
    ]  # fmt: skip
    first = [_job("bb", 8, "b", cpu=500), _job("dd", 4, "default")]
    one, two = _passes(first, [_job("aa", 4, "a")], queues)
    assert one == {"bb": 8, "dd": 4}  # b: 4000 of 4000 cpu, 4096 of 2048 memory
    assert (_held(two, "aa"), _held(two, "bb")) == (0, 8) and not two.preemptions
