"""Placement: filters explain, scorers are bounded, the placer is deterministic and
complete (a bounded candidate window never leaves a fitting replica unplaced)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from forge.core.models import (
    AssignmentStatus,
    Constraint,
    GpuDevice,
    Node,
    NodeState,
    Request,
    TaskGroup,
)
from forge.core.placement import (
    Binding,
    BinPack,
    Cluster,
    Diagnosis,
    NodeAlloc,
    Placer,
    Rejection,
    Rule,
    Spread,
    combined,
    diagnose,
    diagnosis_text,
    explain_node,
    read_diagnosis,
    rejection_text,
    scorers_for,
    utilisation_after,
)
from forge.core.placement.classes import EquivalenceClass
from forge.core.placement.kernel import default_score, fits
from forge.core.placement.scan import AVOID_PENALTY, best_in_window
from forge.core.placement.scorers import fast_scorer as _fast_scorer
from forge.core.plan import DEFAULT_GPU_RESERVE
from tests import strategies as fs
from tests.builders import node

FAST = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def alloc(n: Node) -> NodeAlloc:
    return Cluster([n]).nodes[0]


def req(
    cpu: int = 1000,
    memory: int = 1024,
    gpu: int = 0,
    gpu_memory: int = 0,
    models: tuple[str, ...] = (),
) -> Request:
    return Request(cpu=cpu, memory=memory, gpu=gpu, gpu_memory=gpu_memory, gpu_models=models)


ZONE_A = Constraint(label="zone", op="=", values=("a",))


# -- filters -----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("n", "r", "constraints", "reason"),
    [
        (node("n", state=NodeState.DRAINING), req(), (), "draining"),
        (node("n", state=NodeState.LOST), req(cpu=10**6), (), "lost"),
        (node("n", labels={"zone": "b"}), req(), (ZONE_A,), "constraint zone = a"),
        (node("n"), req(), (Constraint(label="disk", op="exists"),), "constraint disk exists"),
        (node("n", gpus=2, model="T4"), req(gpu=1, models=("A100",)), (), "gpu model"),
        (
            node("n", gpus=2, gpu_memory=16000),
            req(gpu=1, gpu_memory=40000),
            (),
            "insufficient gpu memory",
        ),
        (node("n", gpus=1), req(gpu=2), (), "insufficient gpu"),
        (node("n"), req(gpu=1), (), "insufficient gpu"),
        (node("n", cpu=500), req(cpu=1000, memory=10**6), (), "insufficient cpu"),
        (node("n", memory=512), req(), (), "insufficient memory"),
        (node("n", gpus=1, labels={"zone": "a"}), req(gpu=1), (ZONE_A,), None),
    ],
)
def test_explain_node_gives_the_first_reason_per_dimension(
    n: Node, r: Request, constraints: tuple[Constraint, ...], reason: str | None
) -> None:
    why = explain_node(alloc(n), r, constraints)
    assert (None if why is None else rejection_text(why)) == reason


def test_gpu_count_filter_sees_devices_in_use() -> None:
    a = alloc(node("n", gpus=2))
    a.allocate(req(gpu=1, cpu=1, memory=1))
    assert explain_node(a, req(gpu=1), ()) is None
    assert explain_node(a, req(gpu=2), ()) == Rejection(Rule.GPU, asked=2, free=1)


def test_a_diagnosis_counts_causes_and_reads_like_kubernetes() -> None:
    c = Cluster(
        [
            node("a", cpu=500),
            node("b", cpu=500),
            node("c", state=NodeState.DRAINING),
            node("d", labels={"zone": "b"}),
            node("e"),
        ]
    )
    d = diagnose(c.nodes, req(), (ZONE_A,))
    assert d.fit == 0
    assert dict(d.rejected) == {
        Rejection(Rule.CONSTRAINT, constraint=ZONE_A): 4,
        Rejection(Rule.STATE, state="draining"): 1,
    }
    d = diagnose(c.nodes, req(), ())
    # counted by cause: the per-node asked / free amounts are left out
    assert (d.fit, dict(d.rejected)) == (
        2,
        {Rejection(Rule.CPU): 2, Rejection(Rule.STATE, state="draining"): 1},
    )
    assert d.nodes(Rule.CPU) == 2
    assert diagnosis_text(d) == "2/5 nodes available: 2 insufficient cpu, 1 draining"
    assert diagnosis_text(Diagnosis(3, 3, ())) == "3/3 nodes available"
    # ties are ordered by name
    lost = Rejection(Rule.STATE, state="lost")
    draining = Rejection(Rule.STATE, state="draining")
    assert diagnosis_text(Diagnosis.of(2, 0, {lost: 1, draining: 1})) == (
        "0/2 nodes available: 1 draining, 1 lost"
    )


def test_a_rejection_carries_the_dimension_asked_and_free() -> None:
    why = explain_node(alloc(node("n", cpu=500)), req(cpu=1000, memory=10**6), ())
    assert why == Rejection(Rule.CPU, asked=1000, free=500)
    assert why is not None and why.cause == Rejection(Rule.CPU)


@FAST
@given(nodes=fs.node_lists(0, 6), rc=fs.requests_and_constraints())
def test_diagnose_accounts_for_every_node(
    nodes: list[Node], rc: tuple[TaskGroup, tuple[Constraint, ...]]
) -> None:
    g, constraints = rc
    c = Cluster(nodes)
    d = diagnose(c.nodes, g.request(), constraints)
    assert d.fit + sum(n for _, n in d.rejected) == len(nodes)
    text = diagnosis_text(d)
    assert text.startswith(f"{d.fit}/{len(nodes)} nodes available")
    # the reader is the writer's inverse
    back = read_diagnosis(text)
    assert back is not None and (back.total, back.fit) == (len(nodes), d.fit)
    assert sum(n for _, n in back.causes) == len(nodes) - d.fit
    assert diagnosis_text(Diagnosis.of(back.total, back.fit, {})) == text.partition(":")[0]


# -- GPU devices -------------------------------------------------------------------
def test_allocate_takes_the_first_free_matching_device_ids() -> None:
    a = alloc(
        Node(
            id="n",
            cpu=8000,
            memory=8192,
            gpus=(
                GpuDevice(id="t4", model="T4", memory=16000),
                GpuDevice(id="a", model="A100", memory=40960),
                GpuDevice(id="b", model="A100", memory=81920),
                GpuDevice(id="c", model="A100", memory=81920),
            ),
        )
    )
    assert a.allocate(req(gpu=1, models=("A100",))) == ("a",)
    assert a.allocate(req(gpu=1, gpu_memory=80000)) == ("b",)
    assert a.allocate(req(gpu=1)) == ("t4",)
    assert not a.fits(req(gpu=2))
    assert a.allocate(req(gpu=1)) == ("c",)
    assert a.gpus_used == 4 and a.gpu_free == [False] * 4
    with pytest.raises(ValueError):
        a.allocate(req(gpu=1))


def test_hold_accounts_exact_ids_and_refuses_double_use() -> None:
    a = alloc(node("n", gpus=2))
    assert a.hold(Binding("j", "g", 0, "n", ("gpu1",), 1000, 1000))
    assert (a.cpu_used, a.mem_used, a.gpu_free, a.gpus_used) == (1000, 1000, [True, False], 1)
    before = (a.cpu_used, a.mem_used, list(a.gpu_free), a.gpus_used)
    assert not a.hold(Binding("j", "g", 1, "n", ("gpu1",), 1, 1))  # taken
    assert not a.hold(Binding("j", "g", 2, "n", ("gpu9",), 1, 1))  # unknown
    assert not a.hold(Binding("j", "g", 3, "n", ("gpu0", "gpu1"), 1, 1))  # partly taken
    assert not a.hold(Binding("j", "g", 4, "n", (), 3001, 1))  # cpu
    assert not a.hold(Binding("j", "g", 5, "n", (), 1, 3097))  # memory
    assert (a.cpu_used, a.mem_used, list(a.gpu_free), a.gpus_used) == before  # all-or-nothing
    assert a.allocate(req(gpu=1)) == ("gpu0",)


def test_hold_refuses_a_binding_that_repeats_a_device() -> None:
    """Regression: ("gpu0", "gpu0") was accepted, counting 2 GPUs held but
    marking one, so gpu1 became unusable while gpu0 was "held twice"."""
    a = alloc(node("n", gpus=2))
    assert not a.hold(Binding("j", "g", 0, "n", ("gpu0", "gpu0"), 1, 1))
    assert a.gpus_used == 0 and a.gpu_free == [True, True]


def test_binding_assignment_round_trip() -> None:
    b = Binding("j", "g", 3, "n", ("gpu0", "gpu2"), 1500, 2048, AssignmentStatus.RUNNING)
    a = b.to_assignment()
    assert a.workload_id == "j/g/3" == b.workload_id
    assert Binding.from_assignment(a) == b


# -- scorers -----------------------------------------------------------------------
@st.composite
def loaded_clusters(draw: st.DrawFn, max_nodes: int = 6) -> Cluster:
    """A cluster with random (in-capacity) allocations already on it."""
    c = Cluster(draw(fs.node_lists(0, max_nodes)))
    load = st.sampled_from([0, 0, 1, 2, 3, 4])  # quarters
    for a in c.nodes:
        a.cpu_used = a.node.cpu * draw(load) // 4
        a.mem_used = a.node.memory * draw(load) // 4
        a.gpu_free = [draw(st.integers(0, 2)) > 0 for _ in a.node.gpus]
        a.gpus_used = a.gpu_free.count(False)
    return c


@st.composite
def requests(draw: st.DrawFn) -> tuple[Request, tuple[Constraint, ...]]:
    g, constraints = draw(fs.requests_and_constraints())
    return g.request(), constraints


@st.composite
def request_lists(draw: st.DrawFn) -> list[tuple[Request, tuple[Constraint, ...]]]:
    """Requests in families: one shape with several sizes (same constraints and
    GPU model/memory, different cpu or GPU count), the shapes placers share work on."""
    out = []
    for _ in range(draw(st.integers(1, 3))):
        r, constraints = draw(requests())
        for _ in range(draw(st.integers(1, 4))):
            update = {
                "gpu": draw(st.sampled_from([r.gpu, 0, 1, 2, 4, 9])),
                "cpu": draw(st.sampled_from([r.cpu, 500, 2000])),
            }
            out.append((r.model_copy(update=update), constraints))
    return draw(st.permutations(out))


@FAST
@given(c=loaded_clusters(), rc=requests())
def test_scores_are_bounded_and_the_fast_path_agrees(
    c: Cluster, rc: tuple[Request, tuple[Constraint, ...]]
) -> None:
    r, _ = rc
    for a in c.nodes:
        assert utilisation_after(a, r) >= 0.0
        for scorer in (BinPack(), Spread()):
            assert 0.0 <= scorer.score(a, r) <= 100.0
        for algorithm in ("binpack", "spread"):
            chain = scorers_for(algorithm)
            s = combined(a, r, chain)
            assert 0.0 <= s <= 100.0
            fast = _fast_scorer(chain)
            assert fast is not None
            assert fast(a, r) == pytest.approx(s, abs=1e-9)


@FAST
@given(
    c=loaded_clusters(),
    rc=requests(),
    reserve=st.integers(0, 8),
    avoid=st.booleans(),
)
def test_the_window_scan_fits_and_scores_as_the_kernels(
    c: Cluster,
    rc: tuple[Request, tuple[Constraint, ...]],
    reserve: int,
    avoid: bool,
) -> None:
    """best_in_window writes the fit and score kernels out (the hot loop of a
    pass): its window and its choice must be exactly theirs, to the last bit."""
    r, _ = rc
    for a in c.nodes:
        if a.node.gpus:  # some GPU reservation, which only work without GPUs sees
            a.res_cpu = a.node.cpu * reserve // 8
            a.res_mem = a.node.memory * reserve // 8
    avoid_id = c.nodes[0].id if avoid and c.nodes else None
    cls = EquivalenceClass(list(c.nodes))
    pos, best, score, _ = best_in_window(cls, r, avoid_id, 0)
    fitting = [i for i, a in enumerate(c.nodes) if fits(a, r)]
    assert cls.window == fitting
    want_pos, want = -1, -1e18
    for i in fitting:
        s = default_score(c.nodes[i], r, False)
        if c.nodes[i].id == avoid_id:
            s -= AVOID_PENALTY
        if s > want:
            want_pos, want = i, s
    assert (pos, score) == (want_pos, want)
    assert best is (c.nodes[pos] if pos >= 0 else None)


def test_unknown_algorithm_is_rejected() -> None:
    with pytest.raises(ValueError, match="binpack, spread"):
        scorers_for("worst-fit")


def test_binpack_prefers_the_fuller_node_and_spread_the_emptier() -> None:
    for algorithm, expected in (("binpack", "full"), ("spread", "empty")):
        c = Cluster([node("empty"), node("full")])
        c.by_id["full"].cpu_used, c.by_id["full"].mem_used = 2000, 2048
        choice = Placer(c, algorithm=algorithm, candidates=0).place(req())
        assert choice is not None and choice.node.id == expected, algorithm


def test_non_gpu_work_keeps_off_gpu_nodes() -> None:
    """The GPU reservation keeps a GPU node's cpu for GPU work, whatever the score."""
    c = Cluster([node("cpu-only"), node("gpu", gpus=4)], gpu_reserve=DEFAULT_GPU_RESERVE)
    choice = Placer(c, candidates=0).place(req())
    assert choice is not None and choice.node.id == "cpu-only"


