"""Queues and quotas (issue 34): Kueue's fit rule, and the pass that asks it.

The rule first, by example and as properties (no queue above its nominal plus its
borrowing limit, a cohort never above what its members pool, a member's unlent
part always its own); then reconcile with queues over random clusters and passes
(carried from one pass to the next, replicas failing between them): the bindings
never hold more than a queue may, a gang is admitted whole or not at all, and the
carry's running totals are what the bindings hold.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from forge.core.admission import Admission
from forge.core.models import Job, Node, Request
from forge.core.quota import DEFAULT_QUEUE, Ledger, QueueSpec, Usage, gpu_key, held
from forge.core.reconcile import Plan, ReconcileOptions, reconcile


def _q(name: str, cohort: str | None = None, **quota: Any) -> QueueSpec:
    return QueueSpec.model_validate({"name": name, "cohort": cohort, "quota": quota})


def _cpu(nominal: int, **more: int) -> dict[str, Any]:
    return {"cpu": {"nominal": nominal, **more}}


def _adm(*queues: QueueSpec, **usage: Usage) -> Admission:
    return Admission({q.name: q for q in queues}, usage)


def test_a_queue_without_a_cohort_holds_its_nominal_and_no_more() -> None:
    adm = _adm(_q("ml", **_cpu(4000)), ml={"cpu": 3000})
    assert adm.why_not("ml", {"cpu": 1000}) is None
    assert adm.why_not("ml", {"cpu": 1001}) == "queue ml: cpu quota 3000/4000 in use"
    assert adm.why_not("ml", {"memory": 10**6}) is None  # not named: not limited
    assert adm.why_not(DEFAULT_QUEUE, {"cpu": 10**6}) is None
    assert not adm.limited(DEFAULT_QUEUE)
    # deleted while a job naming it was on its way: nothing is admitted
    assert adm.why_not("web", {"cpu": 1}) == "no queue 'web' (forge queue apply)"


def test_a_cohort_lends_unused_nominal_up_to_the_borrowing_limit() -> None:
    ml = _q("ml", "research", **_cpu(4000, borrowing_limit=2000))
    nlp = _q("nlp", "research", **_cpu(4000))
    adm = _adm(ml, nlp, ml={"cpu": 4000})
    assert adm.why_not("ml", {"cpu": 2000}) is None  # borrows nlp's idle quota
    assert adm.why_not("ml", {"cpu": 2001}) == (
        "queue ml: cpu 4000/6000 in use (nominal + borrowing_limit)"
    )
    adm.take("nlp", {"cpu": 3000})  # nlp uses most of its own now
    assert adm.why_not("ml", {"cpu": 1000}) is None
    assert adm.why_not("ml", {"cpu": 1001}) == (
        "queue ml: cpu quota 4000/4000 in use, cohort research has 1000m to lend"
    )


def test_a_lending_limit_keeps_the_rest_of_nominal_for_its_queue() -> None:
    ml = _q("ml", "research", **_cpu(4000))
    nlp = _q("nlp", "research", **_cpu(4000, lending_limit=1000))
    adm = _adm(ml, nlp, ml={"cpu": 4000})
    assert adm.why_not("ml", {"cpu": 1000}) is None
    assert adm.why_not("ml", {"cpu": 1001}) is not None  # 3000 of nlp's are its own
    adm.take("ml", {"cpu": 1000})
    assert adm.why_not("nlp", {"cpu": 3000}) is None  # its own part, borrowed or not


def test_a_queue_naming_gpu_models_may_use_only_those() -> None:
    q = _q("ml", gpu={"A100": {"nominal": 2}})
    adm = _adm(q)
    any_gpu = Request(cpu=1000, memory=1024, gpu=1)
    assert adm.admit("ml", any_gpu) == (("A100",), "")
    assert adm.admit("ml", any_gpu, times=3) == ((), "queue ml: gpu A100 quota 0/2 in use")
    t4 = Request(cpu=1000, memory=1024, gpu=1, gpu_models=("T4",))
    assert adm.admit("ml", t4)[1] == "queue ml has no quota for the gpu models the group asks"
    share = Request(cpu=1000, memory=1024, gpu=1, gpu_milli=300)
    adm.take("ml", {gpu_key("A100"): 1700})
    assert adm.admit("ml", share) == (("A100",), "")  # 0.3 of a device is 300 milli
    adm.take("ml", {gpu_key("A100"): 1000})
    assert adm.admit("ml", share)[1] == "queue ml: gpu A100 quota 2.7/2 in use"


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        ({"name": "ml", "quota": {"cpu": {"nominal": -1}}}, "nominal"),
        ({"name": "ml", "quota": {"cpu": {"nominal": 2, "lending_limit": 3}}}, "lending_limit"),
        ({"name": "default"}, "default"),
        ({"name": "ml", "quota": {"gpus": {}}}, "gpus"),
        ({"name": "ml", "weight": 0}, "weight"),
    ],
)
def test_bad_queues_are_refused_naming_the_field(bad: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError, match=field):
        QueueSpec.model_validate(bad)


# -- properties of the rule ---------------------------------------------------------

_limits = st.fixed_dictionaries(
    {"nominal": st.integers(0, 8)},
    optional={"borrowing_limit": st.integers(0, 8), "lending_limit": st.integers(0, 8)},
).map(
    lambda d: (
        {**d, "lending_limit": min(d["lending_limit"], d["nominal"])} if "lending_limit" in d else d
    )
)


@st.composite
def _cohort(draw: st.DrawFn) -> list[QueueSpec]:
    n = draw(st.integers(1, 4))
    return [
        QueueSpec.model_validate(
            {
                "name": f"q{i}",
                "cohort": draw(st.sampled_from(["c", None])),
                "quota": {"cpu": draw(_limits)},
            }
        )
        for i in range(n)
    ]


@given(
    _cohort(), st.lists(st.tuples(st.integers(0, 3), st.integers(1, 3), st.booleans()), max_size=60)
)
def test_admitting_one_at_a_time_keeps_every_bound(
    queues: list[QueueSpec], asks: list[tuple[int, int, bool]]
) -> None:
    adm = _adm(*queues)
    held: dict[str, list[int]] = {q.name: [] for q in queues}
    for i, amount, release in asks:
        q = queues[i % len(queues)]
        if release and held[q.name]:
            adm.give(q.name, {"cpu": held[q.name].pop()})
            continue
        used = sum(held[q.name])
        lim = q.quota.cpu
        assert lim is not None
        own = lim.nominal - (lim.nominal if lim.lending_limit is None else lim.lending_limit)
        why = adm.why_not(q.name, {"cpu": amount})
        if used + amount <= own:
            assert why is None, "a queue's unlent nominal is always its own"
        if why is None:
            adm.take(q.name, {"cpu": amount})
            held[q.name].append(amount)
        for m in queues:  # every bound, after every step
            mine = sum(held[m.name])
            top = m.quota.cpu
            assert top is not None
            cap = top.nominal + (10**9 if top.borrowing_limit is None else top.borrowing_limit)
            assert mine <= (cap if m.cohort else top.nominal)
        pooled = [m for m in queues if m.cohort == "c"]
        total = sum(m.quota.cpu.nominal for m in pooled if m.quota.cpu)
        assert sum(sum(held[m.name]) for m in pooled) <= total


# -- the pass -----------------------------------------------------------------------


def _nodes(n: int, model: str = "A100") -> dict[str, Node]:
    return {
        f"{model}-{i}": Node.model_validate(
            {
                "id": f"{model}-{i}",
                "cpu": 8000,
                "memory": 32768,
                "gpus": [{"id": str(j), "model": model, "memory": 40960} for j in range(4)],
            }
        )
        for i in range(n)
    }


def _job(
    name: str, n: int, queue: str, *, gpu: int = 0, gang: bool = False, cpu: int = 1000
) -> Job:
    return Job.model_validate(
        {
            "name": name,
            "queue": queue,
            "groups": [
                {
                    "name": "w",
                    "gang": gang,
                    "scaling": {"max": 64, "desired": n},
                    "tasks": [
                        {
                            "name": "t",
                            "resources": {"cpu": cpu, "memory": 512, "gpu": {"count": gpu}},
                        }
                    ],
                }
            ],
        }
    )


def _pass(
    jobs: dict[str, Job], nodes: dict[str, Node], queues: list[QueueSpec], plan: Plan | None = None
) -> Plan:
    return reconcile(
        jobs=jobs,
        nodes=nodes,
        bindings=plan.bindings if plan else {},
        pending=plan.pending if plan else {},
        failures={},
        now=100.0,
        options=ReconcileOptions(gangs=True),
        carry=plan.carry if plan else None,
        queues={q.name: q for q in queues},
    )


def _usage(plan: Plan, jobs: dict[str, Job], nodes: dict[str, Node]) -> dict[str, Usage]:
    ledger = Ledger()
    for wid, b in plan.bindings.items():
        if jobs[b.job].queue != DEFAULT_QUEUE:
            ledger.hold(wid, jobs[b.job].queue, b, nodes[b.node])
    return ledger.usage


def _nonzero(usage: dict[str, Usage]) -> dict[str, Usage]:
    out = {q: {k: v for k, v in u.items() if v} for q, u in usage.items()}
    return {q: u for q, u in out.items() if u}


def test_a_queue_at_its_quota_leaves_the_rest_queued_saying_why() -> None:
    nodes = _nodes(4)
    jobs = {"a": _job("a", 6, "ml", gpu=1), "b": _job("b", 2, DEFAULT_QUEUE, gpu=1)}
    plan = _pass(jobs, nodes, [_q("ml", gpu={"A100": {"nominal": 4}})])
    bound = sorted(b.workload_id for b in plan.placed)
    assert [w for w in bound if w.startswith("a/")] == [f"a/w/{i}" for i in range(4)]
    assert len([w for w in bound if w.startswith("b/")]) == 2  # default: no quota
    for i in (4, 5):
        entry = plan.pending[f"a/w/{i}"]
        assert entry.kind == "queued"
        assert entry.reasons == ("queue ml: gpu A100 quota 4/4 in use",)


def test_the_placer_is_held_to_the_models_its_queue_has_room_for() -> None:
    nodes = {**_nodes(1, "T4"), **_nodes(1, "A100")}  # T4 first: the bin-packer's pick
    q = _q("ml", gpu={"A100": {"nominal": 2}, "T4": {"nominal": 1}})
    plan = _pass({"a": _job("a", 3, "ml", gpu=1)}, nodes, [q])
    models = sorted(nodes[b.node].gpus[0].model for b in plan.placed)
    assert models == ["A100", "A100", "T4"]


def test_a_gang_is_admitted_whole_or_not_at_all() -> None:
    nodes = _nodes(4)
    q = _q("ml", gpu={"A100": {"nominal": 6}})
    jobs = {"a": _job("a", 4, "ml", gpu=1, gang=True), "b": _job("b", 4, "ml", gpu=1, gang=True)}
    plan = _pass(jobs, nodes, [q])
    assert sorted({b.job for b in plan.placed}) == ["a"]
    assert [plan.pending[f"b/w/{i}"].kind for i in range(4)] == ["queued"] * 4
    assert plan.pending["b/w/0"].reasons == ("queue ml: gpu A100 quota 4/6 in use",)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 2), st.integers(1, 6), st.integers(0, 2), st.booleans()),
        min_size=1,
        max_size=8,
    ),
    st.lists(st.integers(0, 40), max_size=6),
    _cohort(),
)
def test_passes_with_queues_never_bind_beyond_a_quota(
    shapes: list[tuple[int, int, int, bool]], fail: list[int], cohort: list[QueueSpec]
) -> None:
    """Random jobs in random queues of one cohort (cpu quotas in cores), passes carried
    from one to the next with some replicas failing between: the bindings hold no
    more than each queue may, gangs are whole, and the carry's totals are exact."""
    queues = [
        QueueSpec.model_validate(
            {
                **q.model_dump(exclude={"quota"}),
                "quota": {
                    "cpu": {
                        k: v * 1000 for k, v in q.quota.cpu.model_dump(exclude_none=True).items()
                    }
                },
            }
        )
        for q in cohort
        if q.quota.cpu is not None
    ]
    names = [q.name for q in queues] + [DEFAULT_QUEUE]
    jobs = {
        f"j{i}": _job(f"j{i}", n, names[qi % len(names)], gang=gang, cpu=1000 * (1 + c))
        for i, (qi, n, c, gang) in enumerate(shapes)
    }
    nodes = _nodes(3)
    plan = _pass(jobs, nodes, queues)
    for round_ in range(3):
        used = _usage(plan, jobs, nodes)
        assert plan.carry is not None
        assert _nonzero(plan.carry.ledger.usage) == _nonzero(used)
        adm = Admission({q.name: q for q in queues}, {})
        for q in queues:
            assert adm.why_not(q.name, {}) is None
            cpu = used.get(q.name, {}).get("cpu", 0)
            lim = q.quota.cpu
            assert lim is not None
            cap = lim.nominal + (10**12 if lim.borrowing_limit is None else lim.borrowing_limit)
            assert cpu <= (cap if q.cohort else lim.nominal), (q, cpu)
        pooled = [q for q in queues if q.cohort == "c"]
        total = sum(q.quota.cpu.nominal for q in pooled if q.quota.cpu)
        assert sum(used.get(q.name, {}).get("cpu", 0) for q in pooled) <= total
        for job in jobs.values():
            if job.groups[0].gang:
                n = sum(1 for b in plan.bindings.values() if b.job == job.id)
                assert n in (0, job.groups[0].scaling.desired), job.id
        wids = sorted(plan.bindings)
        failed = [wids[i % len(wids)] for i in fail] if wids and round_ < 2 else []
        plan = reconcile(
            jobs=jobs,
            nodes=nodes,
            bindings=plan.bindings,
            pending=plan.pending,
            failures=plan.failures,
            failed=failed,
            now=100.0 + 1000 * (round_ + 1),
            options=ReconcileOptions(gangs=True),
            carry=plan.carry,
            queues={q.name: q for q in queues},
        )


def test_the_ledger_charges_a_binding_once_and_by_its_devices_model() -> None:
    nodes = _nodes(1)
    plan = _pass({"a": _job("a", 2, "ml", gpu=2)}, nodes, [_q("ml", gpu={"A100": {"nominal": 8}})])
    b = plan.placed[0]
    assert held(b, nodes[b.node]) == {"cpu": 1000, "memory": 512, gpu_key("A100"): 2000}
    ledger = Ledger()
    ledger.hold("x", "ml", b, nodes[b.node])
    ledger.hold("x", "ml", b, nodes[b.node])  # restamped: charged again, not twice
    assert ledger.usage["ml"][gpu_key("A100")] == 2000
    ledger.drop("x")
    ledger.drop("x")
    assert ledger.usage["ml"][gpu_key("A100")] == 0
