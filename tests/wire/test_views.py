"""The loop's views are pure: status, details, pass lines and metrics come out of
plain data, so they are checked here without a Temporal server."""

from __future__ import annotations

from typing import Any

from forge.core.models import Job, Node, NodeState
from forge.core.placement import Binding
from forge.core.reconcile import PendingEntry, Plan
from forge.wire import contract as c
from forge.wire import metrics, views


def _node(node_id: str, state: NodeState = NodeState.READY) -> Node:
    n = Node.model_validate({"id": node_id, "cpu": 4000, "memory": 8192})
    return n.model_copy(update={"state": state})


def _job(name: str, *desired: int) -> Job:
    groups: list[dict[str, Any]] = [
        {
            "name": f"g{i}",
            "scaling": {"min": 0, "max": 100, "desired": d},
            "tasks": [{"name": "t", "resources": {"cpu": 100, "memory": 64}}],
        }
        for i, d in enumerate(desired)
    ]
    return Job.model_validate({"name": name, "groups": groups})


def _binding(job: str, ordinal: int, node: str) -> Binding:
    return Binding(job, "g0", ordinal, node, (), 100, 64)


def _plan(**kw: Any) -> Plan:
    return Plan(bindings=kw.pop("bindings", {}), **kw)


def test_a_pass_line_counts_placed_released_and_pending_and_names_the_deferred() -> None:
    plan = _plan(
        placed=[_binding("a", 0, "n1")],
        released=[("b/g0/0", "node lost"), ("b/g0/1", "node lost")],
        pending={"c/g0/0": PendingEntry()},
        deferred=3,
    )
    assert views.pass_text(7, plan) == "pass 7: +1 placed, -2 released, 4 pending (3 deferred)"
    assert views.pass_text(1, _plan()) == "pass 1: +0 placed, -0 released, 0 pending"


def test_the_summary_sums_the_desired_replicas_of_every_group() -> None:
    jobs = {"a": _job("a", 2, 3), "b": _job("b", 1)}
    s = views.loop_summary(
        jobs=jobs,
        nodes=2,
        bound=4,
        pending=2,
        passes=5,
        generation=3,
        last_pass_at=10.0,
        last_pass="x",
    )
    assert (s.desired, s.jobs, s.bound, s.pending, s.generation) == (6, 2, 4, 2, 3)


def test_details_show_nodes_by_state_notices_and_why_replicas_wait() -> None:
    pending = {
        "a/g0/0": PendingEntry(reasons=("cpu: no node has 100m free",)),
        "a/g0/1": PendingEntry(reasons=("cpu: no node has 100m free",)),
    }
    text = views.details(
        cluster="prod",
        runs=2,
        generation=4,
        nodes=[_node("n1"), _node("n2"), _node("n3", NodeState.LOST)],
        jobs=1,
        bound=5,
        pending=pending,
        deferred=1,
        last_pass="pass 9",
        notices=["1 signal(s) dropped; last: x"],
    )
    lines = text.splitlines()
    assert lines[0] == "**Forge cluster `prod`** (run 2, generation 4)"
    assert "- nodes: 3 (1 lost, 2 ready)" in lines
    assert "- jobs: 1, replicas bound: 5, pending: 3" in lines
    assert "- **1 signal(s) dropped; last: x**" in lines
    assert "  - 2 x cpu: no node has 100m free" in lines
    assert f"  - 1 x {views.DEFERRED_REASON}" in lines


def test_details_without_pending_list_no_reasons() -> None:
    text = views.details(
        cluster="c",
        runs=1,
        generation=1,
        nodes=[],
        jobs=0,
        bound=0,
        pending={},
        deferred=0,
        last_pass="not yet run",
    )
    assert "pending because" not in text
    assert "- nodes: 0 ()" in text.splitlines()