def test_spread_rotates_over_equal_nodes() -> None:
    c = Cluster([node(f"n{i}") for i in range(4)])
    p = Placer(c, algorithm="spread", candidates=2)
    chosen = []
    for _ in range(4):
        choice = p.place(req())
        assert choice is not None
        chosen.append(choice.node.id)
    assert sorted(chosen) == ["n0", "n1", "n2", "n3"]


# -- the placer --------------------------------------------------------------------
def brute_fits(a: NodeAlloc, r: Request, constraints: tuple[Constraint, ...]) -> bool:
    """Independent of NodeAlloc.fits and the filters."""
    n = a.node
    if n.state is not NodeState.READY or not all(c.matches(n.labels) for c in constraints):
        return False
    if n.cpu - a.cpu_used < r.cpu or n.memory - a.mem_used < r.memory:
        return False
    free = [
        d
        for i, d in enumerate(n.gpus)
        if a.gpu_free[i]
        and (not r.gpu_models or d.model in r.gpu_models)
        and d.memory >= r.gpu_memory
    ]
    return len(free) >= r.gpu


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    c=loaded_clusters(),
    reqs=request_lists(),
    candidates=st.sampled_from([1, 2]),
    algorithm=st.sampled_from(["binpack", "spread"]),
    seed=st.integers(0, 5),
    repeat=st.integers(1, 4),
)
def test_placer_is_complete_with_a_small_window(
    c: Cluster,
    reqs: list[tuple[Request, tuple[Constraint, ...]]],
    candidates: int,
    algorithm: str,
    seed: int,
    repeat: int,
) -> None:
    p = Placer(c, algorithm=algorithm, candidates=candidates, seed=seed)
    for r, constraints in [x for x in reqs for _ in range(repeat)]:
        fitting = {a.id for a in c.nodes if brute_fits(a, r, constraints)}
        choice = p.place(r, constraints)
        if choice is None:
            assert not fitting, f"{r} left unplaced though {sorted(fitting)} fit"
            why = p.why_not(r, constraints)
            assert diagnosis_text(why).startswith(f"0/{len(c)} nodes available")
            # gathered by the scan, yet every node is accounted for exactly once
            assert why.fit == 0 and sum(n for _, n in why.rejected) == len(c)
            continue
        assert choice.node.id in fitting
        a = choice.node
        assert a.cpu_used <= a.node.cpu and a.mem_used <= a.node.memory
        assert len(choice.gpu_ids) == r.gpu
        assert a.gpus_used == a.gpu_free.count(False) <= len(a.node.gpus)
        devices = {d.id: d for d in a.node.gpus}
        for gid in choice.gpu_ids:
            assert devices[gid].memory >= r.gpu_memory
            assert not r.gpu_models or devices[gid].model in r.gpu_models


