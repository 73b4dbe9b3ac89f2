"""Static eligibility: why a class's nodes are out is what the filter chain says,
and a carried cluster keeps it across passes without a second sweep."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from forge.core.models import Constraint, Node, Request
from forge.core.nodes import Taint, Toleration
from forge.core.placement.diagnosis import Rejection, Rule
from forge.core.placement.eligible import Eligibility
from forge.core.placement.filters import STATIC_FILTERS, explain_node
from forge.core.placement.state import Cluster
from tests.strategies import MODELS, node_lists, requests_and_constraints

_TAINT = Taint(key="pool", value="gpu")


def _oracle(cluster: Cluster, req: Request, cons: tuple[Constraint, ...]) -> dict[Rejection, int]:
    """The sweep the eligibility replaced: the static filter chain, node by node."""
    counts: dict[Rejection, int] = {}
    eligible = {id(n) for n in Eligibility(cluster, list(cluster.nodes)).nodes(req, cons)}
    for n in cluster.nodes:
        if id(n) not in eligible:
            why = explain_node(n, req, cons, STATIC_FILTERS) or Rejection(Rule.GPU)
            counts[why] = counts.get(why, 0) + 1
    return counts


@given(
    node_lists(max_size=8),
    requests_and_constraints(),
    st.lists(st.booleans(), min_size=8, max_size=8),
    st.booleans(),
)
def test_why_nodes_are_out_is_what_the_static_filters_say(
    nodes: list[Node],
    group_and_constraints: tuple[object, tuple[Constraint, ...]],
    tainted: list[bool],
    tolerates: bool,
) -> None:
    group, cons = group_and_constraints
    nodes = [
        n.model_copy(update={"taints": (_TAINT,)}) if t else n
        for n, t in zip(nodes, tainted, strict=False)
    ]
    req = group.request()  # type: ignore[attr-defined]
    if tolerates:
        req = req.model_copy(update={"tolerations": (Toleration(key="pool", operator="Exists"),)})
    cluster = Cluster(nodes)
    got = Eligibility.of(cluster, seed=0).reasons(req, cons)
    assert got == _oracle(cluster, req, cons)
    assert sum(got.values()) + len(Eligibility.of(cluster, seed=0).nodes(req, cons)) == len(nodes)


def test_a_kept_eligibility_sweeps_nothing_and_a_changed_node_drops_it() -> None:
    nodes = [
        Node.model_validate(
            {"id": f"n{i}", "cpu": 8000, "memory": 8192,
             "gpus": [{"id": "g0", "model": MODELS[i % 2], "memory": 16384}] if i % 3 else []}
        )
        for i in range(30)
    ]  # fmt: skip
    req = Request(cpu=100, memory=100, gpu=1, gpu_models=(MODELS[0],))
    cluster = Cluster(nodes)
    first = Eligibility.of(cluster, seed=7)
    first.reasons(req, ())
    built = first.work
    assert built > len(nodes)  # the list and the sweep were charged
    again = Eligibility.of(cluster, seed=7)
    assert again is first and again.kept
    again.reasons(req, ())
    again.nodes(req, ())
    assert again.work == built  # nothing swept or built a second time
    cluster.refresh({n.id: n for n in nodes}, {"n1"})
    assert Eligibility.of(cluster, seed=7) is not first
