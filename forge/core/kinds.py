"""Kinds of work: what the end of a replica means, by its job's ``type``.

The loop hears a replica's end from its agent as ``failed`` (a task exited
non-zero, could not start, or was killed) or ``exited`` (every task exited 0). What
follows is the kind's rule, kept here rather than in the loop:

* ``service`` (Nomad's service, a Kubernetes Deployment): work that should never
  end, so any end is a failure, restarted under the group's ``reschedule`` policy;
* ``batch`` (Nomad's batch, a Kubernetes indexed Job): an ordinal whose tasks all
  exited 0 is **complete**: its binding is released at once and it is never placed
  again (:mod:`forge.core.reconcile` takes the done ordinals); a non-zero exit is a
  failure, retried under ``reschedule`` like a service's, unless its exit status
  is in ``reschedule.fail_on_exit`` (:func:`fatal`): then the job fails at once. A
  gang completes whole: its members that exited 0 keep their place until every
  member has.

A batch job's groups neither autoscale nor roll (there is nothing to keep serving
while an update rolls): :func:`check_batch` refuses ``autoscale`` and ``update``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Protocol

__all__ = [
    "BATCH_RESCHEDULE",
    "JOB_TYPES",
    "Ending",
    "JobPhase",
    "JobType",
    "check_batch",
    "check_kind",
    "ending",
    "fatal",
    "kind_defaults",
    "phase",
]

JobType = Literal["service", "batch"]
JOB_TYPES: tuple[JobType, ...] = ("service", "batch")

#: What a replica's end is to the loop.
Ending = Literal["failed", "complete"]


def ending(job_type: str, status: str) -> Ending | None:
    """The meaning of an agent's ``status`` for a replica of a job of ``job_type``;
    None: it has not ended (``running``)."""
    if status == "failed":
        return "failed"
    if status == "exited":
        return "complete" if job_type == "batch" else "failed"
    return None


#: Where a batch job stands: every run complete, failed for good, or neither yet.
JobPhase = Literal["running", "complete", "failed"]


def phase(
    desired: int, complete: int, failed: str | None, tolerated: int = 0
) -> tuple[JobPhase, str]:
    """A batch job's phase and the line that says it (``forge job wait``, ``forge job
    list``, the ``job_state`` query: one rule, read from the store or from the loop).
    ``failed`` is why the loop failed it for good (None: it has not); a failed job
    stays failed even with every run complete (the failure ended it first).
    ``tolerated`` runs failed for good within their group's ``scaling.max_failed``: the job
    completes once the others have."""
    what = f"{complete}/{desired} runs complete"
    if tolerated:
        what += f", {tolerated} failed within scaling.max_failed"
    if failed is not None:
        return "failed", f"{what}; {failed}"
    return ("complete" if complete + tolerated >= desired else "running"), what


def fatal(job_type: str, fail_on_exit: tuple[int, ...], exit_code: int | None) -> str:
    """Why a failed replica's end fails its job for good rather than being retried
    ("" when it does not): a batch group's ``reschedule.fail_on_exit`` lists its
    exit status. An end without a known status (killed, lost, a failed start) is
    never fatal: only the task's own verdict is."""
    if job_type != "batch" or exit_code is None or exit_code not in fail_on_exit:
        return ""
    return f"exit status {exit_code} is in reschedule.fail_on_exit: not retried"


class _Scaling(Protocol):
    @property
    def parallelism(self) -> int | None: ...
    @property
    def max_failed(self) -> int: ...


class _Reschedule(Protocol):
    @property
    def fail_on_exit(self) -> tuple[int, ...]: ...


class _Group(Protocol):
    """What :func:`check_kind` reads of a task group (models import this module)."""

    @property
    def name(self) -> str: ...
    @property
    def autoscale(self) -> object | None: ...
    @property
    def update(self) -> object | None: ...
    @property
    def gang(self) -> bool: ...
    @property
    def scaling(self) -> _Scaling: ...
    @property
    def reschedule(self) -> _Reschedule: ...


#: A batch group's ``reschedule`` when it sets none: Nomad's batch defaults (one
#: retry within a day, after 5 s). A service's (3 an hour, exponential) suits work
#: that must stay up; a run that failed twice has most likely failed for a reason.
BATCH_RESCHEDULE = {"attempts": 1, "interval": 86400.0, "delay": 5.0, "delay_function": "constant"}


def kind_defaults(data: object) -> object:
    """A job's raw fields with its kind's defaults filled in (before validation, so
    the stored spec says what applies): what a batch group's ``reschedule`` leaves
    out comes from :data:`BATCH_RESCHEDULE`, field by field as in Nomad."""
    if not isinstance(data, dict) or data.get("type") != "batch":
        return data
    groups = data.get("groups")
    if not isinstance(groups, list | tuple):
        return data  # the model's own error names it
    filled = [
        {**g, "reschedule": {**BATCH_RESCHEDULE, **(g.get("reschedule") or {})}}
        if isinstance(g, dict) and isinstance(g.get("reschedule") or {}, dict)
        else g
        for g in groups
    ]
    return {**data, "groups": filled}


def check_kind(
    job_type: str,
    groups: Sequence[_Group],
    active_deadline: float | None = None,
    ttl_after_finished: float | None = None,
) -> None:
    """Refuse what a job of ``job_type`` cannot have, naming the field: a batch
    group's autoscale, update, or parallelism on a gang (its members run together);
    parallelism on a service (it keeps every replica up); a service's deadline or
    time to live after it finishes (it never does)."""
    for name, value in (
        ("active_deadline", active_deadline),
        ("ttl_after_finished", ttl_after_finished),
    ):
        if value is not None and job_type != "batch":
            raise ValueError(f"{name}: only a batch job ends; a service runs until stopped")
    for i, g in enumerate(groups):
        if g.scaling.max_failed and (job_type != "batch" or g.gang):
            raise ValueError(
                f"groups.{i}.scaling.max_failed ({g.name}): only a batch group's runs fail "
                "for good one by one (a service restarts them; a gang runs all or none)"
            )
        if g.reschedule.fail_on_exit and job_type != "batch":
            raise ValueError(
                f"groups.{i}.reschedule.fail_on_exit ({g.name}): only a batch job fails "
                "for good; a service's replicas are restarted whatever their exit status"
            )
        if g.scaling.parallelism is None:
            continue
        if job_type != "batch":
            raise ValueError(
                f"groups.{i}.scaling.parallelism ({g.name}): only a batch job limits how "
                "many of its runs are bound at once"
            )
        if g.gang:
            raise ValueError(
                f"groups.{i}.scaling.parallelism ({g.name}): a gang's members run "
                "together, all or none"
            )
    if job_type == "batch":
        check_batch(groups)


def check_batch(groups: Sequence[_Group]) -> None:
    """Refuse what a batch job's groups cannot have, naming the field."""
    for i, g in enumerate(groups):
        if g.autoscale is not None:
            raise ValueError(
                f"groups.{i}.autoscale ({g.name}): a batch job does not autoscale; its "
                "replicas run to completion (set scaling.desired to the number of runs)"
            )
        if g.update is not None:
            raise ValueError(
                f"groups.{i}.update ({g.name}): a batch job does not roll updates; a "
                "changed spec applies to the runs not yet complete"
            )