def test_placer_regression_gpu_count_shares_no_eligibility_cache() -> None:
    """Regression: the per-pass eligibility cache keyed on ``gpu > 0``, so after a
    4-GPU request found no 2-GPU node, a 1-GPU request reused that empty list."""
    c = Cluster([node("n", gpus=2)])
    p = Placer(c)
    assert p.place(req(gpu=4)) is None
    choice = p.place(req(gpu=1))
    assert choice is not None and choice.gpu_ids == ("gpu0",)


@FAST
@given(c=loaded_clusters(), rc=requests(), algorithm=st.sampled_from(["binpack", "spread"]))
def test_an_unlimited_window_takes_the_best_score(
    c: Cluster, rc: tuple[Request, tuple[Constraint, ...]], algorithm: str
) -> None:
    r, constraints = rc
    chain = scorers_for(algorithm)
    scores = {a.id: combined(a, r, chain) for a in c.nodes if brute_fits(a, r, constraints)}
    choice = Placer(c, algorithm=algorithm, candidates=0).place(r, constraints)
    if not scores:
        assert choice is None
        return
    assert choice is not None
    assert scores[choice.node.id] == pytest.approx(max(scores.values()), abs=1e-9)


@st.composite
def cluster_specs(
    draw: st.DrawFn,
) -> tuple[list[Node], list[tuple[Request, tuple[Constraint, ...]]]]:
    return draw(fs.node_lists(0, 6)), draw(st.lists(requests(), min_size=1, max_size=10))


