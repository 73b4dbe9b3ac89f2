"""One behaviour suite for every store: memory, SQLite and PostgreSQL must agree."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from forge.core.models import Assignment, AssignmentStatus, Job, Node, NodeState
from forge.core.quota import QueueSpec
from forge.stores import (
    Delta,
    Fence,
    MemoryStore,
    SqliteStore,
    StaleFenceError,
    Store,
    StoreError,
    TaskReport,
    delta_digest,
    migrate_url,
    open_store,
)
from forge.stores.base import AssignmentRow
from forge.stores.migrations import LATEST_VERSION, migrate
from forge.stores.postgres import PostgresStore, parse_postgres_url
from forge.stores.sqlite import sqlite_path
from tests.stores.conftest import Backend

C = "c1"


def make_job(name: str, desired: int = 1, **extra: Any) -> Job:
    return Job.model_validate(
        {
            "name": name,
            "groups": [
                {
                    "name": "api",
                    "scaling": {"min": 0, "max": max(desired, 1), "desired": desired},
                    "tasks": [{"name": "t", "resources": {"cpu": 100, "memory": 64}}],
                }
            ],
            **extra,
        }
    )


def bound(
    job: str,
    group: str,
    ordinal: int,
    node: str = "n1",
    *,
    gpu_ids: tuple[str, ...] = (),
    status: AssignmentStatus = AssignmentStatus.PENDING,
) -> Assignment:
    return Assignment(
        workload_id=f"{job}/{group}/{ordinal}",
        job=job,
        group=group,
        ordinal=ordinal,
        node=node,
        gpu_ids=gpu_ids,
        cpu=100,
        memory=64,
        status=status,
    )


def make_node(node_id: str, state: NodeState = NodeState.READY) -> Node:
    return Node(id=node_id, cpu=4000, memory=8192, state=state)


def usage(
    workload: str, at: float, cpu: float | None = None, memory: float | None = None
) -> TaskReport:
    return TaskReport(workload_id=workload, status="running", cpu=cpu, memory=memory, at=at)


def all_assignments(store: Store, cluster: str = C, page: int = 5000) -> list[Assignment]:
    out: list[Assignment] = []
    while batch := store.assignments(cluster, after=out[-1].workload_id if out else "", limit=page):
        out.extend(batch)
    return out


# -- jobs ------------------------------------------------------------------------------


def test_store_satisfies_the_protocol(store: Store) -> None:
    assert isinstance(store, Store)


def test_job_revisions_strictly_increase(store: Store) -> None:
    revisions = [
        store.put_job(C, make_job("a")),
        store.put_job(C, make_job("b")),
        store.put_job(C, make_job("a", desired=2)),
        store.delete_job(C, "b"),
        store.put_job(C, make_job("c")),
    ]
    assert revisions == [1, 2, 3, 4, 5]
    assert store.revision(C) == 5
    assert store.revision("other") == 0


def test_put_then_get_round_trips_the_whole_spec(store: Store) -> None:
    job = Job.model_validate(
        {
            "name": "train",
            "priority": 90,
            "groups": [
                {
                    "name": "workers",
                    "scaling": {"min": 1, "max": 8, "desired": 4},
                    "constraints": [{"label": "zone", "op": "in", "values": ["a", "b"]}],
                    "autoscale": {"policy": "target", "target": 0.5},
                    "tasks": [
                        {
                            "name": "t",
                            "command": ["python", "-m", "train"],
                            "env": {"SEED": "7"},
                            "resources": {
                                "cpu": 4000,
                                "memory": 16384,
                                "gpu": {"count": 2, "memory": 40000, "models": ["a100"]},
                            },
                        }
                    ],
                }
            ],
        }
    )
    store.put_job(C, job)
    assert store.get_job(C, "train") == job
    assert store.get_job(C, "missing") is None
    assert store.get_job("other", "train") is None


def test_put_replaces_and_list_is_ordered_by_code_point(store: Store) -> None:
    for name in ["zeta", "alpha", "Mid", "a-b", "a.b", "a_b"]:
        store.put_job(C, make_job(name))
    store.put_job(C, make_job("alpha", desired=3))
    jobs = store.list_jobs(C)
    assert [j.id for j in jobs] == sorted(["zeta", "alpha", "Mid", "a-b", "a.b", "a_b"])
    assert next(j for j in jobs if j.id == "alpha").groups[0].scaling.desired == 3


def test_delete_leaves_a_tombstone_in_changes_and_hides_the_job(store: Store) -> None:
    store.put_job(C, make_job("a"))
    store.put_job(C, make_job("b"))
    revision = store.delete_job(C, "a")

    assert revision == 3
    assert store.get_job(C, "a") is None
    assert [j.id for j in store.list_jobs(C)] == ["b"]
    page = store.job_changes(C, since=0)
    assert [(c.revision, c.job_id, c.job is None) for c in page.changes] == [
        (2, "b", False),
        (3, "a", True),
    ]
    # Deleting what is not there changes nothing and reports it.
    assert store.delete_job(C, "a") is None
    assert store.delete_job(C, "never") is None
    assert store.delete_job("empty-cluster", "never") is None
    assert store.revision(C) == 3
    # A deleted job can come back, with a new revision.
    assert store.put_job(C, make_job("a")) == 4
    assert store.get_job(C, "a") == make_job("a")


def test_job_spec_changes_are_job_changes_as_stored_text(store: Store) -> None:
    """The reload's raw read pages exactly as ``job_changes``, each spec the JSON
    of the stored job (PostgreSQL's jsonb text too), tombstones as None."""
    for job_id in ("a", "b", "c"):
        store.put_job(C, make_job(job_id))
    store.put_job(C, make_job("a", desired=3))
    store.delete_job(C, "b")
    for since, limit in ((0, 500), (0, 2), (3, 1), (5, 10)):
        parsed = store.job_changes(C, since=since, limit=limit)
        raw = store.job_spec_changes(C, since=since, limit=limit)
        assert (raw.revision, raw.more) == (parsed.revision, parsed.more)
        assert [
            (r, i, None if s is None else Job.model_validate_json(s)) for r, i, s in raw.rows
        ] == [(ch.revision, ch.job_id, ch.job) for ch in parsed.changes]


def test_job_changes_keep_each_jobs_latest_change_once_and_page(store: Store) -> None:
    store.put_job(C, make_job("a"))  # 1, superseded by 4
    store.put_job(C, make_job("b"))  # 2
    store.put_job(C, make_job("c"))  # 3
    store.put_job(C, make_job("a", desired=2))  # 4
    store.put_job(C, make_job("d"))  # 5

    first = store.job_changes(C, since=0, limit=2)
    assert [(c.revision, c.job_id) for c in first.changes] == [(2, "b"), (3, "c")]
    assert first.more is True
    assert first.revision == 3

    second = store.job_changes(C, since=first.revision, limit=2)  # exactly the rest
    assert [(c.revision, c.job_id) for c in second.changes] == [(4, "a"), (5, "d")]
    assert second.changes[0].job == make_job("a", desired=2)
    assert second.more is False
    assert second.revision == 5

    empty = store.job_changes(C, since=5)
    assert (empty.changes, empty.more, empty.revision) == ([], False, 5)

    everything = store.job_changes(C, since=0, limit=500)
    assert [c.job_id for c in everything.changes] == ["b", "c", "a", "d"]
    assert everything.more is False


def test_clusters_are_isolated(store: Store) -> None:
    store.put_job("x", make_job("a"))
    store.put_job("x", make_job("b"))
    assert store.put_job("y", make_job("a")) == 1
    store.apply_delta("x", Fence(1, 1), Delta(bind=[bound("a", "api", 0)]))
    assert store.list_jobs("y") == [make_job("a")]
    assert store.fence("y") is None
    assert store.assignments("y") == []
    assert store.report("x", [TaskReport(workload_id="a/api/0", status="running", at=1.0)]) == 1
    assert store.report("y", [TaskReport(workload_id="a/api/0", status="failed", at=1.0)]) == 1


# -- actual state ----------------------------------------------------------------------


def test_apply_delta_binds_releases_and_maintains_nodes(store: Store) -> None:
    assert store.fence(C) is None
    first = Delta(
        bind=[
            bound("web", "api", 0, "n1"),
            bound("web", "api", 1, "n2", gpu_ids=("gpu0", "gpu1")),
            bound("web", "api", 2, "n2"),
        ],
        nodes_upsert=[make_node("n1"), make_node("n2")],
    )
    result = store.apply_delta(C, Fence(1, 1), first)
    assert result.applied is True
    assert result.digest == delta_digest(first)
    assert store.fence(C) == Fence(1, 1)
    assert all_assignments(store) == sorted(first.bind, key=lambda a: a.workload_id)
    assert store.nodes(C) == [make_node("n1"), make_node("n2")]

    running = bound("web", "api", 2, "n2", status=AssignmentStatus.RUNNING)
    second = Delta(
        release=["web/api/0", "web/api/9"],  # releasing an unknown id is a no-op
        bind=[running],
        nodes_upsert=[make_node("n1", NodeState.DRAINING)],
        nodes_remove=["n2", "n-unknown"],
    )
    assert store.apply_delta(C, Fence(1, 2), second).applied is True
    assert all_assignments(store) == [first.bind[1], running]
    assert store.nodes(C) == [make_node("n1", NodeState.DRAINING)]
    assert store.fence(C) == Fence(1, 2)


def test_release_and_bind_of_one_replica_in_one_delta_moves_it(store: Store) -> None:
    store.apply_delta(C, Fence(1, 1), Delta(bind=[bound("web", "api", 0, "n1")]))
    moved = bound("web", "api", 0, "n2")
    store.apply_delta(C, Fence(1, 2), Delta(release=["web/api/0"], bind=[moved]))
    assert all_assignments(store) == [moved]


def test_a_node_removed_and_upserted_in_one_delta_stays_registered(store: Store) -> None:
    store.apply_delta(C, Fence(1, 1), Delta(nodes_upsert=[make_node("n1")]))
    rejoined = make_node("n1", NodeState.DRAINING)
    store.apply_delta(C, Fence(1, 2), Delta(nodes_remove=["n1"], nodes_upsert=[rejoined]))
    assert store.nodes(C) == [rejoined]


def test_an_empty_delta_still_advances_the_fence(store: Store) -> None:
    store.apply_delta(C, Fence(1, 1), Delta(bind=[bound("web", "api", 0)]))
    assert store.apply_delta(C, Fence(2, 0), Delta()).applied is True
    assert store.fence(C) == Fence(2, 0)
    assert len(all_assignments(store)) == 1


def test_an_older_fence_is_refused_and_writes_nothing(store: Store) -> None:
    store.apply_delta(C, Fence(2, 5), Delta(bind=[bound("web", "api", 0)]))
    late = Delta(
        release=["web/api/0"], bind=[bound("web", "api", 1)], nodes_upsert=[make_node("x")]
    )
    for older in (Fence(2, 4), Fence(1, 99)):
        with pytest.raises(StaleFenceError):
            store.apply_delta(C, older, late)
    assert store.fence(C) == Fence(2, 5)
    assert all_assignments(store) == [bound("web", "api", 0)]
    assert store.nodes(C) == []


def test_the_same_fence_again_is_a_retry_that_reapplies_nothing(store: Store) -> None:
    store.apply_delta(C, Fence(1, 1), Delta(bind=[bound("web", "api", 0)]))
    delta = Delta(release=["web/api/0"], bind=[bound("web", "api", 1)])
    first = store.apply_delta(C, Fence(1, 2), delta)
    # Make state that a re-application would visibly undo: the release in ``delta``
    # clears web/api/0's usage, so usage reported after it must survive the retry.
    store.report(C, [usage("web/api/0", 10.0, cpu=0.5, memory=0.5)])

    retry = store.apply_delta(C, Fence(1, 2), delta)

    assert (retry.applied, retry.digest) == (False, first.digest)
    assert retry.digest == delta_digest(delta)
    assert store.group_usage(C, since=0.0) == {"web/api": (0.5, 0.5, None)}
    assert all_assignments(store) == [bound("web", "api", 1)]
    assert store.fence(C) == Fence(1, 2)


def test_the_same_fence_with_a_different_delta_is_an_error(store: Store) -> None:
    store.apply_delta(C, Fence(1, 1), Delta(bind=[bound("web", "api", 0)]))
    with pytest.raises(StoreError) as info:
        store.apply_delta(C, Fence(1, 1), Delta(bind=[bound("web", "api", 1)]))
    assert not isinstance(info.value, StaleFenceError)
    assert all_assignments(store) == [bound("web", "api", 0)]


def test_assignments_page_by_workload_id_in_code_point_order(store: Store) -> None:
    jobs = ["B", "a", "a-b", "a.b", "a_b", "A-1"]
    binds = [bound(j, "g", i) for j in jobs for i in range(4)]  # 24 bindings
    store.apply_delta(C, Fence(1, 1), Delta(bind=binds))
    expected = sorted(binds, key=lambda a: a.workload_id)

    pages: list[list[Assignment]] = []
    after = ""
    while page := store.assignments(C, after=after, limit=10):
        pages.append(page)
        after = page[-1].workload_id
    assert [len(p) for p in pages] == [10, 10, 4]
    assert [a for p in pages for a in p] == expected
    assert store.assignments(C, after=expected[5].workload_id, limit=2) == expected[6:8]


def test_assignment_rows_are_the_assignments_unbuilt(store: Store) -> None:
    """The reload's raw read pages exactly as ``assignments``, field for field
    (GPU ids, shares, versions and statuses included)."""
    binds = [
        bound("web", "api", 0),
        bound("web", "api", 1, "n2", gpu_ids=("0", "3"), status=AssignmentStatus.RUNNING),
        bound("gpu", "g", 0, "n3", gpu_ids=("1",)).model_copy(update={"gpu_milli": 250}),
        bound("v", "g", 0).model_copy(update={"version": "abc123", "gpu_milli": 0}),
        bound("f", "g", 2, status=AssignmentStatus.FAILED),
    ]
    store.apply_delta(C, Fence(1, 1), Delta(bind=binds))
    for after, limit in (("", 10), ("", 2), ("gpu/g/0", 2), ("zzz", 5)):
        built = store.assignments(C, after=after, limit=limit)
        rows = store.assignment_rows(C, after=after, limit=limit)
        assert [r._asdict() for r in rows] == [
            {f: getattr(a, f) for f in AssignmentRow._fields}
            | {"gpu_ids": tuple(a.gpu_ids), "status": a.status.value}
            for a in built
        ]


def test_nodes_page_by_id(store: Store) -> None:
    ids = ["n2", "n10", "N3", "n-1", "n.1", "n_1", "n1"]
    store.apply_delta(C, Fence(1, 1), Delta(nodes_upsert=[make_node(i) for i in ids]))
    expected = sorted(ids)
    assert [n.id for n in store.nodes(C, limit=3)] == expected[:3]
    assert [n.id for n in store.nodes(C, after=expected[2], limit=3)] == expected[3:6]
    assert [n.id for n in store.nodes(C, after=expected[5], limit=3)] == expected[6:]
    assert store.nodes(C, after=expected[-1]) == []


def test_twenty_thousand_binds_in_one_delta_are_fast(store: Store) -> None:
    binds = [bound("big", "g", i, f"n{i % 500}") for i in range(20_000)]
    delta = Delta(bind=binds)
    started = time.perf_counter()
    result = store.apply_delta(C, Fence(1, 1), delta)
    elapsed = time.perf_counter() - started
    print(f"\n{type(store).__name__}: 20k binds applied in {elapsed:.3f}s")
    assert result.applied
    assert elapsed < 5.0  # generous: measured ~0.1-0.4 s on a laptop-class machine
    assert len(all_assignments(store)) == 20_000


# -- liveness and task status ----------------------------------------------------------


def test_expired_nodes_are_registered_live_nodes_with_an_old_heartbeat(store: Store) -> None:
    store.apply_delta(
        C,
        Fence(1, 1),
        Delta(
            nodes_upsert=[
                make_node("a"),
                make_node("b", NodeState.DRAINING),
                make_node("never-beat"),
                make_node("lost", NodeState.LOST),
            ]
        ),
    )
    store.heartbeat(C, "a", 100.0)
    store.heartbeat(C, "b", 200.0)
    store.heartbeat(C, "lost", 50.0)
    store.heartbeat(C, "unregistered", 10.0)

    assert store.expired_nodes(C, before=150.0) == ["a"]
    assert store.expired_nodes(C, before=1000.0) == ["a", "b"]
    assert store.expired_nodes(C, before=1000.0, limit=1) == ["a"]
    assert store.expired_nodes(C, before=100.0) == []  # strictly older than ``before``

    store.heartbeat(C, "a", 300.0)
    store.heartbeat(C, "a", 120.0)  # arrived late: must not move the heartbeat back
    assert store.expired_nodes(C, before=250.0) == ["b"]
    assert store.expired_nodes("other", before=1000.0) == []


def test_reports_get_increasing_sequence_numbers_and_page(store: Store) -> None:
    batch1 = [
        TaskReport(workload_id="web/api/0", status="running", at=1.0),
        TaskReport(workload_id="web/api/1", status="failed", at=2.0, message="exit 137"),
        TaskReport(workload_id="web/api/0", status="exited", at=3.0),
    ]
    assert store.report(C, batch1) == 3
    batch2 = [
        TaskReport(workload_id="web/api/2", status="running", at=4.0),
        usage("web/api/2", 4.5, cpu=0.3),  # a usage sample: no number
        TaskReport(workload_id="web/api/3", status="exited", at=5.0),
    ]
    assert store.report(C, batch2) == 5
    assert store.report(C, []) == 5
    assert store.report("empty", []) == 0

    got = store.reports_since(C, 0)
    assert [r.seq for r in got] == [1, 2, 3, 4, 5]
    assert [r.model_copy(update={"seq": 0}) for r in got[:3]] == batch1
    assert [r.at for r in got[3:]] == [4.0, 5.0]
    assert [r.seq for r in store.reports_since(C, 3)] == [4, 5]
    assert [r.seq for r in store.reports_since(C, 0, limit=2)] == [1, 2]
    assert store.reports_since(C, 5) == []


def test_reports_keep_the_health_verdict_and_none_when_unsaid(store: Store) -> None:
    batch = [
        TaskReport(workload_id="web/api/0", status="running", at=1.0),
        TaskReport(workload_id="web/api/0", status="running", at=2.0, healthy=False),
        TaskReport(workload_id="web/api/0", status="running", at=3.0, healthy=True),
        usage("web/api/0", 4.0, cpu=0.1),
    ]
    store.report(C, batch)
    got = store.reports_since(C, 0)
    assert [r.healthy for r in got] == [None, False, True]  # the usage sample: no news
    assert [r.model_copy(update={"seq": 0}) for r in got] == batch[:3]
    assert "healthy" not in got[0].model_dump(mode="json")


def test_reports_keep_the_exit_status_and_none_when_unsaid(store: Store) -> None:
    batch = [
        TaskReport(workload_id="b/g/0", status="failed", at=1.0, exit_code=42),
        TaskReport(workload_id="b/g/1", status="exited", at=2.0, exit_code=0),
        TaskReport(workload_id="b/g/2", status="failed", at=3.0, exit_code=-9),
        TaskReport(workload_id="b/g/3", status="failed", at=4.0, message="cannot start"),
    ]
    store.report(C, batch)
    got = store.reports_since(C, 0)
    assert [r.exit_code for r in got] == [42, 0, -9, None]
    assert "exit_code" not in got[3].model_dump(mode="json")  # JSON as before it


# -- wake for decisions, not for data ----------------------------------------------------


def _seq(store: Store) -> int:
    """The sequence the watch follows: the last report ``reports_since`` returns."""
    found = store.reports_since(C, 0, limit=1_000_000)
    return found[-1].seq if found else 0


def test_a_usage_sample_of_a_running_replica_does_not_move_the_watch(store: Store) -> None:
    store.apply_delta(C, Fence(1, 1), Delta(bind=[bound("web", "api", 0)]))
    started = TaskReport(workload_id="web/api/0", status="running", at=1.0, node="n1")
    assert store.report(C, [started]) == 1
    before = store.reports_since(C, 0)

    for i in range(5):
        sample = usage("web/api/0", 2.0 + i, cpu=0.1 * i, memory=0.5)
        assert store.report(C, [sample.model_copy(update={"node": "n1"})]) == 1

    assert store.reports_since(C, 0) == before
    assert store.reports_since(C, 1, limit=1) == []  # the watch's own query
    # ... and the samples are still there for the autoscaler and ``forge status``
    assert store.group_usage(C, since=0.0) == {"web/api": pytest.approx((0.4, 0.5, None))}
    [latest] = store.latest_usage(C)
    assert latest.cpu == pytest.approx(0.4)
    assert (latest.at, latest.node) == (6.0, "n1")


def test_a_failed_report_moves_the_watch(store: Store) -> None:
    store.apply_delta(C, Fence(1, 1), Delta(bind=[bound("web", "api", 0)]))
    store.report(C, [TaskReport(workload_id="web/api/0", status="running", at=1.0, node="n1")])
    store.report(C, [usage("web/api/0", 2.0, cpu=0.5).model_copy(update={"node": "n1"})])
    failed = TaskReport(
        workload_id="web/api/0", status="failed", at=3.0, node="n1", message="exit 1"
    )
    assert store.report(C, [failed]) == 2
    news = store.reports_since(C, 1, limit=1)
    assert [(r.seq, r.status, r.message) for r in news] == [(2, "failed", "exit 1")]


def test_a_report_that_repeats_the_known_state_is_not_news(store: Store) -> None:
    running = TaskReport(workload_id="web/api/0", status="running", at=1.0, node="n1")
    store.report(C, [running])
    # an agent that restarted says "running" again, a batch is sent twice
    store.report(C, [running.model_copy(update={"at": 2.0, "message": "started"})])
    store.report(C, [running, running])
    assert _seq(store) == 1
    # each change of status, node or health verdict is, in order within a batch
    changes = [
        running.model_copy(update={"at": 3.0, "healthy": False}),
        running.model_copy(update={"at": 4.0, "healthy": False}),  # the same verdict
        running.model_copy(update={"at": 5.0}),  # no verdict: a start, checks not run
        running.model_copy(update={"at": 6.0, "healthy": True}),
        running.model_copy(update={"at": 7.0, "status": "exited"}),
        running.model_copy(update={"at": 8.0, "status": "exited"}),
        running.model_copy(update={"at": 9.0, "node": "n2"}),  # moved: running elsewhere
    ]
    assert store.report(C, changes) == 6
    got = store.reports_since(C, 1)
    assert [r.at for r in got] == [3.0, 5.0, 6.0, 7.0, 9.0]


def test_releasing_or_binding_pending_makes_the_next_report_news(store: Store) -> None:
    running = TaskReport(workload_id="web/api/0", status="running", at=1.0, node="n1")
    store.apply_delta(C, Fence(1, 1), Delta(bind=[bound("web", "api", 0)]))
    store.report(C, [running])
    # persisted running: the state is kept, a repeat is still no news
    running_binding = bound("web", "api", 0, status=AssignmentStatus.RUNNING)
    store.apply_delta(C, Fence(1, 2), Delta(bind=[running_binding]))
    assert store.report(C, [running.model_copy(update={"at": 2.0})]) == 1
    # released, then bound again on the same node (a restart, scale down and up)
    store.apply_delta(C, Fence(1, 3), Delta(release=["web/api/0"]))
    store.apply_delta(C, Fence(1, 4), Delta(bind=[bound("web", "api", 0)]))
    assert store.report(C, [running.model_copy(update={"at": 3.0})]) == 2
    # a pending bind alone (a new version on the same node) forgets it too
    store.apply_delta(C, Fence(1, 5), Delta(bind=[bound("web", "api", 0)]))
    # ... and a late sample of the process it replaces does not stand in for the
    # new process's start, which is news
    stale = usage("web/api/0", 3.5, cpu=0.2).model_copy(update={"node": "n1"})
    assert store.report(C, [stale]) == 2
    assert store.report(C, [running.model_copy(update={"at": 4.0})]) == 3
    assert store.report(C, [running.model_copy(update={"at": 5.0})]) == 3


def test_a_late_verdict_of_the_replaced_process_does_not_hide_the_new_ones_start(
    store: Store,
) -> None:
    """A rolling update on the same node: the old process's last health verdict,
    sent before its agent saw the new binding, is stored after it; the new
    process's start (no verdict yet) and its own verdict must still be news (the
    watch, ``forge logs`` and the rollout follow them)."""
    running = TaskReport(workload_id="web/api/0", status="running", at=1.0, node="n1")
    store.apply_delta(C, Fence(1, 1), Delta(bind=[bound("web", "api", 0)]))
    store.report(C, [running, running.model_copy(update={"at": 2.0, "healthy": True})])
    store.apply_delta(C, Fence(1, 2), Delta(bind=[bound("web", "api", 0)]))  # v2, same node
    late = running.model_copy(update={"at": 2.5, "healthy": True})
    started = running.model_copy(update={"at": 3.0, "message": "started ports http=9"})
    checked = running.model_copy(update={"at": 4.0, "healthy": True})
    assert store.report(C, [late, started, checked]) == 5
    got = store.reports_since(C, 2)
    assert [(r.at, r.message, r.healthy) for r in got] == [
        (2.5, "", True),
        (3.0, "started ports http=9", None),
        (4.0, "", True),
    ]


def test_group_usage_averages_each_replicas_latest_report_since(store: Store) -> None:
    store.report(
        C,
        [
            usage("web/api/0", 10.0, cpu=0.2, memory=0.4),
            usage("web/api/0", 20.0, cpu=0.6, memory=0.8),  # latest for replica 0
            usage("web/api/1", 15.0, cpu=0.4, memory=0.2),
            usage("web/db/0", 5.0, cpu=1.0, memory=1.0),
            usage("x/y/0", 25.0, cpu=0.3),  # reports cpu only
            usage("web/api/1", 30.0),  # no usage at all: does not hide the one before
        ],
    )
    store.report(C, [usage("web/api/0", 12.0, cpu=0.0, memory=0.0)])  # late and older

    everything = store.group_usage(C, since=0.0)
    assert everything.keys() == {"web/api", "web/db", "x/y"}
    assert everything["web/api"] == pytest.approx((0.5, 0.5, None))
    assert everything["web/db"] == pytest.approx((1.0, 1.0, None))
    assert everything["x/y"] == pytest.approx((0.3, 0.0, None))

    recent = store.group_usage(C, since=16.0)  # replica 1's usage (at 15) is too old
    assert recent.keys() == {"web/api", "x/y"}
    assert recent["web/api"] == pytest.approx((0.6, 0.8, None))
    assert store.group_usage(C, since=20.0)["web/api"] == pytest.approx((0.6, 0.8, None))
    assert store.group_usage(C, since=100.0) == {}
    assert store.group_usage("other", since=0.0) == {}


def test_gpu_utilisation_is_averaged_over_the_replicas_that_measured_it(store: Store) -> None:
    """A group's gpu is the mean over replicas whose agent measured their devices
    (None when none did: unknown, not idle); it rides with a usage sample and is
    replaced by the replica's next one, measured or not."""
    gpu = [
        usage("gpu/a/0", 1.0, cpu=0.1, memory=0.1).model_copy(update={"gpu": 0.9}),
        usage("gpu/a/1", 1.0, cpu=0.1, memory=0.1).model_copy(update={"gpu": 0.5}),
        usage("gpu/a/2", 1.0, cpu=0.1, memory=0.1),  # declared GPUs: not measured
        usage("gpu/b/0", 1.0, cpu=0.2, memory=0.2),
        # gpu alone is no usage sample: kept nowhere
        TaskReport(workload_id="gpu/c/0", status="running", at=1.0, gpu=0.7),
    ]
    store.report(C, gpu)
    found = store.group_usage(C, since=0.0)
    assert found == {
        "gpu/a": pytest.approx((0.1, 0.1, 0.7)),
        "gpu/b": pytest.approx((0.2, 0.2, None)),
    }
    assert [(r.workload_id, r.gpu) for r in store.latest_usage(C)] == [
        ("gpu/a/0", 0.9),
        ("gpu/a/1", 0.5),
        ("gpu/a/2", None),
        ("gpu/b/0", None),
    ]
    store.report(C, [usage("gpu/a/0", 2.0, cpu=0.1, memory=0.1)])  # no longer measured
    assert store.group_usage(C, since=0.0)["gpu/a"].gpu == pytest.approx(0.5)


def test_group_usage_forgets_released_replicas(store: Store) -> None:
    store.apply_delta(C, Fence(1, 1), Delta(bind=[bound("web", "api", 0), bound("web", "api", 1)]))
    store.report(
        C, [usage("web/api/0", 1.0, cpu=0.9, memory=0.9), usage("web/api/1", 1.0, 0.1, 0.1)]
    )
    store.apply_delta(C, Fence(1, 2), Delta(release=["web/api/0"]))
    assert store.group_usage(C, since=0.0) == {"web/api": pytest.approx((0.1, 0.1, None))}
    assert store.reports_since(C, 0) == []  # samples never were decisions


def test_latest_usage_is_each_bound_replicas_last_usage_report_with_its_message(
    store: Store,
) -> None:
    store.apply_delta(C, Fence(1, 1), Delta(bind=[bound("web", "api", i) for i in range(3)]))
    ports = "cpu 10m memory 5Mi ports http=8080"
    store.report(
        C,
        [
            usage("web/api/1", 1.0, cpu=0.1, memory=0.2).model_copy(update={"node": "n1"}),
            usage("web/api/0", 2.0, cpu=0.3, memory=0.4),
            TaskReport(workload_id="web/api/1", status="failed", at=3.0, message="killed"),
            usage("web/api/1", 4.0, cpu=0.5, memory=0.6).model_copy(
                update={"node": "n1", "message": ports}
            ),
            usage("web/api/2", 5.0),  # no usage: not a usage report
        ],
    )
    found = store.latest_usage(C)
    assert [(r.workload_id, r.cpu, r.memory) for r in found] == [
        ("web/api/0", 0.3, 0.4),
        ("web/api/1", 0.5, 0.6),
    ]
    assert (found[1].message, found[1].node, found[1].status) == (ports, "n1", "running")
    assert [r.workload_id for r in store.latest_usage(C, after="web/api/0")] == ["web/api/1"]
    assert [r.workload_id for r in store.latest_usage(C, limit=1)] == ["web/api/0"]
    store.apply_delta(C, Fence(1, 2), Delta(release=["web/api/1"]))
    assert [r.workload_id for r in store.latest_usage(C)] == ["web/api/0"]
    assert store.latest_usage("other") == []


def test_a_closed_store_refuses_work(backend: Backend) -> None:
    store = backend.open()
    store.close()
    with pytest.raises(StoreError):
        store.put_job(C, make_job("a"))


# -- concurrency -----------------------------------------------------------------------


def test_concurrent_persists_never_apply_an_older_fence_after_a_newer_one(
    backend: Backend,
) -> None:
    """Threads race increasing fences (thread t owns passes t+1, t+1+T, ...) through
    two store instances; a watcher checks the stored fence only ever moves forward."""
    threads, rounds = 6, 12
    stores = [backend.open(), backend.open()]
    watcher = backend.open()
    start = threading.Barrier(threads + 1)
    done = threading.Event()
    outcome: dict[int, str] = {}
    errors: list[BaseException] = []
    seen: list[Fence] = []

    def persist(t: int) -> None:
        store = stores[t % 2]
        start.wait()
        for r in range(rounds):
            p = r * threads + t + 1
            delta = Delta(bind=[bound("marker", "g", 0, f"n{p}"), bound("j", "g", p)])
            try:
                outcome[p] = (
                    "applied" if store.apply_delta(C, Fence(1, p), delta).applied else "retry"
                )
            except StaleFenceError:
                outcome[p] = "stale"
            except BaseException as exc:
                errors.append(exc)

    def watch() -> None:
        start.wait()
        while not done.is_set():
            if (fence := watcher.fence(C)) is not None:
                seen.append(fence)

    workers = [threading.Thread(target=persist, args=(t,)) for t in range(threads)]
    observer = threading.Thread(target=watch)
    for th in [*workers, observer]:
        th.start()
    for th in workers:
        th.join()
    done.set()
    observer.join()

    assert errors == []
    last = threads * rounds
    assert len(outcome) == last
    assert "retry" not in outcome.values()
    applied = {p for p, o in outcome.items() if o == "applied"}
    assert last in applied  # nothing can be newer than the newest
    assert watcher.fence(C) == Fence(1, last)
    assert seen == sorted(seen), "the stored fence moved backwards"
    bindings = {a.workload_id: a for a in all_assignments(watcher)}
    # The newest pass wrote last, and exactly the applied passes left their mark.
    assert bindings["marker/g/0"].node == f"n{last}"
    assert {int(w.rsplit("/", 1)[1]) for w in bindings if w.startswith("j/")} == applied


# -- durability and migrations ---------------------------------------------------------


def test_a_durable_store_survives_reopening(durable_backend: Backend) -> None:
    first = durable_backend.open()
    first.put_job(C, make_job("a"))
    first.put_job(C, make_job("b"))
    first.delete_job(C, "b")
    delta = Delta(
        bind=[bound("a", "api", 0, "n1", gpu_ids=("g0",))], nodes_upsert=[make_node("n1")]
    )
    first.apply_delta(C, Fence(3, 7), delta)
    first.heartbeat(C, "n1", 5.0)
    first.report(C, [TaskReport(workload_id="a/api/0", status="running", at=5.5)])
    first.report(C, [usage("a/api/0", 6.0, cpu=0.25, memory=0.75)])
    first.close()

    again = durable_backend.open()
    assert again.list_jobs(C) == [make_job("a")]
    assert again.revision(C) == 3
    assert [c.job_id for c in again.job_changes(C, 0).changes] == ["a", "b"]
    assert again.fence(C) == Fence(3, 7)
    assert again.apply_delta(C, Fence(3, 7), delta).applied is False
    assert again.assignments(C) == delta.bind
    assert again.nodes(C) == [make_node("n1")]
    assert again.expired_nodes(C, before=10.0) == ["n1"]
    assert again.group_usage(C, since=0.0) == {"a/api": pytest.approx((0.25, 0.75, None))}
    assert again.put_job(C, make_job("c")) == 4
    # the replica's state survived too: the same "running" again is not news
    assert again.report(C, [TaskReport(workload_id="a/api/0", status="running", at=7.0)]) == 1
    assert again.report(C, [TaskReport(workload_id="a/api/0", status="failed", at=8.0)]) == 2


def test_migrations_are_idempotent(durable_backend: Backend) -> None:
    durable_backend.open().close()
    assert migrate_url(durable_backend.url) == LATEST_VERSION
    assert migrate_url(durable_backend.url) == LATEST_VERSION
    assert _applied_versions(durable_backend.url) == list(range(1, LATEST_VERSION + 1))


def test_migrations_are_safe_when_workers_start_together(durable_backend: Backend) -> None:
    workers = 5
    start = threading.Barrier(workers)
    versions: list[int] = []
    errors: list[BaseException] = []

    def open_one() -> None:
        start.wait()
        try:
            versions.append(migrate_url(durable_backend.url))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(workers)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    assert versions == [LATEST_VERSION] * workers
    assert _applied_versions(durable_backend.url) == list(range(1, LATEST_VERSION + 1))


WEB = ["web/api/0", "web/api/1"]


def _at_version_4(url: str) -> Any:
    """A connection to an empty database migrated only to schema version 4 (before
    report states), for a test to fill with old rows before migrating on."""
    from forge.stores.migrations import POSTGRES_MIGRATIONS, SQLITE_MIGRATIONS

    if url.startswith("sqlite:"):
        conn: Any = sqlite3.connect(sqlite_path(url), isolation_level=None)
        steps, mark = SQLITE_MIGRATIONS, "?"
        conn.execute("CREATE TABLE schema_version (version INTEGER PRIMARY KEY, applied_at TEXT)")
    else:
        from psycopg import sql as pgsql

        from forge.stores.postgres import connect_postgres

        conn, schema = connect_postgres(url)
        assert schema is not None
        conn.execute(pgsql.SQL("CREATE SCHEMA {}").format(pgsql.Identifier(schema)))
        steps, mark = POSTGRES_MIGRATIONS, "%s"
        conn.execute("CREATE TABLE schema_version (version INTEGER PRIMARY KEY, applied_at TEXT)")
    for version in range(1, 5):
        for statement in steps[version - 1]:
            conn.execute(statement)
        conn.execute(f"INSERT INTO schema_version (version) VALUES ({mark})", (version,))
    return conn


def test_migrating_old_reports_keeps_usage_and_known_states(durable_backend: Backend) -> None:
    conn = _at_version_4(durable_backend.url)
    mark = "?" if durable_backend.name == "sqlite" else "%s"
    try:
        conn.execute(
            f"INSERT INTO clusters (cluster, revision, report_seq) VALUES ({mark}, 0, 3)", (C,)
        )
        for w, status in (("web/api/0", "running"), ("web/api/1", "pending")):
            conn.execute(
                "INSERT INTO assignments (cluster, workload_id, job, grp, ordinal, node, gpu_ids,"
                f" cpu, memory, status) VALUES ({mark}, {mark}, 'web', 'api', {mark}, 'n1', '[]',"
                f" 100, 64, {mark})",
                (C, w, int(w[-1]), status),
            )
        rows = [
            (1, "web/api/0", "running", None, "started ports http=1", "n1"),
            (2, "web/api/0", "running", 0.5, "cpu 5m ports http=1", "n1"),
            (3, "web/api/1", "running", 0.25, "cpu 2m", "n1"),
        ]
        for seq, w, status, cpu, message, node in rows:
            conn.execute(
                "INSERT INTO reports (cluster, seq, workload_id, status, cpu, at, message, node)"
                f" VALUES ({mark}, {mark}, {mark}, {mark}, {mark}, {mark}, {mark}, {mark})",
                (C, seq, w, status, cpu, float(seq), message, node),
            )
            if cpu is not None:
                conn.execute(
                    "INSERT INTO latest_usage (cluster, workload_id, seq, cpu, at) VALUES"
                    f" ({mark}, {mark}, {mark}, {mark}, {mark})"
                    + " ON CONFLICT (cluster, workload_id) DO NOTHING",
                    (C, w, seq, cpu, float(seq)),
                )
    finally:
        conn.close()

    store = durable_backend.open()  # migrates to the latest version
    found = store.latest_usage(C)
    assert [(r.workload_id, r.status, r.message, r.node) for r in found] == [
        ("web/api/0", "running", "cpu 5m ports http=1", "n1"),
        ("web/api/1", "running", "cpu 2m", "n1"),
    ]
    # web/api/0 runs (its binding says so): "running" again is no news; the pending
    # web/api/1 starts with no state, so its first report is
    again = [TaskReport(workload_id=w, status="running", at=4.0, node="n1") for w in WEB]
    assert store.report(C, again[:1]) == 3
    assert store.report(C, again[1:]) == 4


def test_a_database_newer_than_the_code_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "future.db"
    SqliteStore(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute("INSERT INTO schema_version (version) VALUES (?)", (LATEST_VERSION + 1,))
    conn.close()
    with pytest.raises(StoreError, match="newer than this Forge"):
        SqliteStore(path)


def _applied_versions(url: str) -> list[int]:
    if url.startswith("sqlite:"):
        with sqlite3.connect(sqlite_path(url)) as conn:
            rows = conn.execute("SELECT version FROM schema_version ORDER BY version").fetchall()
        conn.close()
        return [int(v) for (v,) in rows]
    from forge.stores.postgres import connect_postgres

    pg, _ = connect_postgres(url)
    with pg:
        return [int(v) for (v,) in pg.execute("SELECT version FROM schema_version ORDER BY 1")]


def test_migrate_on_a_plain_sqlite_connection_is_idempotent(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "plain.db", isolation_level=None)
    try:
        assert migrate(conn) == LATEST_VERSION
        assert migrate(conn) == LATEST_VERSION
        (count,) = conn.execute("SELECT count(*) FROM schema_version").fetchone()
        assert count == LATEST_VERSION
    finally:
        conn.close()


def test_two_sqlite_stores_on_one_file_see_each_others_writes(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    one, two = SqliteStore(path), SqliteStore(path)
    try:
        one.put_job(C, make_job("a"))
        assert two.get_job(C, "a") == make_job("a")
        assert two.put_job(C, make_job("b")) == 2
        two.apply_delta(C, Fence(1, 1), Delta(bind=[bound("a", "api", 0)]))
        assert [j.id for j in one.list_jobs(C)] == ["a", "b"]
        assert one.fence(C) == Fence(1, 1)
        with pytest.raises(StaleFenceError):
            one.apply_delta(C, Fence(1, 0), Delta())
    finally:
        one.close()
        two.close()


# -- open_store ------------------------------------------------------------------------


def test_open_store_memory_gives_a_fresh_store() -> None:
    store = open_store("memory://")
    assert isinstance(store, MemoryStore)
    assert migrate_url("memory://") == 0


def test_open_store_sqlite_absolute_creates_parent_directories(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "er" / "forge.db"
    store = open_store(f"sqlite:///{path}")
    try:
        assert isinstance(store, SqliteStore)
        store.put_job(C, make_job("a"))
    finally:
        store.close()
    assert path.is_file()


def test_open_store_sqlite_relative(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    store = open_store("sqlite:state/forge.db")
    store.close()
    assert (tmp_path / "state" / "forge.db").is_file()


@pytest.mark.parametrize("url", ["mysql://x/y", "forge.db", "", "sqlite:", "sqlite::memory:"])
def test_open_store_rejects_what_it_cannot_open(url: str) -> None:
    with pytest.raises(ValueError, match=r"FORGE_STORE|sqlite") as info:
        open_store(url)
    if not url.startswith("sqlite:"):
        assert "FORGE_STORE" in str(info.value)


@pytest.mark.postgres
@pytest.mark.parametrize("scheme", ["postgresql", "postgres"])
def test_open_store_postgres_accepts_both_schemes(postgres_backend: Backend, scheme: str) -> None:
    url = postgres_backend.url.replace("postgresql://", f"{scheme}://", 1)
    store = open_store(url)
    try:
        assert isinstance(store, PostgresStore)
        assert store.schema_version == LATEST_VERSION
        assert store.put_job(C, make_job("a")) == 1
    finally:
        store.close()


def test_parse_postgres_url_turns_schema_into_a_search_path() -> None:
    conninfo, schema = parse_postgres_url(
        "postgresql://u@h:5433/db?sslmode=disable&schema=forge_a&options=-cstatement_timeout%3D5s"
    )
    assert schema == "forge_a"
    assert "schema=" not in conninfo
    assert "sslmode=disable" in conninfo
    assert "-cstatement_timeout=5s -csearch_path=forge_a" in conninfo
    assert parse_postgres_url("postgres://u@h/db") == ("postgres://u@h/db", None)
    with pytest.raises(ValueError, match="schema"):
        parse_postgres_url("postgresql://u@h/db?schema=bad;drop")


def test_put_jobs_writes_a_batch_with_one_revision_each(store: Store) -> None:
    jobs = [
        Job.model_validate(
            {
                "name": f"j{i}",
                "groups": [
                    {"name": "g", "tasks": [{"name": "t", "resources": {"cpu": 1, "memory": 1}}]}
                ],
            }
        )
        for i in range(5)
    ]
    before = store.revision("batch")
    last = store.put_jobs("batch", jobs)
    assert last == before + 5 == store.revision("batch")
    page = store.job_changes("batch", before)
    assert [c.job_id for c in page.changes] == [f"j{i}" for i in range(5)]
    assert [c.revision for c in page.changes] == list(range(before + 1, last + 1))
    assert store.put_jobs("batch", []) == last


# -- group versions (rolling updates) ---------------------------------------------------


def _with_env(job: Job, **env: str) -> Job:
    g = job.groups[0]
    task = g.tasks[0].model_copy(update={"env": env})
    return job.model_copy(update={"groups": (g.model_copy(update={"tasks": (task,)}),)})


def test_each_changed_task_spec_of_a_group_is_a_new_numbered_version(store: Store) -> None:
    job = make_job("web", desired=2)
    store.put_job(C, job)
    store.put_job(C, job.with_desired("api", 3))  # scaling only: no new version
    changed = _with_env(job, COLOR="blue")
    rev = store.put_jobs(C, [changed, changed])  # the same spec twice in one batch: once
    versions = store.group_versions(C, "web")
    assert [(v.group, v.number, v.version) for v in versions] == [
        ("api", 1, job.groups[0].version),
        ("api", 2, changed.groups[0].version),
    ]
    assert versions[0].changed == "initial"
    assert versions[1].changed == "t: env"
    assert versions[1].revision == rev - 1
    assert versions[1].spec == changed.groups[0]
    assert store.group_versions(C, "other") == []
    assert store.group_versions("c2", "web") == []


def test_submitting_an_old_spec_again_is_a_new_version_with_the_old_digest(store: Store) -> None:
    job = make_job("web")
    store.put_job(C, job)
    store.put_job(C, _with_env(job, COLOR="blue"))
    store.put_job(C, job)
    numbers = [(v.number, v.version) for v in store.group_versions(C, "web")]
    assert numbers[2] == (3, numbers[0][1])
    assert store.group_versions(C, "web")[2].changed == "t: env"


def test_a_batch_of_new_and_known_jobs_numbers_each_groups_versions_in_order(
    store: Store,
) -> None:
    """One bulk write with jobs the store has versions of, new jobs, shared specs and
    a job written twice: each group's numbers go on from its own latest."""
    web = make_job("web")
    store.put_job(C, web)
    blue, green = _with_env(web, COLOR="blue"), _with_env(web, COLOR="green")
    fresh = [make_job(f"new{i}") for i in range(3)]  # one spec, three new jobs
    twice = make_job("twice")
    store.put_jobs(C, [blue, *fresh, twice, _with_env(twice, X="1"), green])
    numbers = {
        job_id: [(v.number, v.version) for v in store.group_versions(C, job_id)]
        for job_id in ("web", "new0", "new2", "twice")
    }
    assert numbers["web"] == [(1, web.groups[0].version), (2, blue.groups[0].version),
                              (3, green.groups[0].version)]  # fmt: skip
    assert numbers["new0"] == numbers["new2"] == [(1, fresh[0].groups[0].version)]
    assert [n for n, _ in numbers["twice"]] == [1, 2]
    assert store.group_versions(C, "new1")[0].changed == "initial"


def test_assignments_keep_the_version_they_run(store: Store) -> None:
    a = bound("web", "api", 0, "n1").model_copy(update={"version": "abc123"})
    plain = bound("web", "api", 1, "n1")
    delta = Delta(bind=[a, plain])
    store.apply_delta(C, Fence(1, 1), delta)
    assert all_assignments(store) == [a, plain]
    assert all_assignments(store)[0].version == "abc123"
    # a binding without a version dumps (and hashes) exactly as before versions
    assert "version" not in plain.model_dump()
    assert delta_digest(Delta(bind=[plain])) == delta_digest(
        Delta(bind=[Assignment.model_validate(plain.model_dump())])
    )


def test_completions_are_recorded_with_their_release_and_go_with_their_job(store: Store) -> None:
    store.put_job(C, make_job("b"))
    store.put_job(C, make_job("bb"))
    store.apply_delta(C, Fence(1, 1), Delta(bind=[bound("b", "api", i) for i in range(3)]))
    store.apply_delta(
        C, Fence(1, 2), Delta(release=["b/api/0", "b/api/2"], complete=["b/api/2", "b/api/0"])
    )
    assert [a.workload_id for a in store.assignments(C)] == ["b/api/1"]
    assert store.completions(C) == ["b/api/0", "b/api/2"]
    assert store.completions(C, after="b/api/0") == ["b/api/2"]
    assert store.completions(C, limit=1) == ["b/api/0"]
    # a retried persist (same fence) writes nothing twice; a later one may repeat a row
    store.apply_delta(
        C, Fence(1, 2), Delta(release=["b/api/0", "b/api/2"], complete=["b/api/2", "b/api/0"])
    )
    store.apply_delta(C, Fence(1, 3), Delta(complete=["b/api/0", "bb/api/0"]))
    assert store.completions(C) == ["b/api/0", "b/api/2", "bb/api/0"]
    assert store.completions("other") == []
    store.delete_job(C, "b")  # job "bb" shares the prefix "b", not the job
    assert store.completions(C) == ["bb/api/0"]


def test_queues_are_replaced_whole_by_a_delta_and_kept_by_one_without(store: Store) -> None:
    """The loop persists all its queues after a change (``Delta.queues``), so a run
    started afresh on the store gets them back (forge.core.quota)."""
    ml = QueueSpec.model_validate({"name": "ml", "cohort": "r", "quota": {"cpu": {"nominal": 8}}})
    cv = QueueSpec.model_validate({"name": "cv", "cohort": "r", "weight": 2})
    assert store.queues(C) == []
    store.apply_delta(C, Fence(1, 1), Delta(queues=[ml, cv]))
    assert store.queues(C) == [cv, ml]  # by name, whole specs
    store.apply_delta(C, Fence(1, 2), Delta(release=["x/g/0"]))  # queues None: unchanged
    assert store.queues(C) == [cv, ml]
    assert store.queues("other") == []
    store.apply_delta("other", Fence(1, 1), Delta(queues=[cv]))
    store.apply_delta(C, Fence(1, 3), Delta(queues=[ml]))  # cv deleted
    assert store.queues(C) == [ml] and store.queues("other") == [cv]
    store.apply_delta(C, Fence(1, 4), Delta(queues=[]))  # the last one deleted
    assert store.queues(C) == []


def test_a_jobs_reports_are_its_replicas_decisions_by_seq_and_page(store: Store) -> None:
    """``forge job runs`` reads one job's decisions (``job_reports``): not those of a
    job whose id extends it, nor usage samples; in seq order, paged."""
    store.report(
        C,
        [
            TaskReport(workload_id="b/g/0", status="running", at=1.0, node="n1"),
            TaskReport(workload_id="bb/g/0", status="running", at=1.5),
            TaskReport(workload_id="b/g/1", status="running", at=2.0),
            usage("b/g/1", 2.5, cpu=0.3),  # a sample, no decision
            TaskReport(workload_id="b/g/0", status="failed", at=3.0, exit_code=3),
            TaskReport(workload_id="b.x/g/0", status="running", at=3.5),
        ],
    )
    got = store.job_reports(C, "b", 0, 5000)
    assert [(r.workload_id, r.status, r.exit_code) for r in got] == [
        ("b/g/0", "running", None),
        ("b/g/1", "running", None),
        ("b/g/0", "failed", 3),
    ]
    assert [r.seq for r in got] == sorted(r.seq for r in got)
    assert [r.workload_id for r in store.job_reports(C, "b", after=got[0].seq, limit=1)] == [
        "b/g/1"
    ]
    assert store.job_reports("other", "b", 0, 5000) == []
