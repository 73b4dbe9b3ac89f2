"""Placement version 2 keeps the carry: a pass handed the previous pass's carry
places exactly what a pass over every binding places, though version 2 changes
the GPU reservation within a pass (lifts it, re-admits nodes)."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from forge.core.models import (
    GpuDevice,
    GpuRequest,
    Job,
    Node,
    Resources,
    ScalingPolicy,
    Task,
    TaskGroup,
)
from forge.core.placement import Binding, Cluster
from forge.core.reconcile import Carry, Plan, ReconcileOptions, reconcile
from tests import strategies as fs
from tests.core.sim import Sim


def _key(plan: Plan) -> tuple[Any, ...]:
    def b(x: Binding) -> tuple[Any, ...]:
        return (x.job, x.group, x.ordinal, x.node, x.gpu_ids, x.cpu, x.memory, x.gpu_milli)

    return (
        sorted((w, b(x)) for w, x in plan.bindings.items()),
        [b(x) for x in plan.placed],
        plan.released,
        sorted(plan.pending.items()),
        sorted(plan.failures.items()),
        plan.next_wake,
        plan.deferred,
    )


def _alloc_state(cluster: Cluster) -> dict[str, tuple[Any, ...]]:
    return {
        a.id: (
            a.cpu_used,
            a.mem_used,
            a.gpus_used,
            tuple(a.gpu_free),
            tuple(a.gpu_left),
            a.reserve,
            a.res_cpu,
            a.res_mem,
        )
        for a in cluster.nodes
    }


@st.composite
def gpu_nodes(draw: st.DrawFn, node_id: str) -> Node:
    """A ready GPU node: 2-16 cores, 4-64 GiB, 1-4 H100 or A100."""
    model = draw(st.sampled_from(["H100", "A100"]))
    return Node(
        id=node_id,
        cpu=draw(st.integers(2, 16)) * 1000,
        memory=draw(st.integers(4, 64)) * 1024,
        gpus=tuple(
            GpuDevice(id=f"gpu{i}", model=model, memory=81920)
            for i in range(draw(st.integers(1, 4)))
        ),
    )


@st.composite
def gpu_jobs(draw: st.DrawFn, job_id: str) -> Job:
    """A job asking whole GPUs or a share of one, or none, with several replicas."""
    kind = draw(st.sampled_from(["whole", "share", "cpu"]))
    gpu = GpuRequest()
    if kind == "whole":
        gpu = GpuRequest(count=draw(st.sampled_from([1, 2, 4])))
    elif kind == "share":
        gpu = GpuRequest(count=1, milli=draw(st.sampled_from([100, 300, 500, 700])))
    desired = draw(st.integers(0, 8))
    task = Task(
        name="t",
        resources=Resources(
            cpu=draw(st.integers(1, 8)) * 500, memory=draw(st.integers(1, 16)) * 512, gpu=gpu
        ),
    )
    return Job(
        id=job_id,
        name=job_id,
        priority=draw(st.sampled_from([10, 50, 90])),
        groups=(
            TaskGroup(
                name="g",
                tasks=(task,),
                scaling=ScalingPolicy(min=0, max=max(desired, 8), desired=desired),
            ),
        ),
    )


@st.composite
def v2_options(draw: st.DrawFn) -> ReconcileOptions:
    return ReconcileOptions(
        algorithm=draw(st.sampled_from(["binpack", "spread", "fgd", "fgd2"])),
        candidates=draw(st.sampled_from([0, 1, 2, 8])),
        max_placements=draw(st.sampled_from([1, 3, 20_000])),
        gpu_reserve=draw(st.sampled_from([None, None, 250, 1000])),
        seed=draw(st.integers(0, 3)),
    )


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    world=fs.worlds(max_nodes=4, max_jobs=3),
    extra_nodes=st.lists(st.integers(0, 1), min_size=1, max_size=3),
    extra_jobs=st.integers(1, 4),
    data=st.data(),
    options=v2_options(),
    events=st.lists(fs.events(), max_size=10),
    restarts=st.lists(st.booleans(), min_size=11, max_size=11),
)
def test_a_carried_v2_pass_places_exactly_as_a_pass_over_every_binding(
    world: fs.World,
    extra_nodes: list[int],
    extra_jobs: int,
    data: st.DataObject,
    options: ReconcileOptions,
    events: list[fs.Event],
    restarts: list[bool],
) -> None:
    nodes = dict(world.nodes)
    for i, _ in enumerate(extra_nodes):
        nodes[f"h{i}"] = data.draw(gpu_nodes(f"h{i}"))
    jobs = dict(world.jobs)
    for i in range(extra_jobs):
        jobs[f"k{i}"] = data.draw(gpu_jobs(f"k{i}"))
    sim = Sim(nodes=nodes, jobs=jobs, options=options)
    carry: Carry | None = None
    for step in range(len(events) + 1):
        if step:
            sim.apply(events[step - 1])
        inputs = sim.inputs()
        full = reconcile(**inputs)
        if carry is None or restarts[step]:
            # as a new run loads it: each stored binding absorbed as it arrives
            # (into a cluster without the reservation, which the pass restores)
            carry = Carry.start(inputs["jobs"], inputs["nodes"])
            for wid, b in inputs["bindings"].items():
                carry.absorb(wid, b)
        hint: set[str] | None = None
        if data.draw(st.booleans(), label="hinted"):
            # as the workflow does: the ids it loaded (a superset of what changed)
            changed = {
                j
                for j in inputs["jobs"].keys() | carry.jobs.keys()
                if inputs["jobs"].get(j) is not carry.jobs.get(j)
            }
            extra = data.draw(st.sets(st.sampled_from(sorted(inputs["jobs"]) or ["none"])))
            hint = changed | extra
        carried = reconcile(**inputs, carry=carry, jobs_changed=hint)
        assert _key(carried) == _key(full), "a carried v2 pass planned differently"
        assert carried.carry is not None and carried.carry.jobs == inputs["jobs"]
        assert carried.desired == full.desired
        # the carry leaves the pass as a cluster built for the next pass would be:
        # the same allocations and the full reservation (a lift is per pass)
        assert carried.carry is not None
        fresh = Cluster(list(inputs["nodes"].values()), gpu_reserve=options.effective_gpu_reserve)
        for b in carried.bindings.values():
            assert fresh.by_id[b.node].hold(b)
        assert _alloc_state(carried.carry.cluster) == _alloc_state(fresh)
        carry = carried.carry
        sim.bindings, sim.pending, sim.failures = full.bindings, full.pending, full.failures
        sim.failed = set()
        sim.capacity_changed = False


def test_the_carry_is_restored_after_a_pass_that_lifted_the_reservation() -> None:
    """The plain case the property covers: a pass whose GPU work is all bound lifts
    the reservation for its CPU work; the next pass, carried, reserves again."""
    gpu_node = Node(
        id="h",
        cpu=16_000,
        memory=64 * 1024,
        gpus=(
            GpuDevice(id="gpu0", model="H100", memory=81920),
            GpuDevice(id="gpu1", model="H100", memory=81920),
        ),
    )

    def job(jid: str, cpu: int, gpus: int, desired: int, priority: int = 50) -> Job:
        res = Resources(cpu=cpu, memory=1024, gpu=GpuRequest(count=gpus))
        return Job(
            id=jid,
            name=jid,
            priority=priority,
            groups=(
                TaskGroup(
                    name="g",
                    tasks=(Task(name="t", resources=res),),
                    scaling=ScalingPolicy(min=0, max=16, desired=desired),
                ),
            ),
        )

    options = ReconcileOptions()
    nodes = {"h": gpu_node}
    cpu_only = {"c": job("c", 4000, 0, 4)}
    first = reconcile(
        jobs=cpu_only, nodes=nodes, bindings={}, pending={}, failures={}, now=0.0, options=options
    )
    assert len(first.placed) == 4  # no GPU work: the reservation was lifted
    assert first.carry is not None and not first.carry.cluster.lifted
    assert first.carry.cluster.by_id["h"].reserve == 1000
    # a GPU job now: the CPU replicas hold the node's cpu, the GPU job gets none
    jobs = {**cpu_only, "g": job("g", 1000, 2, 1)}
    carried = reconcile(
        jobs=jobs,
        nodes=nodes,
        bindings=first.bindings,
        pending=first.pending,
        failures=first.failures,
        now=1.0,
        options=options,
        carry=first.carry,
    )
    full = reconcile(
        jobs=jobs,
        nodes=nodes,
        bindings=first.bindings,
        pending=first.pending,
        failures=first.failures,
        now=1.0,
        options=options,
    )
    assert _key(carried) == _key(full)