@FAST
@given(spec=cluster_specs(), seed=st.integers(0, 100), candidates=st.sampled_from([0, 1, 2, 8]))
def test_the_placer_is_deterministic(
    spec: tuple[list[Node], list[tuple[Request, tuple[Constraint, ...]]]],
    seed: int,
    candidates: int,
) -> None:
    nodes, reqs = spec

    def run(node_order: list[Node]) -> list[tuple[str, tuple[str, ...]] | None]:
        p = Placer(Cluster(node_order), candidates=candidates, seed=seed)
        out: list[tuple[str, tuple[str, ...]] | None] = []
        for r, constraints in reqs * 2:
            choice = p.place(r, constraints)
            out.append(None if choice is None else (choice.node.id, choice.gpu_ids))
        return out

    assert run(nodes) == run(list(reversed(nodes)))


def test_avoid_is_not_chosen_when_another_node_fits_in_the_window() -> None:
    # "a" scores far higher (fuller, and "b" has GPUs a CPU replica should keep off)
    c = Cluster([node("a"), node("b", gpus=1)])
    c.by_id["a"].cpu_used, c.by_id["a"].mem_used = 3000, 3000
    choice = Placer(c, candidates=0).place(req(500, 500), avoid="a")
    assert choice is not None and choice.node.id == "b"


def test_avoid_is_chosen_when_nothing_else_fits() -> None:
    c = Cluster([node("a"), node("b", cpu=100)])
    choice = Placer(c, candidates=0).place(req(), avoid="a")
    assert choice is not None and choice.node.id == "a"


@FAST
@given(c=loaded_clusters(), rc=requests(), data=st.data())
def test_avoid_loses_to_any_other_feasible_node(
    c: Cluster, rc: tuple[Request, tuple[Constraint, ...]], data: st.DataObject
) -> None:
    r, constraints = rc
    fitting = sorted(a.id for a in c.nodes if brute_fits(a, r, constraints))
    if not fitting:
        return
    avoid = data.draw(st.sampled_from(fitting))
    choice = Placer(c, candidates=0).place(r, constraints, avoid=avoid)
    assert choice is not None
    assert (choice.node.id != avoid) == (len(fitting) > 1)
