"""Capacity a pass's preemption frees after its placements is used by the next pass
(regression: ``tests/core/test_reconcile.py`` TestReconcileMachine, hypothesis seed 13,
"y4/g0/3 left pending but n3 can take it").

The pass places in order, then preempts for the replicas that found no node. A
preemption releases capacity after those replicas were refused and backed off; when
the pass's placement limit (or its work budget) stops the refill, they used to wait
out their backoff beside a node with room for them. ``Plan.freed`` makes the next
pass run at once and as one that freed capacity. Plain ``reconcile`` calls, fed as
the workflow's commit feeds them (``capacity_changed=plan.freed``)."""

from __future__ import annotations

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
from forge.core.reconcile import Plan, ReconcileOptions, reconcile

NOW = 1000.0


def _job(jid: str, priority: int, desired: int, cpu: int, gpu: int = 0) -> Job:
    res = Resources(cpu=cpu, memory=256, gpu=GpuRequest(count=gpu))
    g = TaskGroup(
        name="g",
        tasks=(Task(name="t", resources=res),),
        scaling=ScalingPolicy(min=0, max=8, desired=desired),
    )
    return Job(id=jid, name=jid, priority=priority, groups=(g,))


def _next(jobs: dict[str, Job], nodes: dict[str, Node], last: Plan, opts: ReconcileOptions) -> Plan:
    return reconcile(
        jobs=jobs,
        nodes=nodes,
        bindings=last.bindings,
        pending=last.pending,
        failures=last.failures,
        capacity_changed=last.freed,  # what the workflow's commit carries
        now=NOW,
        options=opts,
    )


def test_room_a_preemption_frees_past_the_placement_limit_is_used_by_the_next_pass() -> None:
    gpus = tuple(GpuDevice(id=f"gpu{i}", model="A100", memory=16000) for i in range(6))
    nodes = {"n": Node(id="n", cpu=6000, memory=8192, gpus=gpus)}
    opts = ReconcileOptions(max_placements=3, preemption=True)
    low = {"low": _job("low", priority=10, desired=1, cpu=4000)}
    first = reconcile(
        jobs=low, nodes=nodes, bindings={}, pending={}, failures={}, now=NOW, options=opts
    )
    assert set(first.bindings) == {"low/g/0"}

    # six 1-GPU replicas at priority 50: two fit beside "low", the third preempts it
    # and the placement limit (3) stops the pass; the other three were refused
    # before the eviction and backed off
    jobs = {**low, "high": _job("high", priority=50, desired=6, cpu=1000, gpu=1)}
    second = _next(jobs, nodes, first, opts)
    assert [p.victims for p in second.preemptions] == [("low/g/0",)]
    assert len(second.placed) == 3
    assert {w for w, e in second.pending.items() if e.kind == "backoff"} >= {
        "high/g/3",
        "high/g/4",
        "high/g/5",
    }
    assert second.freed and second.next_wake == NOW  # the next pass comes at once

    # n has 3 cores and 3 GPUs free: the next pass, at the same time, binds all three
    # (before the fix they waited out their backoff: a pass with nothing released
    # tried no backed-off replica)
    third = _next(jobs, nodes, second, opts)
    assert sorted(b.workload_id for b in third.placed) == ["high/g/3", "high/g/4", "high/g/5"]
    assert not third.preemptions and not third.freed
    assert {w for w in third.bindings if w.startswith("high/")} == {f"high/g/{i}" for i in range(6)}
    assert set(third.pending) == {"low/g/0"}  # nowhere to go: n is full
