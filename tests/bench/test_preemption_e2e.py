"""The pure parts of ``python -m bench.preemption --e2e`` (the run itself needs a dev
server and a worker: it is a benchmark, run by hand): the store count it polls and
the report it prints, so neither rots unnoticed."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from bench.e2e import stored_count
from bench.preemption import e2e_report


def test_stored_count_by_node_and_by_job_prefix(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    with sqlite3.connect(db) as conn:
        conn.execute(
            "CREATE TABLE assignments (cluster TEXT, workload_id TEXT, job TEXT, node TEXT)"
        )
        conn.executemany(
            "INSERT INTO assignments VALUES (?, ?, ?, ?)",
            [
                ("c", "urgent1/g/0", "urgent1", "n1"),
                ("c", "urgent2/g/0", "urgent2", "n2"),
                ("c", "batch01/g/0", "batch01", "n1"),
                ("c", "Urgent3/g/0", "Urgent3", "n1"),  # not the prefix: case counts
                ("other", "urgent1/g/0", "urgent1", "n1"),
            ],
        )
    assert stored_count(db, "c") == 4
    assert stored_count(db, "c", "n1") == 3
    assert stored_count(db, "c", job_prefix="urgent") == 2
    assert stored_count(db, "c", "n1", job_prefix="urgent") == 1
    assert stored_count(db, "c", job_prefix="urgent%") == 0  # no LIKE wildcards


def _row(**more: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "nodes": 300, "low": 2400, "replicas": 300, "fill_seconds": 1.0, "fill_least": 1.0,
        "fill_mean": 1.0, "placed": 300, "placed_seconds": 1.3, "job_run_returned": 1.9,
        "bound": 2100, "pending": 600, "preempted": 1283, "released": 1283,
        "by": {90: 600, 40: 450, 30: 70, 20: 163}, "min_gap": 10, "task_failures": 0,
        "failure_causes": {}, "longest_task": 0.319, "longest_woken_by": "run 1: x",
        "tasks": 24, "runs": 1, "replay": [{"run": "r", "seconds": 1.3, "failure": None}],
        "problems": [],
    }  # fmt: skip
    return {**row, **more}


def test_report_met_with_the_split_of_evictions() -> None:
    text = e2e_report(_row(), "python -m bench.preemption --e2e --nodes 300 --replicas 300")
    assert "300 of 300 bound 1.3 s after the submission began" in text
    assert "1,283 replicas preempted, 600 by priority 90, 450 by priority 40" in text
    assert "settled at 2,100 bound, 600 pending" in text
    assert "evicting 600 (their victims then evicted 683 lower ones)" in text
    assert "**met**" in text and "0 violations" in text
    assert text.endswith("reproduce: nice -n 10 python -m bench.preemption --e2e "
                         "--nodes 300 --replicas 300")  # fmt: skip


def test_report_missed_when_arrivals_are_left_or_a_task_failed() -> None:
    left = e2e_report(
        _row(placed=0, preempted=0, released=0, by={}, problems=["300 of 300 not placed"]), "x"
    )
    assert "0 of 300 bound when the loop had settled" in left
    assert "**MISSED**" in left and "**300 of 300 not placed**" in left
    failed = e2e_report(_row(task_failures=1, failure_causes={"UNHANDLED_COMMAND": 1}), "x")
    assert "**MISSED**" in failed  # a benign cause still misses the target's 0
