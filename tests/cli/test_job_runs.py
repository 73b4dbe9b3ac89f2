"""`forge job runs JOB`: each run's attempts, last start and end, exit status and node,
from the agents' decisions in the store (forge.client.runs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from forge import cli
from forge.client.runs import fold, table
from forge.core.models import Assignment, Job
from forge.stores import Delta, Fence, SqliteStore, TaskReport


def batch(name: str, runs: int) -> Job:
    task = {"name": "t", "command": ["true"], "resources": {"cpu": 1, "memory": 1}}
    group = {"name": "g", "scaling": {"max": runs, "desired": runs}, "tasks": [task]}
    return Job.model_validate({"name": name, "type": "batch", "groups": [group]})


def said(wid: str, status: str, at: float, node: str = "n1", code: int | None = None) -> TaskReport:
    return TaskReport(
        workload_id=wid, status=status, at=at, node=node, message=f"{status} {code}",
        exit_code=code,
    )  # fmt: skip


def test_a_runs_attempts_start_end_and_exit_are_folded_from_its_decisions() -> None:
    job = batch("b", 4)
    reports = [
        said("b/g/0", "running", 10.0),
        said("b/g/1", "running", 11.0),
        said("b/g/0", "failed", 12.0, code=3),
        said("b/g/0", "running", 20.0, node="n2"),
        said("b/g/0", "exited", 25.5, node="n2", code=0),
    ]
    got = {r.workload_id: r for r in fold(job, reports, {"b/g/0"}, {"b/g/1", "b/g/2"})}
    done = got["b/g/0"]
    assert (done.state, done.attempts, done.started, done.finished) == ("complete", 2, 20.0, 25.5)
    assert (done.exit_code, done.node) == (0, "n2")
    running = got["b/g/1"]
    assert (running.state, running.attempts, running.finished) == ("running", 1, None)
    assert (got["b/g/2"].state, got["b/g/2"].attempts) == ("bound", 0)  # placed, not started
    assert (got["b/g/3"].state, got["b/g/3"].started) == ("pending", None)
    out = table(list(got.values()))
    assert out.splitlines()[0].split() == [
        "RUN", "STATE", "ATTEMPTS", "STARTED", "FINISHED", "RAN", "EXIT", "NODE",
    ]  # fmt: skip
    assert "5.5s" in out.splitlines()[1] and out.splitlines()[1].split()[-2:] == ["0", "n2"]


def test_a_failed_end_not_retried_yet_says_failed_with_its_status() -> None:
    job = batch("b", 1)
    (run,) = fold(
        job, [said("b/g/0", "running", 1.0), said("b/g/0", "failed", 2.0, code=42)], set(), set()
    )
    assert (run.state, run.exit_code, run.attempts) == ("failed", 42, 1)


def test_job_runs_reads_the_store_of_only_that_job(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "forge.db"
    store = SqliteStore(db)
    for job in (batch("b", 2), batch("bb", 1)):
        store.put_job("c1", job)
    bind = [
        Assignment(workload_id=w, job=w.split("/")[0], group="g", ordinal=int(w[-1]), node="n1",
                   cpu=1, memory=1)
        for w in ("b/g/0", "b/g/1", "bb/g/0")
    ]  # fmt: skip
    store.apply_delta("c1", Fence(1, 1), Delta(bind=bind))
    store.report("c1", [said("b/g/0", "running", 1.0), said("bb/g/0", "running", 1.5)])
    store.report("c1", [said("b/g/0", "exited", 3.0, code=0)])
    store.apply_delta("c1", Fence(1, 2), Delta(release=["b/g/0"], complete=["b/g/0"]))
    store.close()
    argv = ["job", "runs", "b", "--store", f"sqlite:///{db}", "--cluster", "c1"]
    assert cli.main([*argv, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["workload_id"], r["state"], r["attempts"], r["exit_code"]) for r in rows] == [
        ("b/g/0", "complete", 1, 0),
        ("b/g/1", "bound", 0, None),
    ]
    assert cli.main(argv) == 0
    assert "b/g/0" in capsys.readouterr().out
    assert cli.main(["job", "runs", "nope", "--store", f"sqlite:///{db}", "--cluster", "c1"]) != 0
    assert "no job 'nope'" in capsys.readouterr().err
