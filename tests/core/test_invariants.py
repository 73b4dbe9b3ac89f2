"""forge.core.invariants.fitting_pending: invariant 4 over a settled state."""

from __future__ import annotations

from forge.core.invariants import fitting_pending
from forge.core.models import Assignment, NodeState
from tests.workflow.harness import job, node


def _bound(wid: str, node_id: str, cpu: int = 1000, memory: int = 1024) -> Assignment:
    j, g, i = wid.rsplit("/", 2)
    return Assignment(
        workload_id=wid, job=j, group=g, ordinal=int(i), node=node_id, cpu=cpu, memory=memory
    )


def test_a_pending_replica_that_fits_a_ready_node_is_a_violation() -> None:
    nodes = [node("n1", cpu=2000), node("n2", cpu=1000)]
    jobs = [job("a", replicas=3)]
    full = [_bound("a/main/0", "n1"), _bound("a/main/1", "n1")]
    # n2 is free: the third replica should have gone there
    (found,) = fitting_pending(nodes, full, jobs)
    assert "a/main/2" in found and "n2" in found
    # all three bound: nothing pending
    assert fitting_pending(nodes, [*full, _bound("a/main/2", "n2")], jobs) == []


def test_pending_is_fine_when_nothing_fits_or_the_room_is_not_ready() -> None:
    jobs = [job("a", replicas=2, cpu=1500)]
    bound = [_bound("a/main/0", "n1", cpu=1500)]
    # n1 has 500 left, n2 is drained: no ready node can take the second replica
    drained = node("n2", cpu=4000).model_copy(update={"state": NodeState.DRAINING})
    assert fitting_pending([node("n1", cpu=2000), drained], bound, jobs) == []
    # a constraint no node meets
    pinned = [job("b", replicas=1, constraints=[{"label": "zone", "op": "=", "values": ["x"]}])]
    assert fitting_pending([node("n1")], [], pinned) == []
    # a GPU reservation keeps CPU-only work off the GPU node's reserved share
    assert fitting_pending([node("g1", cpu=1000, gpus=1)], [], [job("c")], gpu_reserve=1000) == []
    assert fitting_pending([node("g1", cpu=1000, gpus=1)], [], [job("c")], gpu_reserve=0) != []
