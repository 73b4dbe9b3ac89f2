"""``forge status`` from an SQLite store's rows (:mod:`forge.client.status_rows`)
prints exactly what the ordinary read through the store and the models prints, text
and JSON, GPUs, shares and a binding that no longer fits included; and it steps
aside (None) whenever it cannot vouch for that."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from forge import render
from forge.client import reads, status_rows
from forge.core.models import Assignment, AssignmentStatus, Node
from forge.core.quota import QueueSpec
from forge.stores import SqliteStore, TaskReport
from forge.stores.base import Delta, Fence
from forge.stores.migrations import LATEST_VERSION
from forge.stores.sqlite import sqlite_path
from forge.wire import contract as c
from forge.wire.queues import QueueView

CLUSTER = "c1"


def _node(i: int, *, cpu: int = 8000, gpus: int = 0, state: str = "ready") -> Node:
    return Node.model_validate(
        {
            "id": f"n{i:02d}",
            "cpu": cpu,
            "memory": 16384,
            "gpus": [{"id": f"g{k}", "model": "A100", "memory": 40960} for k in range(gpus)],
            "state": state,
        }
    )


def _bound(
    job: str, i: int, node: str, *, cpu: int = 1000, gpu_ids: tuple[str, ...] = (), milli: int = 0
) -> Assignment:
    return Assignment(
        workload_id=f"{job}/main/{i}",
        job=job,
        group="main",
        ordinal=i,
        node=node,
        gpu_ids=gpu_ids,
        cpu=cpu,
        memory=1024,
        status=AssignmentStatus.RUNNING if i % 2 else AssignmentStatus.PENDING,
        gpu_milli=milli,
    )


def _status_doc() -> str:
    summary = c.Summary(
        desired=30,
        bound=22,
        pending=8,
        nodes=60,
        jobs=4,
        passes=7,
        generation=2,
        last_pass_at=1.5,
        last_pass="pass 7: +3 placed, -1 released, 8 pending",
    )
    pending = [
        c.PendingView(
            workload_id=f"big/main/{i}",
            reasons=["0/60 nodes available: 57 insufficient cpu, 3 insufficient memory"],
            kind="unplaceable",
            attempts=i,
            not_before=0.0,
        )
        for i in range(8)
    ]
    doc = c.LoopStatus(summary=summary, pending=pending, notices=["1 signal(s) dropped; last: x"])
    ml = QueueSpec.model_validate(
        {
            "name": "ml",
            "cohort": "research",
            "quota": {"cpu": {"nominal": 4000}, "gpu": {"A100": {"nominal": 2}}},
        }
    )
    queue = QueueView(spec=ml, usage={"cpu": 3000, "gpu:A100": 2300}, bound=6, queued=2)
    return doc.model_copy(update={"preemptions": 3, "queues": [queue]}).model_dump_json()


def _store(path: Path, *, status: bool = True) -> str:
    """60 nodes (GPU ones, a draining and a lost one), bindings on most, whole GPUs,
    shares of one device, a binding on a node that is gone and one that no longer
    fits its node (the node shrank after it was bound)."""
    store = SqliteStore(path)
    nodes = [_node(i, gpus=4 if i % 5 == 0 else 0) for i in range(60)]
    nodes[7] = _node(7, state="draining")
    nodes[8] = _node(8, state="lost")
    bound = [_bound("web", i, f"n{i % 50:02d}") for i in range(40)]
    bound += [_bound("gpu", i, "n05", gpu_ids=(f"g{i}",)) for i in range(3)]
    bound += [_bound("share", i, "n10", gpu_ids=("g0",), milli=300) for i in range(3)]
    bound += [_bound("share2", 0, "n10", gpu_ids=("g1",), milli=500)]
    bound += [_bound("ghost", 0, "n99")]
    bound += [_bound("fat", i, "n03", cpu=3000) for i in range(3)]
    doc = _status_doc() if status else None
    store.apply_delta(CLUSTER, Fence(1, 1), Delta(nodes_upsert=nodes, bind=bound, status=doc))
    shrunk = _node(3, cpu=5000)  # web/main/3 (1000) + fat (3 x 3000) no longer all fit
    store.apply_delta(CLUSTER, Fence(1, 2), Delta(nodes_upsert=[shrunk]))
    store.close()
    return f"sqlite:///{path}"


def _ordinary(url: str) -> tuple[c.StatusView, list[c.AssignmentView]]:
    store = SqliteStore(sqlite_path(url))
    try:
        found = reads.all_assignments(store, CLUSTER)
        return reads.status(store, CLUSTER, found), reads.assignment_views(found)
    finally:
        store.close()


@pytest.mark.parametrize("status", [True, False], ids=["published", "nothing-published"])
def test_the_rows_print_what_the_models_print(tmp_path: Path, status: bool) -> None:
    url = _store(tmp_path / "forge.db", status=status)
    view, listed = _ordinary(url)
    rows = status_rows.read(url, CLUSTER, bindings=True)
    assert rows is not None
    fast = rows  # the renderers read the same attributes
    assert render.status_text(CLUSTER, fast, {}) == render.status_text(CLUSTER, view, {})  # type: ignore[arg-type]
    fast_json = render.status_json(fast, rows.assignments, {})  # type: ignore[arg-type]
    assert json.dumps(fast_json) == json.dumps(render.status_json(view, listed, {}))
    # the cases the accounting must get right are really there
    by_id = {n["id"]: n for n in fast_json["nodes"]}
    assert by_id["n05"]["gpus"] == {"total": 4, "allocated": 3}
    assert by_id["n10"]["gpus"] == {"total": 4, "allocated": 2}  # shares of g0, one of g1
    assert by_id["n03"]["cpu"]["allocated"] < 1000 + 3 * 3000  # one no longer fits
    assert by_id["n07"]["state"] == "draining" and by_id["n08"]["state"] == "lost"
    if status:  # a queue's rows, in the units its quota counts (GPUs as devices)
        text = render.status_text(CLUSTER, fast, {})  # type: ignore[arg-type]
        rows_shown = [line.split() for line in text.splitlines()]
        assert ["ml", "research", "cpu", "3000", "4000", "6", "2"] in rows_shown
        assert ["gpu", "A100", "2.3", "2"] in rows_shown
        assert fast_json["queues"][0]["usage"] == {"cpu": 3000, "gpu:A100": 2300}


def test_without_listing_the_bindings_the_counts_are_the_same(tmp_path: Path) -> None:
    url = _store(tmp_path / "forge.db")
    view, _ = _ordinary(url)
    rows = status_rows.read(url, CLUSTER)
    assert rows is not None and rows.assignments == []
    assert render.status_text(CLUSTER, rows, {}) == render.status_text(CLUSTER, view, {})  # type: ignore[arg-type]


def test_it_steps_aside_when_it_cannot_vouch_for_the_answer(tmp_path: Path) -> None:
    url = _store(tmp_path / "forge.db")
    assert status_rows.read(url, "other-cluster") is not None  # empty, but readable
    assert status_rows.read("memory://", CLUSTER) is None
    assert status_rows.read("postgresql://u@h/db", CLUSTER) is None
    assert status_rows.read(f"sqlite:///{tmp_path / 'missing.db'}", CLUSTER) is None
    assert not (tmp_path / "missing.db").exists()  # read-only: never creates a store
    # agents report usage: the ordinary path shows it
    store = SqliteStore(tmp_path / "forge.db")
    store.report(
        CLUSTER,
        [TaskReport(workload_id="web/main/1", status="running", cpu=0.5, memory=0.5, at=1.0)],
    )
    store.close()
    assert status_rows.read(url, CLUSTER) is None
    # a schema of another version (older: the ordinary path migrates; newer: refuses)
    url2 = _store(tmp_path / "other.db")
    with sqlite3.connect(tmp_path / "other.db") as conn:
        conn.execute("INSERT INTO schema_version (version) VALUES (?)", (LATEST_VERSION + 1,))
    assert status_rows.read(url2, CLUSTER) is None


def test_it_knows_the_schema_and_the_urls_the_store_knows() -> None:
    assert status_rows.SCHEMA_VERSION == LATEST_VERSION, (
        "a new migration: check forge/client/status_rows.py's queries, then bump it"
    )
    for url in ("sqlite:///abs/forge.db", "sqlite:rel.db", "sqlite://rel.db", "sqlite:x.db?a=1"):
        assert status_rows.sqlite_file(url) == sqlite_path(url), url
    for url in ("sqlite:", "sqlite://:memory:", "memory://", "postgresql://h/db"):
        assert status_rows.sqlite_file(url) is None, url
