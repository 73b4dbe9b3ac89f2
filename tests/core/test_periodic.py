"""Periodic jobs' spec (issue 32): the cron check accepts what the Temporal server
reads and names the field of what it does not; a schedule fits a batch job only;
instances are named by their firing's UTC second and pruned oldest first."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from forge.core.models import Job
from forge.core.periodic import (
    MAX_TEMPLATE_NAME,
    Schedule,
    check_cron,
    instance_id,
    instances,
    not_submittable,
    to_remove,
)


def _job(**over: Any) -> dict[str, Any]:
    return {
        "name": "nightly",
        "type": "batch",
        "schedule": {"cron": "0 3 * * *"},
        "groups": [{"name": "g", "tasks": [{"name": "t", "resources": {"cpu": 1, "memory": 1}}]}],
        **over,
    }


@pytest.mark.parametrize(
    "expr",
    [
        "0 3 * * *",
        "*/15 * * * *",
        "0 0-23/2 * * *",
        "5,35 9-17 * * mon-fri",
        "0 3 1 jan,JUL *",
        "59 23 31 12 6",
        "0 0 1-7 * SUN",
        "@daily",
        "@Hourly",
        "  0   3 * *   *  ",
    ],
)
def test_cron_expressions_the_server_reads_are_accepted(expr: str) -> None:
    assert check_cron(expr) == ""
    assert Schedule(cron=expr).cron == " ".join(expr.split())


@pytest.mark.parametrize(
    ("expr", "said"),
    [
        ("0 3 * *", "has 4 fields"),
        ("0 3 * * * *", "has 6 fields"),
        ("", "has 0 fields"),
        ("60 * * * *", "minute '60': '60' is not in 0-59"),
        ("0 24 * * *", "hour '24'"),
        ("0 0 0 * *", "day of month '0'"),
        ("0 0 * 13 *", "month '13': '13' is not in 1-12 or jan-dec"),
        ("0 0 * * 7", "day of week '7': '7' is not in 0-6 or sun-sat"),
        ("0 0 * * funday", "day of week 'funday'"),
        ("*/0 * * * *", "a step is at least 1"),
        ("5-1 * * * *", "the range '5-1' runs backwards"),
        ("1,,2 * * * *", "'' is not *, N, N-M"),
        ("? * * * *", "'?' is not *, N, N-M"),
        ("@fortnightly", "unknown macro '@fortnightly'"),
    ],
)
def test_a_bad_cron_expression_is_named_with_its_field(expr: str, said: str) -> None:
    assert said in check_cron(expr)
    with pytest.raises(ValidationError, match=r"schedule\.cron") as err:
        Job.model_validate(_job(schedule={"cron": expr}))
    assert said in str(err.value)


@st.composite
def _items(draw: st.DrawFn, low: int, high: int) -> str:
    a = draw(st.integers(low, high))
    b = draw(st.integers(a, high))
    base = draw(st.sampled_from(["*", str(a), f"{a}-{b}"]))
    step = draw(st.none() | st.integers(1, 60))
    return base if step is None else f"{base}/{step}"


@given(st.data())
def test_every_well_formed_expression_is_accepted(data: st.DataObject) -> None:
    fields = []
    for low, high in [(0, 59), (0, 23), (1, 31), (1, 12), (0, 6)]:
        items = data.draw(st.lists(_items(low, high), min_size=1, max_size=3))
        fields.append(",".join(items))
    assert check_cron(" ".join(fields)) == ""


@given(st.integers(0, 4), st.integers(-5, 100))
def test_a_value_outside_its_field_is_refused(index: int, value: int) -> None:
    low, high = [(0, 59), (0, 23), (1, 31), (1, 12), (0, 6)][index]
    fields = ["*"] * 5
    fields[index] = str(value)
    ok = low <= value <= high
    assert (check_cron(" ".join(fields)) == "") == ok


def test_a_schedule_is_checked_field_by_field() -> None:
    with pytest.raises(ValidationError, match=r"schedule\.timezone") as err:
        Job.model_validate(_job(schedule={"cron": "@daily", "timezone": "Mars/Olympus"}))
    assert "unknown time zone 'Mars/Olympus'" in str(err.value)
    for field, value in [("keep", -1), ("catch_up", 1.0), ("concurrency", "queue")]:
        with pytest.raises(ValidationError, match=f"schedule.{field}"):
            Job.model_validate(_job(schedule={"cron": "@daily", field: value}))
    job = Job.model_validate(_job(schedule={"cron": "0 3 * * *", "timezone": "Europe/Berlin"}))
    assert job.schedule == Schedule(cron="0 3 * * *", timezone="Europe/Berlin")
    assert (job.schedule.concurrency, job.schedule.keep) == ("allow", 3)


def test_only_a_batch_job_runs_on_a_schedule_and_its_name_leaves_room() -> None:
    with pytest.raises(ValidationError, match="schedule: only a batch job"):
        Job.model_validate(_job(type="service"))
    with pytest.raises(ValidationError, match="schedule: only a batch job"):
        Job.model_validate({k: v for k, v in _job().items() if k != "type"})
    with pytest.raises(ValidationError, match=f"name: .* at most {MAX_TEMPLATE_NAME}"):
        Job.model_validate(_job(name="n" * (MAX_TEMPLATE_NAME + 1)))
    longest = Job.model_validate(_job(name="n" * MAX_TEMPLATE_NAME))
    name = instance_id(longest.id, datetime(2026, 12, 6, tzinfo=UTC))
    assert len(name) == 63
    Job.model_validate({**_job(name=name), "schedule": None})  # an instance is a job


def test_a_job_without_a_schedule_dumps_as_before() -> None:
    plain = Job.model_validate({**_job(), "schedule": None})
    assert "schedule" not in plain.model_dump()
    assert Job.model_validate(_job()).model_dump()["schedule"]["cron"] == "0 3 * * *"


def test_the_loop_refuses_a_periodic_job_and_names_the_field() -> None:
    job = Job.model_validate(_job())
    [(where, why)] = not_submittable(job.id, job.schedule)
    assert where == "schedule" and "Temporal Schedule" in why
    assert not_submittable(job.id, None) == []


def test_an_instance_is_named_by_its_firings_utc_second() -> None:
    berlin = timezone(timedelta(hours=1))
    assert instance_id("nightly", datetime(2026, 12, 6, 3, 0, 5, tzinfo=berlin)) == (
        "nightly-20261206020005"
    )
    ids = [
        "nightly-20261206020005",
        "nightly-20261205020000",
        "nightly",
        "nightly-eval-20261205020000",
        "nightly-2026120502000",
        "other-20261205020000",
    ]
    assert instances("nightly", ids) == ["nightly-20261205020000", "nightly-20261206020005"]


@given(st.lists(st.integers(0, 10**6), unique=True, max_size=20), st.integers(0, 25))
def test_pruning_keeps_the_newest(seconds: list[int], keep: int) -> None:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    names = [instance_id("j", start + timedelta(seconds=s)) for s in seconds]
    gone = to_remove(names, keep)
    kept = sorted(set(names) - set(gone))
    assert len(kept) == min(keep, len(names))
    assert all(g < k for g in gone for k in kept)  # every one removed is older
