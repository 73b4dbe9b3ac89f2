"""What a periodic job's Temporal Schedule and its firing workflow exchange: the
workflow type the schedule starts, its input, and its activities' names. Renaming
any of them is a wire change (schedules already created name them)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from forge.core.models import Job

__all__ = [
    "ACT_AWAIT",
    "ACT_PRUNE",
    "ACT_STOP",
    "ACT_SUBMIT",
    "WORKFLOW_PERIODIC",
    "Firing",
    "Instance",
    "Outcome",
    "Prune",
]

WORKFLOW_PERIODIC = "ForgePeriodicJob"
ACT_SUBMIT = "forge_periodic_submit"
ACT_AWAIT = "forge_periodic_await"
ACT_STOP = "forge_periodic_stop"
ACT_PRUNE = "forge_periodic_prune"


class _Msg(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Firing(_Msg):
    """The schedule's action input: the cluster and the job as ``forge job run``
    read it (its ``schedule`` set; each firing submits a copy without it)."""

    cluster: str
    job: Job


class Instance(_Msg):
    """One instance of a periodic job, for the activities that act on it."""

    cluster: str
    job_id: str


class Prune(_Msg):
    """A finished firing's pruning: the template, and the firing's own instance."""

    cluster: str
    job: Job
    own: str


class Outcome(_Msg):
    """How an instance ended, as ``forge job wait`` would say it."""

    state: Literal["complete", "failed", "stopped"]
    what: str
