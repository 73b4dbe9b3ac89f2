"""GPU placement: the reservation that keeps GPU nodes for GPU work, taints and
tolerations, shared (fractional) GPUs with exact per-device bookkeeping, and the
GPU-sharing policies (fgd and the paper's baselines) through the bounded selector.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from forge.core.models import (
    GPU_MILLI,
    GpuDevice,
    GpuRequest,
    Job,
    Node,
    Request,
    Resources,
    ScalingPolicy,
    Taint,
    Task,
    TaskGroup,
    Toleration,
)
from forge.core.placement import (
    Binding,
    Cluster,
    Placer,
    combined,
    diagnosis_text,
    explain_node,
    rejection_text,
    scorers_for,
)
from forge.core.placement.filters import diagnose
from forge.core.placement.scorers import fast_scorer as _fast_scorer
from forge.core.reconcile import Plan, ReconcileOptions, reconcile
from tests.builders import job

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
OPTIONS = ReconcileOptions()
GIB = 1024


def gpu_node(
    nid: str,
    cpu: int = 16_000,
    memory: int = 64 * GIB,
    gpus: int = 2,
    model: str = "H100",
    taints: tuple[Taint, ...] = (),
) -> Node:
    return Node(
        id=nid,
        cpu=cpu,
        memory=memory,
        gpus=tuple(GpuDevice(id=f"gpu{i}", model=model, memory=81_920) for i in range(gpus)),
        taints=taints,
    )


def group(
    cpu: int,
    memory: int,
    *,
    gpus: int = 0,
    milli: int = 0,
    desired: int = 1,
    tolerations: tuple[Toleration, ...] = (),
) -> TaskGroup:
    return TaskGroup(
        name="main",
        tasks=(
            Task(
                name="main",
                resources=Resources(
                    cpu=cpu, memory=memory, gpu=GpuRequest(count=gpus, milli=milli)
                ),
            ),
        ),
        scaling=ScalingPolicy(min=0, max=max(desired, 1), desired=desired),
        tolerations=tolerations,
    )


def one_pass(
    nodes: list[Node],
    jobs: list[Job],
    options: ReconcileOptions,
    bindings: dict[str, Binding] | None = None,
    capacity_changed: bool = False,
) -> dict[str, Binding]:
    plan = reconcile(
        jobs={j.id: j for j in jobs},
        nodes={n.id: n for n in nodes},
        bindings=bindings or {},
        pending={},
        failures={},
        capacity_changed=capacity_changed,
        now=0.0,
        options=options,
    )
    return plan.bindings


# -- the scenario ------------------------------------------------------------
def scenario() -> tuple[list[Node], list[Job], dict[str, Binding]]:
    """A full cluster: one CPU node held by earlier work; a 2-GPU job (12 cores,
    48 GiB: more than half of the node it will get) and a higher-priority CPU-only
    job with 40 replicas of 500m / 2 GiB both pending."""
    full = Node(id="cpu-a", cpu=8_000, memory=32 * GIB)
    filler = job("filler", group(8_000, 32 * GIB), priority=90)
    train = job("train", group(12_000, 48 * GIB, gpus=2), priority=40)
    web = job("web", group(500, 2 * GIB, desired=40), priority=80)
    first = one_pass([full], [filler, train, web], OPTIONS)
    assert "train/main/0" not in first
    assert not any(w.startswith("web/") for w in first)  # the cluster is full
    return [full], [filler, train, web], first


def test_a_gpu_node_added_for_a_pending_gpu_job_goes_to_that_job() -> None:
    nodes, jobs, bound = scenario()
    h100 = gpu_node("h100-new")  # 16 cores, 64 GiB, 2 GPUs
    after = one_pass([*nodes, h100], jobs, OPTIONS, bound, capacity_changed=True)
    train = after["train/main/0"]
    assert (train.node, train.gpu_ids) == ("h100-new", ("gpu0", "gpu1"))
    # the next pass gives CPU work what the GPU job left: 4 cores, 8 replicas
    again = one_pass([*nodes, h100], jobs, OPTIONS, after)
    web = [b for w, b in again.items() if w.startswith("web/")]
    assert len(web) == 8 and all(b.node == "h100-new" for b in web)
    assert again["train/main/0"] == train


def test_the_reservation_explains_itself_and_agrees_with_fits() -> None:
    c = Cluster([gpu_node("g")], gpu_reserve=1000)
    a = c.nodes[0]
    cpu_only = Request(cpu=500, memory=GIB)
    assert not a.fits(cpu_only)
    why = explain_node(a, cpu_only, ())
    assert why is not None and rejection_text(why) == (
        "cpu reserved for free gpus (16000m free, 16000m reserved < 500m asked)"
    )
    d = diagnose(c.nodes, cpu_only, ())
    assert diagnosis_text(d) == "0/1 nodes available: 1 cpu reserved for free gpus"
    # one GPU taken with 4 of its 8 cores: the other GPU still reserves 8, 4 are spare
    a.allocate(Request(cpu=4_000, memory=8 * GIB, gpu=1))
    assert (a.res_cpu, a.res_mem) == (8_000, 32 * GIB)
    assert a.fits(Request(cpu=4_000, memory=GIB))
    assert not a.fits(Request(cpu=4_001, memory=GIB))
    assert explain_node(a, Request(cpu=4_000, memory=GIB), ()) is None


def test_half_a_reservation_keeps_half_of_each_share() -> None:
    a = Cluster([gpu_node("g")], gpu_reserve=500).nodes[0]
    assert (a.res_cpu, a.res_mem) == (8_000, 32 * GIB)
    assert a.fits(Request(cpu=8_000, memory=GIB))
    assert not a.fits(Request(cpu=8_001, memory=GIB))


def test_the_reservation_is_lifted_when_no_gpu_work_waits() -> None:
    """A GPU node with no GPU work anywhere takes CPU work: a reservation for
    nobody would leave replicas pending that fit."""
    bound = one_pass([gpu_node("g")], [job("web", group(1_000, GIB, desired=16))], OPTIONS)
    assert len(bound) == 16


def test_bindings_over_the_reservation_are_kept() -> None:
    """The reservation steers new placements; it never evicts."""
    g = gpu_node("g")
    web = job("web", group(1_000, GIB, desired=16))
    held = one_pass([g], [web], OPTIONS)
    assert len(held) == 16
    train = job("train", group(1_000, GIB, gpus=2), priority=10)
    after = one_pass([g], [web, train], OPTIONS, held)
    assert all(w in after for w in held)


# -- taints ----------------------------------------------------------------------------
GPU_POOL = Taint(key="pool", value="gpu")


def test_a_tainted_node_takes_only_tolerating_groups() -> None:
    pool = gpu_node("pool", taints=(GPU_POOL,))
    plain = Node(id="plain", cpu=4_000, memory=8 * GIB)
    jobs = [
        job("web", group(1_000, GIB, desired=6)),
        job("train", group(2_000, GIB, gpus=1, tolerations=(Toleration(key="pool", value="gpu"),))),
    ]
    bound = one_pass([pool, plain], jobs, OPTIONS)
    assert {b.node for w, b in bound.items() if w.startswith("web/")} == {"plain"}
    assert bound["train/main/0"].node == "pool"
    a = Cluster([pool]).nodes[0]
    why = explain_node(a, Request(cpu=1, memory=1), ())
    assert why is not None and rejection_text(why) == "untolerated taint (pool=gpu:NoSchedule)"


def test_toleration_operators() -> None:
    assert Toleration(operator="Exists").tolerates(GPU_POOL)
    assert Toleration(key="pool", operator="Exists").tolerates(GPU_POOL)
    assert not Toleration(key="pool", value="cpu").tolerates(GPU_POOL)


# -- properties --------------------------------------------------------------------------
@st.composite
def gpu_clusters(draw: st.DrawFn) -> list[Node]:
    """2-6 nodes, most with 1-8 GPUs, some tainted."""
    out = []
    for i in range(draw(st.integers(2, 6))):
        ngpu = draw(st.sampled_from([0, 1, 2, 4, 8]))
        out.append(
            Node(
                id=f"n{i}",
                cpu=draw(st.integers(1, 16)) * 1000,
                memory=draw(st.integers(1, 16)) * GIB,
                gpus=tuple(
                    GpuDevice(id=f"gpu{d}", model=draw(st.sampled_from(["A100", "T4"])), memory=1)
                    for d in range(ngpu)
                ),
                taints=(GPU_POOL,) if draw(st.integers(0, 5)) == 0 else (),
            )
        )
    return out


@st.composite
def gpu_requests(draw: st.DrawFn) -> Request:
    """Whole-device, shared and GPU-less requests of a few sizes (shapes repeat, so
    equivalence classes are shared between calls)."""
    kind = draw(st.sampled_from(["cpu", "cpu", "whole", "shared"]))
    cpu = draw(st.sampled_from([500, 1000, 2000, 4000]))
    memory = draw(st.sampled_from([512, GIB, 4 * GIB]))
    tolerations = (Toleration(operator="Exists"),) if draw(st.booleans()) else ()
    models = tuple(draw(st.sampled_from([(), (), ("T4",)])))
    if kind == "whole":
        return Request(
            cpu=cpu,
            memory=memory,
            gpu=draw(st.sampled_from([1, 2, 4])),
            gpu_models=models,
            tolerations=tolerations,
        )
    if kind == "shared":
        return Request(
            cpu=cpu,
            memory=memory,
            gpu=1,
            gpu_milli=draw(st.sampled_from([100, 300, 500, 700])),
            gpu_models=models,
            tolerations=tolerations,
        )
    return Request(cpu=cpu, memory=memory, tolerations=tolerations)


def brute_fits(
    n: Node, cpu_used: int, mem_used: int, left: list[int], reserve: int, r: Request
) -> bool:
    """Independent of NodeAlloc: capacity, the reservation, taints, models, shares."""
    if any(not any(t.tolerates(x) for t in r.tolerations) for x in n.taints):
        return False
    res_cpu = res_mem = 0
    if not r.gpu and n.gpus and reserve:
        scale = len(n.gpus) * GPU_MILLI * 1000
        res_cpu = n.cpu * sum(left) * reserve // scale
        res_mem = n.memory * sum(left) * reserve // scale
    if n.cpu - cpu_used - res_cpu < r.cpu or n.memory - mem_used - res_mem < r.memory:
        return False
    ok = [i for i, d in enumerate(n.gpus) if not r.gpu_models or d.model in r.gpu_models]
    if r.gpu_milli:
        return any(left[i] >= r.gpu_milli for i in ok)
    return sum(1 for i in ok if left[i] == GPU_MILLI) >= r.gpu


@settings(
    max_examples=250,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    nodes=gpu_clusters(),
    reqs=st.lists(gpu_requests(), min_size=1, max_size=40),
    reserve=st.sampled_from([0, 500, 1000]),
    candidates=st.sampled_from([1, 2, 0]),
    algorithm=st.sampled_from(["binpack", "spread", "fgd", "fgd2", "best-fit", "gpu-packing"]),
    seed=st.integers(0, 3),
)
def test_placement_is_exact_per_device_and_complete(
    nodes: list[Node],
    reqs: list[Request],
    reserve: int,
    candidates: int,
    algorithm: str,
    seed: int,
) -> None:
    """No device above 1000 milli, whole devices for multi-GPU requests, a share
    names its one device, and a request is refused only when no node can take it
    (the reservation included: GPU placements that free reservation re-admit nodes)."""
    c = Cluster(nodes, gpu_reserve=reserve)
    workload = [(r, 1.0) for r in reqs]
    p = Placer(c, algorithm=algorithm, candidates=candidates, seed=seed, workload=workload)
    cpu = {n.id: 0 for n in nodes}
    mem = {n.id: 0 for n in nodes}
    left = {n.id: [GPU_MILLI] * len(n.gpus) for n in nodes}
    by_id = {n.id: n for n in nodes}
    for r in reqs:
        fitting = {
            n.id for n in nodes if brute_fits(n, cpu[n.id], mem[n.id], left[n.id], reserve, r)
        }
        choice = p.place(r)
        if choice is None:
            assert not fitting, f"{r} refused though {sorted(fitting)} fit"
            continue
        nid = choice.node.id
        assert nid in fitting
        n = by_id[nid]
        cpu[nid] += r.cpu
        mem[nid] += r.memory
        index = {d.id: i for i, d in enumerate(n.gpus)}
        if r.gpu_milli:
            assert len(choice.gpu_ids) == 1
            left[nid][index[choice.gpu_ids[0]]] -= r.gpu_milli
        else:
            assert len(choice.gpu_ids) == len(set(choice.gpu_ids)) == r.gpu
            for gid in choice.gpu_ids:
                assert left[nid][index[gid]] == GPU_MILLI  # a whole, wholly free device
                left[nid][index[gid]] = 0
        a = choice.node
        assert a.gpu_left == left[nid]
        assert all(0 <= v <= GPU_MILLI for v in a.gpu_left)
        assert a.milli_free == sum(a.gpu_left)
        assert a.gpus_used == sum(1 for v in a.gpu_left if v < GPU_MILLI)
        assert a.cpu_used <= n.cpu and a.mem_used <= n.memory


@FAST
@given(
    nodes=gpu_clusters(),
    reqs=st.lists(gpu_requests(), min_size=1, max_size=30),
    algorithm=st.sampled_from(
        ["binpack", "fgd", "fgd2", "random", "gpu-clustering", "dot-product"]
    ),
    seed=st.integers(0, 3),
)
def test_placement_is_deterministic(
    nodes: list[Node], reqs: list[Request], algorithm: str, seed: int
) -> None:
    def run() -> list[tuple[str, tuple[str, ...]] | None]:
        p = Placer(
            Cluster(nodes, gpu_reserve=1000),
            algorithm=algorithm,
            seed=seed,
            workload=[(r, 1.0) for r in reqs],
        )
        out: list[tuple[str, tuple[str, ...]] | None] = []
        for r in reqs:
            ch = p.place(r)
            out.append(None if ch is None else (ch.node.id, ch.gpu_ids))
        return out

    assert run() == run()


@FAST
@given(nodes=gpu_clusters(), reqs=st.lists(gpu_requests(), min_size=2, max_size=12))
def test_scores_are_bounded_and_the_v2_fast_path_agrees(
    nodes: list[Node], reqs: list[Request]
) -> None:
    c = Cluster(nodes, gpu_reserve=1000)
    for r in reqs[:-1]:  # load the cluster a little
        for a in c.nodes:
            if a.fits(r):
                a.allocate(r)
                break
    r = reqs[-1]
    for algorithm in (
        "binpack",
        "spread",
        "fgd",
        "fgd2",
        "best-fit",
        "dot-product",
        "gpu-packing",
        "gpu-clustering",
        "random",
    ):
        chain = scorers_for(algorithm, workload=[(x, 1.0) for x in reqs])
        for a in c.nodes:
            assert 0.0 <= combined(a, r, chain) <= 100.0
        fast = _fast_scorer(chain)
        if algorithm in ("binpack", "spread"):
            assert fast is not None
            for a in c.nodes:
                assert abs(fast(a, r) - combined(a, r, chain)) < 1e-9


# -- shared GPUs -----------------------------------------------------------------------
def share(milli: int, cpu: int = 1000) -> Request:
    return Request(cpu=cpu, memory=GIB, gpu=1, gpu_milli=milli)


def test_shares_fill_one_device_before_the_next_and_never_exceed_it() -> None:
    a = Cluster([gpu_node("g", gpus=2)]).nodes[0]
    got = [a.allocate(share(300)) for _ in range(3)]
    assert got == [("gpu0",)] * 3
    assert a.gpu_left == [100, 1000]
    assert a.allocate(share(300)) == ("gpu1",)  # 100 free on gpu0 is too little
    assert a.allocate(share(100)) == ("gpu0",)  # the tightest device that has room
    assert a.gpu_left == [0, 700] and a.milli_free == 700 and a.gpus_used == 2
    assert not a.fits(Request(cpu=1, memory=1, gpu=1))  # no whole device is free


def test_explain_shows_each_devices_free_share() -> None:
    a = Cluster([gpu_node("g", gpus=2)]).nodes[0]
    a.allocate(share(700))
    a.allocate(share(900))
    why = explain_node(a, share(500), ())
    assert why is not None and rejection_text(why) == (
        "insufficient gpu share (gpu0: 300 free < 500 asked, gpu1: 100 free < 500 asked)"
    )
    assert why.devices == (("gpu0", 300), ("gpu1", 100)) and why.asked == 500
    d = diagnose([a], share(500), ())
    assert diagnosis_text(d) == "0/1 nodes available: 1 insufficient gpu share"


def test_a_shared_binding_is_held_exactly_and_survives_a_round_trip() -> None:
    b = Binding("j", "g", 0, "g", ("gpu1",), 1000, GIB, gpu_milli=400)
    assert Binding.from_assignment(b.to_assignment()) == b
    a = Cluster([gpu_node("g", gpus=2)]).nodes[0]
    assert a.hold(b) and a.hold(b)  # two 400 shares fit one device
    assert a.gpu_left == [1000, 200]
    assert not a.hold(b)  # a third does not
    assert not a.hold(Binding("j", "g", 1, "g", ("gpu1",), 1, 1))  # nor a whole device


def test_a_group_share_is_one_device_or_rounded_to_whole_devices() -> None:
    def g(*specs: tuple[int, int]) -> Request:
        tasks = tuple(
            Task(
                name=f"t{i}", resources=Resources(cpu=1, memory=1, gpu=GpuRequest(count=c, milli=m))
            )
            for i, (c, m) in enumerate(specs)
        )
        return TaskGroup(name="x", tasks=tasks).request()

    assert (g((1, 300), (1, 400)).gpu, g((1, 300), (1, 400)).gpu_milli) == (1, 700)
    assert (g((1, 600), (1, 600)).gpu, g((1, 600), (1, 600)).gpu_milli) == (2, 0)
    assert (g((2, 0), (1, 300)).gpu, g((2, 0), (1, 300)).gpu_milli) == (3, 0)
    assert (
        g(
            (1, 1000),
        ).gpu,
        g(
            (1, 1000),
        ).gpu_milli,
    ) == (1, 0)


def test_a_share_must_be_of_one_device() -> None:
    import pydantic
    import pytest

    with pytest.raises(pydantic.ValidationError, match="count must be 1"):
        GpuRequest(count=2, milli=500)


def test_shared_jobs_are_placed_held_and_stable_across_passes() -> None:
    nodes = [gpu_node("g1", gpus=2), gpu_node("g2", gpus=1)]
    jobs = [
        job("infer", group(500, GIB, gpus=1, milli=300, desired=6)),
        job("train", group(2000, GIB, gpus=1)),
    ]
    first = one_pass(nodes, jobs, OPTIONS)
    assert len(first) == 7  # six shares pack two devices: one stays whole for train
    held: dict[tuple[str, str], int] = {}
    for b in first.values():
        if b.gpu_milli:
            assert b.gpu_milli == 300 and len(b.gpu_ids) == 1
            key = (b.node, b.gpu_ids[0])
            held[key] = held.get(key, 0) + 300
        else:
            held[(b.node, b.gpu_ids[0])] = held.get((b.node, b.gpu_ids[0]), 0) + GPU_MILLI
    assert all(v <= GPU_MILLI for v in held.values())
    second = one_pass(nodes, jobs, OPTIONS, first)
    assert second == first


# -- one reconcile pass, version 2 ---------------------------------------------------------
@st.composite
def gpu_jobs(draw: st.DrawFn) -> list[Job]:
    out = []
    for i in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["cpu", "cpu", "whole", "shared"]))
        gpus = {"cpu": 0, "whole": draw(st.sampled_from([1, 2, 4])), "shared": 1}[kind]
        milli = draw(st.sampled_from([200, 500, 800])) if kind == "shared" else 0
        g = group(
            draw(st.sampled_from([500, 1000, 3000])),
            draw(st.sampled_from([512, GIB, 4 * GIB])),
            gpus=gpus,
            milli=milli,
            desired=draw(st.integers(1, 6)),
            tolerations=(Toleration(operator="Exists"),) if draw(st.booleans()) else (),
        )
        out.append(job(f"j{i}", g, priority=draw(st.sampled_from([20, 50, 80]))))
    return out


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(nodes=gpu_clusters(), jobs=gpu_jobs(), reserve=st.sampled_from([None, 500]))
def test_a_v2_pass_is_exact_and_work_conserving(
    nodes: list[Node], jobs: list[Job], reserve: int | None
) -> None:
    """After one pass: no node over capacity, no device above 1000 milli, whole
    devices held once, and a replica left pending only if no node can take it now
    (under the reservation while GPU work is still waiting, without it otherwise)."""
    opts = ReconcileOptions(gpu_reserve=reserve)
    plan = reconcile(
        jobs={j.id: j for j in jobs},
        nodes={n.id: n for n in nodes},
        bindings={},
        pending={},
        failures={},
        now=0.0,
        options=opts,
    )
    by_id = {n.id: n for n in nodes}
    cpu = {n.id: 0 for n in nodes}
    mem = {n.id: 0 for n in nodes}
    left = {n.id: [GPU_MILLI] * len(n.gpus) for n in nodes}
    for b in plan.bindings.values():
        n = by_id[b.node]
        index = {d.id: i for i, d in enumerate(n.gpus)}
        cpu[b.node] += b.cpu
        mem[b.node] += b.memory
        if b.gpu_milli:
            assert len(b.gpu_ids) == 1
            left[b.node][index[b.gpu_ids[0]]] -= b.gpu_milli
        else:
            for gid in b.gpu_ids:
                assert left[b.node][index[gid]] == GPU_MILLI, f"{gid} on {b.node} held twice"
                left[b.node][index[gid]] = 0
    for n in nodes:
        assert cpu[n.id] <= n.cpu and mem[n.id] <= n.memory
        assert all(0 <= v <= GPU_MILLI for v in left[n.id])
    requests = {f"{j.id}/main/{o}": j.groups[0].request() for j in jobs for o in range(8)}
    empty = {n.id: [GPU_MILLI] * len(n.gpus) for n in nodes}
    gpu_waiting = any(
        requests[w].gpu and any(brute_fits(n, 0, 0, empty[n.id], 0, requests[w]) for n in nodes)
        for w in plan.pending
    )
    applied = opts.effective_gpu_reserve if gpu_waiting else 0
    for wid in plan.pending:
        r = requests[wid]
        fitting = [
            n.id for n in nodes if brute_fits(n, cpu[n.id], mem[n.id], left[n.id], applied, r)
        ]
        assert not fitting, f"{wid} ({r}) pending though {fitting} fit"
    again = reconcile(
        jobs={j.id: j for j in jobs},
        nodes={n.id: n for n in nodes},
        bindings={},
        pending={},
        failures={},
        now=0.0,
        options=opts,
    )
    assert again.bindings == plan.bindings  # deterministic


# -- fragmentation -------------------------------------------------------------------------
def test_fragmentation_follows_the_papers_definition() -> None:
    from forge.core.placement import TypicalTask, fragmentation

    share = TypicalTask(cpu=1000, milli=500, count=1, models=frozenset(), p=0.5)
    whole = TypicalTask(cpu=1000, milli=GPU_MILLI, count=1, models=frozenset(), p=0.3)
    cpu_only = TypicalTask(cpu=1000, milli=0, count=0, models=frozenset(), p=0.2)
    devices = [("A100", 1000), ("A100", 300)]
    # the 300 left is too little for both GPU tasks; all 1,300 is lost to cpu-only work
    assert (
        fragmentation(8000, devices, (share, whole, cpu_only)) == 0.5 * 300 + 0.3 * 300 + 0.2 * 1300
    )
    # too little cpu for the GPU tasks: all free GPU is a fragment for them
    assert fragmentation(500, devices, (share, whole)) == 0.8 * 1300
    # a model the task excludes: all of it
    t4_only = TypicalTask(cpu=1, milli=500, count=1, models=frozenset({"T4"}), p=1.0)
    assert fragmentation(8000, devices, (t4_only,)) == 1300


def test_typical_tasks_cover_95_percent_by_count() -> None:
    from forge.core.placement import typical_tasks

    big = Request(cpu=1000, memory=1, gpu=1)
    small = Request(cpu=500, memory=1, gpu=1, gpu_milli=300)
    rare = Request(cpu=8000, memory=1)
    tasks = typical_tasks([(big, 60.0), (small, 37.0), (rare, 3.0)])
    assert [(t.cpu, t.milli, round(t.p, 3)) for t in tasks] == [
        (1000, 1000, 0.619),
        (500, 300, 0.381),
    ]


def test_fgd_keeps_a_whole_node_for_the_whole_gpu_work_it_expects() -> None:
    """A share goes to the node already in use, not to an untouched node the expected
    4-GPU work needs whole; on it, to the device that leaves no sliver too small for
    the expected shares (gpu1: 700 left, rather than gpu0: 200 left)."""
    nodes = [gpu_node("a", gpus=4), gpu_node("b", gpus=4)]
    c = Cluster(nodes)
    c.by_id["b"].allocate(share(500))
    workload = [(Request(cpu=1000, memory=GIB, gpu=4), 1.0), (share(300), 1.0)]
    choice = Placer(c, algorithm="fgd", candidates=0, workload=workload).place(share(300))
    assert choice is not None and choice.node.id == "b" and choice.gpu_ids == ("gpu1",)
    assert c.by_id["b"].gpu_left == [500, 700, 1000, 1000]


def test_fgd2_counts_the_gpus_a_node_has_no_memory_left_for() -> None:
    """fgd2's F: a node without the memory a typical task asks gives it nothing, so
    a 1-GPU replica goes where the other GPU keeps memory for the expected work
    (fgd, which looks at cpu only, sees the two nodes alike)."""
    from forge.core.placement import TypicalTask, fragmentation

    task = TypicalTask(cpu=1000, milli=GPU_MILLI, count=1, models=frozenset(), p=1.0, memory=32)
    devices = [("H100", GPU_MILLI)]
    assert fragmentation(8000, devices, (task,), mem_free=32) == 0
    assert fragmentation(8000, devices, (task,), mem_free=31) == GPU_MILLI
    one = Request(cpu=1000, memory=20 * GIB, gpu=1)
    workload = [(Request(cpu=1000, memory=32 * GIB, gpu=1), 1.0)]
    for seed in range(4):
        nodes = [gpu_node("tight", memory=40 * GIB), gpu_node("roomy", memory=64 * GIB)]
        c = Cluster(nodes)
        p = Placer(c, algorithm="fgd2", candidates=0, seed=seed, workload=workload)
        choice = p.place(one)
        assert choice is not None and choice.node.id == "roomy"


def test_fgd2_scores_a_wider_window_for_multi_gpu_requests_only() -> None:
    """A request for two or more whole GPUs scores WIDE times the window; a share,
    one GPU or no GPU the selector's own; fgd never widens."""
    from forge.core.placement.fragmentation import WIDE, Fgd

    fgd, fgd2 = Fgd(), Fgd(memory=True)
    two = Request(cpu=1000, memory=GIB, gpu=2)
    for req in (two, Request(cpu=1000, memory=GIB, gpu=1), share(300), Request(cpu=1, memory=1)):
        assert fgd.window(req, 16) == 16
        assert fgd2.window(req, 16) == (16 * WIDE if req is two else 16)
    # with a window of one node, the 2-GPU replica still finds the 2-GPU node that
    # fits it whole instead of breaking an 8-GPU node
    for seed in range(6):
        nodes = [gpu_node(f"big{i}", gpus=8) for i in range(4)] + [gpu_node("pair", gpus=2)]
        workload = [(Request(cpu=1000, memory=GIB, gpu=8), 1.0), (two, 1.0)]
        p = Placer(Cluster(nodes), algorithm="fgd2", candidates=1, seed=seed, workload=workload)
        choice = p.place(two)
        assert choice is not None and choice.node.id == "pair"


