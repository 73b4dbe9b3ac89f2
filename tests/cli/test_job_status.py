"""`forge job status JOB`: replicas per version and the rollout, from the store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from forge import cli
from forge.core.models import Assignment, AssignmentStatus
from forge.stores import SqliteStore
from forge.stores.base import Delta, Fence
from forge.wire import contract as c
from tests.cli.test_job_history import spec


def test_status_counts_replicas_per_version_and_shows_why_the_rollout_waits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "forge.db"
    store = SqliteStore(db)
    old, new = spec("1", desired=3), spec("2", desired=3)
    v1, v2 = old.groups[0].version, new.groups[0].version
    store.put_job("c1", old)
    store.put_job("c1", new)

    def bound(ordinal: int, version: str, status: AssignmentStatus) -> Assignment:
        return Assignment(
            workload_id=f"web/api/{ordinal}",
            job="web",
            group="api",
            ordinal=ordinal,
            node="n1",
            cpu=1,
            memory=1,
            status=status,
            version=version,
        )

    waiting = "canary of 1 healthy: waiting for `forge job promote`"
    doc = c.LoopStatus(
        summary=c.Summary.empty(),
        rollouts=[
            c.RolloutView(
                group="web/api",
                version=v2,
                previous=v1,
                phase="awaiting-promotion",
                waiting=waiting,
                healthy=3,
                updated=1,
            )
        ],
    )
    delta = Delta(
        bind=[
            bound(0, v1, AssignmentStatus.RUNNING),
            bound(1, v1, AssignmentStatus.PENDING),
            bound(2, v2, AssignmentStatus.RUNNING),
        ],
        status=doc.model_dump_json(),
    )
    store.apply_delta("c1", Fence(1, 1), delta)
    store.close()
    argv = ["job", "status", "web", "--store", f"sqlite:///{db}", "--cluster", "c1"]
    assert cli.main([*argv, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    (g,) = got["groups"]
    assert (g["group"], g["desired"], g["version"], g["number"]) == ("api", 3, v2, 2)
    assert [
        (v["number"], v["healthy"], v["placed"], v["desired"], v["current"]) for v in g["versions"]
    ] == [(1, 1, 2, 0, False), (2, 1, 1, 3, True)]
    assert g["rollout"]["phase"] == "awaiting-promotion"
    assert g["rollout"]["waiting"] == waiting
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "healthy 1 / placed 2 / desired 0" in out
    assert "rollout: awaiting-promotion" in out and waiting in out
    # an unknown job: NotFound, exit 1, named
    assert cli.main(["job", "status", "nope", "--store", f"sqlite:///{db}", "--cluster", "c1"]) == 1
    assert "forge: no job 'nope' in cluster c1" in capsys.readouterr().err


def test_an_empty_rollout_list_is_left_out_of_the_published_json() -> None:
    doc = c.LoopStatus(summary=c.Summary.empty())
    assert "rollouts" not in doc.model_dump_json()
    assert c.LoopStatus.model_validate_json(doc.model_dump_json()) == doc
