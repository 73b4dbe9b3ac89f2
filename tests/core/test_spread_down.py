"""Scale-down of a spread group releases as if from the most loaded value first
(issue 22, forge.core.spread_down): an example, and a property over random zones
and random (within max_skew) placements of the group's ordinals: after the
scale-down pass, under do_not_schedule, the skew is within max_skew, every desired
replica is bound, and a pass with a carry plans the same as one without."""

from __future__ import annotations

from collections import Counter
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from forge.core.models import Job, Node
from forge.core.placement import Binding
from forge.core.reconcile import Plan, ReconcileOptions, reconcile
from forge.core.spread_down import SPREAD_DOWN

NOW = 1000.0


def _job(desired: int, max_skew: int = 1, **more: Any) -> Job:
    return Job.model_validate(
        {
            "name": "web",
            "groups": [
                {
                    "name": "api",
                    "scaling": {"max": 64, "desired": desired},
                    "tasks": [{"name": "t", "resources": {"cpu": 500, "memory": 256}}],
                    "spread": [{"label": "zone", "max_skew": max_skew}],
                    **more,
                }
            ],
        }
    )


def _nodes(zones: list[int]) -> dict[str, Node]:
    """``zones[z]`` nodes in zone z (named a, b, c ...), 4 cores each."""
    out = {}
    for z, n in enumerate(zones):
        for i in range(n):
            nid = f"{chr(97 + z)}{i}"
            out[nid] = Node(id=nid, cpu=4000, memory=8192, labels={"zone": chr(97 + z)})
    return out


def _bound(job: Job, where: list[str]) -> dict[str, Binding]:
    """Replica ``i`` of the group on node ``where[i]``."""
    return {
        f"{job.id}/api/{i}": Binding(job.id, "api", i, nid, (), 500, 256)
        for i, nid in enumerate(where)
    }


def _pass(job: Job, nodes: dict[str, Node], bindings: dict[str, Binding], **opts: Any) -> Plan:
    return reconcile(
        jobs={job.id: job},
        nodes=nodes,
        bindings=bindings,
        pending={},
        failures={},
        now=NOW,
        options=ReconcileOptions(**opts),
    )


def _zones(plan: Plan, nodes: dict[str, Node]) -> Counter[str]:
    return Counter(nodes[b.node].labels["zone"] for b in plan.bindings.values())


def test_scaling_down_releases_from_the_most_loaded_zone_first() -> None:
    nodes = _nodes([2, 2])
    job = _job(4)
    # ordinals 0 and 1 in zone a, 2 and 3 in zone b (after a node loss re-placed them)
    bindings = _bound(job, ["a0", "a1", "b0", "b1"])
    down = job.with_desired("api", 2)

    before = _pass(down, nodes, bindings, spread_down=False)
    assert _zones(before, nodes) == {"a": 2}  # ordinals 2 and 3 went: skew 2 > 1

    plan = _pass(down, nodes, bindings)
    assert _zones(plan, nodes) == {"a": 1, "b": 1}
    # replica 1 (zone a's highest ordinal) takes the slot replica 2 left in zone b
    assert plan.released == [
        (f"{job.id}/api/1", SPREAD_DOWN),
        (f"{job.id}/api/2", "scaled down"),
        (f"{job.id}/api/3", "scaled down"),
    ]
    assert [(b.workload_id, b.node) for b in plan.placed] == [(f"{job.id}/api/1", "b0")]
    assert not plan.pending


def test_a_scale_down_within_max_skew_moves_nothing() -> None:
    nodes = _nodes([2, 2])
    job = _job(4)
    bindings = _bound(job, ["a0", "b0", "a1", "b1"])
    plan = _pass(job.with_desired("api", 2), nodes, bindings)
    assert [why for _, why in plan.released] == ["scaled down", "scaled down"]
    assert not plan.placed


@settings(max_examples=60, deadline=None)
@given(
    zones=st.lists(st.integers(1, 3), min_size=2, max_size=4),
    max_skew=st.integers(1, 2),
    desired=st.integers(2, 12),
    data=st.data(),
)
def test_skew_stays_within_max_skew_after_a_scale_down(
    zones: list[int], max_skew: int, desired: int, data: st.DataObject
) -> None:
    nodes = _nodes(zones)
    names = [chr(97 + z) for z in range(len(zones))]
    # a placement within max_skew (each node has room for 8): counts per zone as
    # even as the skew allows, the ordinals dealt to them in a random order
    base, extra = divmod(desired, len(names))
    counts = [base + (z < extra) for z in range(len(names))]
    shift = data.draw(st.integers(0, max_skew - 1)) if max_skew > 1 and desired > 1 else 0
    if shift and counts[0] + shift - (counts[-1] - shift) <= max_skew:
        counts[0] += shift  # up to max_skew-1 moved from the last zone to the first
        counts[-1] -= shift
    assert max(counts) - min(counts) <= max_skew
    slots = [f"{name}{i % zones[z]}" for z, name in enumerate(names) for i in range(counts[z])]
    where = data.draw(st.permutations(slots))
    job = _job(desired, max_skew)
    bindings = _bound(job, list(where))
    keep = data.draw(st.integers(1, desired - 1))
    down = job.with_desired("api", keep)

    plan = _pass(down, nodes, bindings)
    per_zone = _zones(plan, nodes)
    got = [per_zone.get(name, 0) for name in names]
    assert max(got) - min(got) <= max_skew, (where, keep, got)
    assert len(plan.bindings) == keep and not plan.pending
    moved = [w for w, why in plan.released if why == SPREAD_DOWN]
    assert sorted(b.workload_id for b in plan.placed) == sorted(moved)
    assert len(moved) <= desired - keep
    # each move lands in a slot a scaled-down replica left
    left = {bindings[w].node for w, why in plan.released if why == "scaled down"}
    assert {b.node for b in plan.placed} <= left

    # a carried pass plans the same
    first = _pass(job, nodes, bindings)
    assert first.carry is not None and not first.changed
    carried = reconcile(
        jobs={down.id: down},
        nodes=nodes,
        bindings={},
        pending={},
        failures={},
        now=NOW,
        options=ReconcileOptions(),
        carry=first.carry,
    )
    assert carried.released == plan.released
    assert [(b.workload_id, b.node) for b in carried.placed] == [
        (b.workload_id, b.node) for b in plan.placed
    ]