def test_a_gpu_job_no_node_could_ever_take_keeps_no_reservation() -> None:
    """A 16-GPU job on 2-GPU nodes waits for good; CPU work still gets the nodes."""
    jobs = [
        job("huge", group(1_000, GIB, gpus=16), priority=90),
        job("web", group(1_000, GIB, desired=16), priority=80),
    ]
    bound = one_pass([gpu_node("g")], jobs, OPTIONS)
    assert "huge/main/0" not in bound
    assert sum(1 for w in bound if w.startswith("web/")) == 16


# -- held back, then kept from the retry by the placement limit ------------------------
def _held_back_pass(**options: object) -> Plan:
    """One GPU node whose GPU work is wanted by nobody (a GPU group at 0 replicas in
    the same job, so the reservation holds until the job has had its turn): both
    cpu replicas are turned away, the reservation lifts, and the retry places one
    before the limit of 1 stops it."""
    cpu_work = group(500, 512, desired=2).model_copy(update={"name": "cpu"})
    gpu_work = group(500, 512, gpus=1, desired=0).model_copy(update={"name": "gpu"})
    return reconcile(
        jobs={"j": job("j", cpu_work, gpu_work)},
        nodes={"g": gpu_node("g", cpu=1_000, memory=1_024, gpus=1)},
        bindings={},
        pending={},
        failures={},
        now=0.0,
        options=ReconcileOptions(candidates=0, max_placements=1, **options),
    )


def test_held_back_replicas_the_limit_kept_from_their_retry_are_deferred() -> None:
    """The node can take the second replica once the reservation lifted: it is
    deferred to the next pass (which runs at once), not given the backoff of a
    refusal that no longer holds (invariant 4), and it does not preempt."""
    plan = _held_back_pass()
    assert [b.workload_id for b in plan.placed] == ["j/cpu/0"]
    assert plan.pending["j/cpu/1"].kind == "deferred"
    assert plan.deferred == 1 and plan.next_wake == 0.0 and not plan.preemptions
    budgeted = _held_back_pass(max_work=10_000)  # counted, not listed, as a budget defers
    assert "j/cpu/1" not in budgeted.pending and budgeted.deferred == 1
    assert budgeted.next_wake == 0.0


def test_runs_recorded_before_held_back_deferred_keep_the_backoff() -> None:
    plan = _held_back_pass(held_back_deferred=False)
    assert plan.pending["j/cpu/1"].kind == "backoff"
    assert plan.deferred == 0