def test_assignment_pages_follow_workload_ids_and_filter_by_node() -> None:
    bindings = {b.workload_id: b for b in (_binding("j", i, f"n{i % 2}") for i in range(5))}
    first = views.assignments_page(bindings, c.AssignmentsQuery(limit=2))
    assert [a.workload_id for a in first.items] == ["j/g0/0", "j/g0/1"]
    assert first.next_after == "j/g0/1"
    rest = views.assignments_page(bindings, c.AssignmentsQuery(after="j/g0/1", limit=10))
    assert [a.workload_id for a in rest.items] == ["j/g0/2", "j/g0/3", "j/g0/4"]
    assert rest.next_after is None
    on_n1 = views.assignments_page(bindings, c.AssignmentsQuery(node="n1"))
    assert [a.workload_id for a in on_n1.items] == ["j/g0/1", "j/g0/3"]
    assert all(a.node == "n1" and a.status == "pending" for a in on_n1.items)


def test_the_status_counts_deferred_replicas_as_not_listed() -> None:
    pending = {f"j/g0/{i}": PendingEntry() for i in range(views.PENDING_SHOWN + 2)}
    view = views.status_view(
        c.Summary.empty(), [_node("n1")], [_binding("j", 0, "n1")], pending, deferred=5
    )
    assert len(view.pending) == views.PENDING_SHOWN
    assert view.pending_truncated == 2 + 5
    assert view.nodes[0].replicas == 1 and view.nodes[0].cpu.allocated == 100


def _by_name(metrics: list[metrics.Metric]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(m.name, tuple(sorted(m.attributes.items()))): m.value for m in metrics}


def test_pass_metrics_report_every_node_state_and_moves_by_reason() -> None:
    plan = _plan(
        bindings={"a/g0/0": _binding("a", 0, "n1")},
        placed=[_binding("a", 0, "n1")],
        released=[("b/g0/0", "node lost"), ("b/g0/1", "node lost"), ("c/g0/0", "stopped")],
        pending={"d/g0/0": PendingEntry(kind="backoff"), "d/g0/1": PendingEntry(kind="deferred")},
        deferred=2,
        desired=6,
        work=42,
    )
    got = _by_name(metrics.pass_metrics(plan, [_node("n1"), _node("n2", NodeState.LOST)], 0.25))
    assert got[("forge_replicas_desired", ())] == 6
    assert got[("forge_replicas_bound", ())] == 1
    assert got[("forge_replicas_pending", ())] == 4
    assert got[("forge_replicas_backoff", ())] == 1
    assert got[("forge_nodes", (("state", "ready"),))] == 1
    assert got[("forge_nodes", (("state", "draining"),))] == 0
    assert got[("forge_nodes", (("state", "lost"),))] == 1
    assert got[("forge_replicas_moved_total", (("reason", "node lost"),))] == 2
    assert got[("forge_replicas_moved_total", (("reason", "stopped"),))] == 1
    assert got[("forge_passes_total", ())] == 1
    assert got[("forge_pass_seconds", ())] == 0.25
    assert got[("forge_pass_work_units", ())] == 42
    kinds = {m.name: m.kind for m in metrics.pass_metrics(plan, [], 0.0)}
    assert kinds["forge_pass_seconds"] == "histogram_float"
    assert kinds["forge_placements_total"] == "counter"


def test_queue_metrics_give_used_and_nominal_in_the_quota_s_units_per_queue() -> None:
    from forge.core.quota import QueueSpec
    from forge.wire.queues import QueueView

    quota = {"cpu": {"nominal": 4000}, "gpu": {"A100": {"nominal": 2}, "T4": {"nominal": 1}}}
    ml = QueueSpec.model_validate({"name": "ml", "quota": quota})
    bare = QueueSpec.model_validate({"name": "bare", "quota": {}})
    views = [
        QueueView(spec=ml, usage={"cpu": 3000, "gpu:A100": 1500}, bound=4, queued=2),
        QueueView(spec=bare, bound=1),
    ]
    got = _by_name(metrics.queue_metrics(views))
    ml_cpu = (("queue", "ml"), ("resource", "cpu"))
    assert got[("forge_queue_used", ml_cpu)] == 3000
    assert got[("forge_queue_nominal", ml_cpu)] == 4000
    a100 = (("queue", "ml"), ("resource", "gpu:A100"))
    assert (got[("forge_queue_used", a100)], got[("forge_queue_nominal", a100)]) == (1500, 2000)
    t4 = (("queue", "ml"), ("resource", "gpu:T4"))
    assert (got[("forge_queue_used", t4)], got[("forge_queue_nominal", t4)]) == (0, 1000)
    assert got[("forge_queue_bound", (("queue", "ml"),))] == 4
    assert got[("forge_queue_queued", (("queue", "ml"),))] == 2
    # no quota, no resource series (nothing to divide by); its counts still
    assert [k for k in got if ("queue", "bare") in k[1]] == [
        ("forge_queue_bound", (("queue", "bare"),)),
        ("forge_queue_queued", (("queue", "bare"),)),
    ]
    assert ("forge_queue_used", (("queue", "ml"), ("resource", "memory"))) not in got


