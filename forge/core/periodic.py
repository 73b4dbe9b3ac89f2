"""Periodic batch jobs: a job with a ``schedule`` is not run by the loop itself but
by a Temporal Schedule that submits one *instance* of it per firing.

Why a Temporal Schedule rather than a timer in the cluster workflow: the schedule is
then listed, paused, triggered and backfilled where operators already look (the Web
UI's Schedules page, ``temporal schedule ...``), its catch-up after an outage is the
server's, and the cluster workflow's history holds nothing per firing but the
instance's submission (``workflows/periodic.py`` fires; ``forge/client/periodic.py``
creates and removes the schedule).

Semantics follow a Kubernetes CronJob, which Nomad's ``periodic`` block agrees with
where both have the knob: ``concurrency`` is the CronJob's ``concurrencyPolicy``
(Nomad's ``prohibit_overlap`` is ``forbid``), ``keep`` its history limit, and
``catch_up`` its ``startingDeadlineSeconds``: a firing that could not start within
it (the worker was down) is skipped, so an outage never turns into a burst.

This module is pure: the spec, its checks and the names of instances.
"""

from __future__ import annotations

import re
import zoneinfo
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Literal

from pydantic import Field, field_validator

from forge.core.fields import Model

__all__ = [
    "INSTANCE_SUFFIX",
    "MAX_TEMPLATE_NAME",
    "Schedule",
    "check_cron",
    "check_periodic",
    "instance_id",
    "instances",
    "not_submittable",
    "to_remove",
]

#: ``-YYYYMMDDHHMMSS`` (UTC) of the firing: sortable, and a firing submitted twice
#: (its activity retried) is one instance; a trigger a second later is another.
INSTANCE_SUFFIX = len("-20261206030000")
#: A job name is at most 63 characters; its instances' add the suffix.
MAX_TEMPLATE_NAME = 63 - INSTANCE_SUFFIX

_MACROS = ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly")
_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_DAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
#: (field name, lowest, highest, names of the values from lowest)
_FIELDS: tuple[tuple[str, int, int, tuple[str, ...]], ...] = (
    ("minute", 0, 59, ()),
    ("hour", 0, 23, ()),
    ("day of month", 1, 31, ()),
    ("month", 1, 12, _MONTHS),
    ("day of week", 0, 6, _DAYS),
)
_ITEM = re.compile(r"^(?P<base>\*|[A-Za-z0-9]+(?:-[A-Za-z0-9]+)?)(?:/(?P<step>[0-9]+))?$")


class Schedule(Model):
    """When a periodic batch job runs (``schedule:`` in a job file)."""

    #: Five fields (minute hour day-of-month month day-of-week) or a macro
    #: (``@daily``, ``@hourly``, ...), read in ``timezone``.
    cron: str = Field(max_length=200)
    #: An IANA zone name: ``0 3 * * *`` in ``Europe/Berlin`` stays at 03:00 local
    #: across daylight-saving changes.
    timezone: str = "UTC"
    #: When a firing finds the previous instance still running: ``allow`` runs both,
    #: ``forbid`` skips the new firing, ``replace`` stops the running instance first.
    concurrency: Literal["allow", "forbid", "replace"] = "allow"
    #: How many finished instances (their records) are kept; older ones are stopped.
    keep: int = Field(default=3, ge=0, le=100)
    #: Seconds after its time a firing may still start; a later one is skipped (the
    #: server's catch-up window too), so an outage never becomes a burst of runs.
    catch_up: float = Field(default=300.0, ge=10.0, le=7 * 86400.0)

    @field_validator("cron")
    @classmethod
    def _cron(cls, value: str) -> str:
        problem = check_cron(value)
        if problem:
            raise ValueError(problem)
        return " ".join(value.split())

    @field_validator("timezone")
    @classmethod
    def _zone(cls, value: str) -> str:
        try:
            zoneinfo.ZoneInfo(value)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError) as err:
            zone = f"unknown time zone {value!r}: an IANA name, e.g. Europe/Berlin"
            raise ValueError(zone) from err
        return value


def check_cron(expr: str) -> str:
    """Why ``expr`` is not a cron expression the Temporal server reads ("" when it is)."""
    fields = expr.split()
    if len(fields) == 1 and fields[0].startswith("@"):
        return "" if fields[0].lower() in _MACROS else f"unknown macro {fields[0]!r}"
    if len(fields) != 5:
        return (
            f"{expr!r} has {len(fields)} fields; a cron expression has 5 (minute hour "
            "day-of-month month day-of-week), e.g. '0 3 * * *', or a macro such as @daily"
        )
    for text, (name, low, high, names) in zip(fields, _FIELDS, strict=True):
        for item in text.split(","):
            problem = _check_item(item, low, high, names)
            if problem:
                return f"{name} {text!r}: {problem}"
    return ""


def _check_item(item: str, low: int, high: int, names: tuple[str, ...]) -> str:
    m = _ITEM.match(item)
    if m is None:
        return f"{item!r} is not *, N, N-M or one of them with /STEP"
    if m["step"] is not None and int(m["step"]) < 1:
        return "a step is at least 1"
    if m["base"] == "*":
        return ""
    ends = []
    for part in m["base"].split("-"):
        value = _value(part, low, names)
        if value is None or not low <= value <= high:
            return f"{part!r} is not in {low}-{high}" + (
                f" or {names[0]}-{names[-1]}" if names else ""
            )
        ends.append(value)
    if len(ends) == 2 and ends[0] > ends[1]:
        return f"the range {m['base']!r} runs backwards"
    return ""


def _value(part: str, low: int, names: tuple[str, ...]) -> int | None:
    if part.isdigit():
        return int(part)
    lowered = part.lower()
    return names.index(lowered) + low if lowered in names else None


def check_periodic(name: str, job_type: str, schedule: Schedule | None) -> None:
    """A schedule fits batch work only, and its instances' names must stay names."""
    if schedule is None:
        return
    if job_type != "batch":
        raise ValueError(
            "schedule: only a batch job (type: batch) runs on a schedule; a "
            f"{job_type} job runs until stopped"
        )
    if len(name) > MAX_TEMPLATE_NAME:
        raise ValueError(
            f"name: a periodic job's name is at most {MAX_TEMPLATE_NAME} characters "
            f"(its instances are named NAME{'-YYYYMMDDHHMMSS'})"
        )


def not_submittable(job_id: str, schedule: Schedule | None) -> list[tuple[str, str]]:
    """Why the loop refuses ``job_id`` as submitted: a periodic job is a Temporal
    Schedule's template, never run by the loop itself (else a raw client's
    ``submit_job`` would run it once and ignore its schedule)."""
    if schedule is None:
        return []
    return [
        (
            "schedule",
            "a periodic job is created as a Temporal Schedule (forge job run FILE, or "
            "forge.client.periodic.apply_schedule), not submitted to the cluster workflow",
        )
    ]


def instance_id(job_id: str, fired: datetime) -> str:
    """The id of the instance a firing at ``fired`` submits (its UTC second)."""
    return f"{job_id}-{fired.astimezone(UTC):%Y%m%d%H%M%S}"


def instances(job_id: str, ids: Iterable[str]) -> list[str]:
    """The ids among ``ids`` that are instances of ``job_id``, oldest first."""
    pattern = re.compile(re.escape(job_id) + r"-[0-9]{14}")
    return sorted(i for i in ids if pattern.fullmatch(i))


def to_remove(finished: Iterable[str], keep: int) -> list[str]:
    """The finished instances past the newest ``keep`` (ids sort by firing time)."""
    ordered = sorted(finished)
    return ordered[: max(0, len(ordered) - keep)]
