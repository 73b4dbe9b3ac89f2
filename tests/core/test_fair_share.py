"""Fair share between a cohort's queues (issue 34): what the queues borrow goes to the
one with the lowest weighted dominant share of the pool, whatever the priority of
its jobs (within a queue, priority still orders).

The shape: a ``pool`` queue lends the cohort everything (its jobs run nowhere), and
queues that own nothing borrow all they run, so their usage *is* their share.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from forge.core.admission import Admission
from forge.core.models import Job
from forge.core.quota import QueueSpec
from forge.core.reconcile import Plan, ReconcileOptions, reconcile
from tests.core.test_quota import _job, _nodes


def _queue(name: str, cpu: int = 0, weight: int = 1, **gpu: int) -> QueueSpec:
    quota: dict[str, Any] = {"cpu": {"nominal": cpu}}
    if gpu:
        quota["gpu"] = {m: {"nominal": n} for m, n in gpu.items()}
    return QueueSpec.model_validate(
        {"name": name, "cohort": "research", "weight": weight, "quota": quota}
    )


def _prio(job: Job, priority: int) -> Job:
    return job.model_copy(update={"priority": priority})


def _plan(
    jobs: list[Job], queues: list[QueueSpec], nodes: int = 1, max_placements: int = 1000
) -> Plan:
    return reconcile(
        jobs={j.id: j for j in jobs},
        nodes=_nodes(nodes),
        bindings={},
        pending={},
        failures={},
        now=100.0,
        options=ReconcileOptions(gangs=True, max_placements=max_placements),
        queues={q.name: q for q in queues},
    )


def _held(plan: Plan, job: str) -> int:
    return sum(1 for b in plan.bindings.values() if b.job == job)


def test_two_queues_of_one_weight_split_the_pool_whatever_their_priority() -> None:
    # one node of 8 cpus; a's job has the higher priority and wants all of them
    queues = [_queue("pool", cpu=8000), _queue("a"), _queue("b")]
    jobs = [_prio(_job("hi", 8, "a"), 90), _prio(_job("lo", 8, "b"), 10)]
    plan = _plan(jobs, queues)
    assert (_held(plan, "hi"), _held(plan, "lo")) == (4, 4)
    assert plan.pending["hi/w/7"].reasons == (
        "queue a: cpu quota 4000/0 in use, cohort research has 0m to lend",
    )


def test_weights_divide_the_pool() -> None:
    queues = [_queue("pool", cpu=9000), _queue("a", weight=2), _queue("b")]
    nodes = 2  # 16 cpus: the pool (9), not the nodes, is what runs out
    plan = _plan([_job("x", 9, "a"), _job("y", 9, "b")], queues, nodes)
    assert (_held(plan, "x"), _held(plan, "y")) == (6, 3)
    assert plan.pending["y/w/3"].reasons == (
        "queue b: cpu quota 3000/0 in use, cohort research has 0m to lend",
    )


def test_within_a_queue_priority_still_orders_the_borrowers() -> None:
    queues = [_queue("pool", cpu=4000), _queue("a"), _queue("b")]
    jobs = [_prio(_job("lo", 4, "a"), 10), _prio(_job("hi", 4, "a"), 90), _job("o", 4, "b")]
    plan = _plan(jobs, queues)
    assert (_held(plan, "hi"), _held(plan, "lo"), _held(plan, "o")) == (2, 0, 2)


def test_a_queue_within_its_nominal_does_not_wait_for_the_round() -> None:
    # a's 2 cpus of nominal are placed in the walk; above them it borrows as much as
    # b does (the pool is 6: pool's 4 and the 2 a lends while it holds less)
    queues = [_queue("pool", cpu=4000), _queue("a", cpu=2000), _queue("b")]
    plan = _plan([_prio(_job("x", 8, "a"), 10), _prio(_job("y", 8, "b"), 90)], queues)
    assert (_held(plan, "x"), _held(plan, "y")) == (4, 2)


def test_a_gang_borrows_whole_in_its_turn() -> None:
    queues = [_queue("pool", cpu=8000), _queue("a"), _queue("b")]
    jobs = [_job("g", 4, "a", gang=True), _job("s", 8, "b")]
    plan = _plan(jobs, queues)
    assert (_held(plan, "g"), _held(plan, "s")) == (4, 4)


def test_the_placement_limit_defers_the_borrowers_it_leaves() -> None:
    queues = [_queue("pool", cpu=8000), _queue("a"), _queue("b")]
    plan = _plan([_job("x", 8, "a"), _job("y", 8, "b")], queues, max_placements=3)
    assert len(plan.placed) == 3 and plan.deferred == 13
    kinds = {e.kind for e in plan.pending.values()}
    assert kinds == {"deferred"}


def test_the_share_is_the_largest_borrowed_fraction_over_the_weight() -> None:
    queues = [_queue("pool", cpu=8000, A100=4), _queue("a", weight=2, A100=0)]
    adm = Admission({q.name: q for q in queues}, {"a": {"cpu": 2000, "gpu:A100": 2000}})
    assert adm.share("a") == 0.25  # gpus 2/4 = 0.5 dominates cpu 2/8, over weight 2
    assert adm.share("a", {"cpu": 6000}) == 0.5  # with 6 cpus more: 8/8 over 2
    assert adm.share("pool") == 0.0  # within its nominal


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.integers(1, 3), min_size=2, max_size=4),
    st.lists(st.integers(1, 100), min_size=4, max_size=4),
)
def test_queues_wanting_more_than_the_pool_end_fair_up_to_one_replica(
    weights: list[int], priorities: list[int]
) -> None:
    """Each of 2-4 borrowing queues wants the whole pool (24 one-cpu replicas on 4
    nodes); whatever the priorities of their jobs, the pass ends fair up to one
    replica: no queue's weighted share is above what another's would be with one
    replica more (so each is within one replica of its weighted part, at equal
    weights)."""
    pool = 24
    queues = [_queue("pool", cpu=pool * 1000)]
    queues += [_queue(f"q{i}", weight=w) for i, w in enumerate(weights)]
    jobs = [_prio(_job(f"j{i}", pool, f"q{i}"), priorities[i]) for i in range(len(weights))]
    plan = _plan(jobs, queues, nodes=4)  # 32 cpus of nodes: the pool binds first
    held = [_held(plan, f"j{i}") for i in range(len(weights))]
    assert sum(held) == pool
    for i, wi in enumerate(weights):
        for j, wj in enumerate(weights):
            assert held[i] / wi <= (held[j] + 1) / wj, (weights, held)
    if len(set(weights)) == 1:
        assert max(held) - min(held) <= 1


def test_gpus_count_as_one_resource_in_the_share() -> None:
    # a holds both devices of a rare model (G3: 2 of the pool's 100 GPUs)
    queues = [_queue("pool", cpu=8000, A100=98, G3=2), _queue("a", A100=0, G3=0)]
    adm = Admission({q.name: q for q in queues}, {"a": {"gpu:G3": 2000}})
    assert adm.share("a") == 0.02  # not 1.0: 2 of the cohort's 100 devices


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(0, 12), min_size=3, max_size=3),
    st.integers(0, 6),
    st.integers(1, 3),
    st.booleans(),
)
def test_the_quick_look_admits_only_what_the_rule_admits_without_borrowing(
    held: list[int], lend: int, times: int, cohort: bool
) -> None:
    """``Admission.plainly`` (the common case in one look) says yes only where the
    full rule admits and nothing is borrowed."""
    spec = {"nominal": 6000, "lending_limit": lend * 1000}
    queues = {
        n: QueueSpec.model_validate(
            {"name": n, "cohort": "c" if cohort else None, "quota": {"cpu": spec}}
        )
        for n in ("a", "b", "c")
    }
    usage = {n: {"cpu": h * 1000} for n, h in zip(queues, held, strict=True)}
    adm = Admission(queues, usage)
    req = _job("x", 1, "a").groups[0].request()
    if adm.plainly("a", req, times):
        assert adm.admit("a", req, times) == (None, "")
        assert adm.borrowing("a", req, times) is None
    elif held[0] + times <= 6 and not cohort:
        raise AssertionError("a queue within its nominal was not admitted at a look")


def test_the_queued_count_counts_each_borrower_once() -> None:
    """A borrower is asked twice in a pass (set aside by the walk, refused in its turn):
    the count the status publishes is of replicas, each once."""
    queues = [_queue("pool", cpu=8000), _queue("a"), _queue("b")]
    plan = _plan([_job("aa", 8, "a"), _job("bb", 8, "b")], queues)
    assert (_held(plan, "aa"), _held(plan, "bb")) == (4, 4)
    queued = {w.split("/")[0] for w, e in plan.pending.items() if e.kind == "queued"}
    assert queued == {"aa", "bb"}
    assert plan.carry is not None and plan.carry.ledger.queued == {"a": 4, "b": 4}