def test_node_usage_sums_each_nodes_latest_reports_and_lists_their_ports() -> None:
    from forge.core.models import Assignment
    from forge.stores.base import TaskReport

    def bind(wid: str, node: str, cpu: int = 500, memory: int = 256) -> Assignment:
        job, group, ordinal = wid.split("/")
        return Assignment(
            workload_id=wid, job=job, group=group, ordinal=int(ordinal), node=node,
            cpu=cpu, memory=memory,
        )  # fmt: skip

    def report(wid: str, node: str, cpu: float, memory: float, message: str = "") -> TaskReport:
        return TaskReport(
            workload_id=wid, status="running", cpu=cpu, memory=memory, at=1.0, node=node,
            message=message,
        )  # fmt: skip

    bindings = [bind("web/a/0", "n1"), bind("web/a/1", "n1"), bind("web/a/2", "n2")]
    reports = [
        report("web/a/0", "n1", 0.5, 0.25, "cpu 250m memory 64Mi ports http=8001 admin=8002"),
        report("web/a/1", "n1", 2.0, 1.0, "cpu 1000m memory 256Mi ports http=8003"),
        report("web/a/2", "n9", 1.0, 1.0, "ports http=9"),  # moved to n2 since: left out
        report("gone/a/0", "n1", 1.0, 1.0),  # not bound any more: left out
    ]
    usage = views.node_usage(reports, bindings)
    assert usage == {
        "n1": views.NodeUsage(
            cpu=1250,
            memory=320,
            reporting=2,
            ports=(
                ("web/a/0", "admin", 8002),
                ("web/a/0", "http", 8001),
                ("web/a/1", "http", 8003),
            ),
        )
    }
    assert views.parse_ports("started ports http=1 x=nope b=2") == [("http", 1), ("b", 2)]
    assert views.parse_ports("started") == []


def test_explain_shows_a_group_s_own_rules_in_each_node_s_verdict() -> None:
    """distinct_hosts and a do_not_schedule spread reject nodes as the pass would."""
    job = Job.model_validate(
        {
            "name": "web",
            "groups": [
                {
                    "name": "api",
                    "scaling": {"max": 4, "desired": 3},
                    "distinct_hosts": True,
                    "spread": [{"label": "zone"}],
                    "tasks": [{"name": "t", "resources": {"cpu": 100, "memory": 64}}],
                }
            ],
        }
    )
    nodes = [
        Node(id="a1", cpu=1000, memory=1024, labels={"zone": "a"}),
        Node(id="a2", cpu=1000, memory=1024, labels={"zone": "a"}),
        Node(id="b1", cpu=1000, memory=1024, labels={"zone": "b"}),
        Node(id="bare", cpu=1000, memory=1024),
    ]
    held = [Binding("web", "api", 0, "a1", (), 100, 64)]
    out = views.explanation(
        "web/api/1", binding=None, pending=None, job=job, nodes=nodes, bindings=held
    )
    assert out.nodes == [
        "a1: distinct hosts (holds a replica of the group)",
        "a2: spread on zone would pass max_skew",
        "b1: fits now",
        "bare: no zone label (spread)",
    ]
