"""`forge job history JOB`: a group's versions and what each changed, from the store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from forge import cli
from forge.core.models import Job
from forge.stores import SqliteStore


def spec(env: str, desired: int = 2) -> Job:
    return Job.model_validate(
        {
            "name": "web",
            "groups": [
                {
                    "name": "api",
                    "scaling": {"max": 5, "desired": desired},
                    "tasks": [
                        {"name": "t", "env": {"V": env}, "resources": {"cpu": 1, "memory": 1}}
                    ],
                }
            ],
        }
    )


def test_history_lists_each_version_with_what_changed_and_marks_the_current(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "forge.db"
    store = SqliteStore(db)
    for job in (spec("1"), spec("1", desired=3), spec("2"), spec("1")):
        store.put_job("c1", job)
    store.close()
    argv = ["job", "history", "web", "--store", f"sqlite:///{db}", "--cluster", "c1"]
    assert cli.main([*argv, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["number"], r["changed"], r["current"]) for r in rows] == [
        (1, "initial", True),
        (2, "t: env", False),
        (3, "t: env", True),
    ]
    assert rows[0]["version"] == rows[2]["version"] == spec("1").groups[0].version
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "v2" in out and "t: env" in out
