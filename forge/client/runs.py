"""A job's runs as its agents reported them (``forge job runs``): for each replica,
how many times it started, when its last attempt started and ended, its exit status,
where it ran, and where it stands.

Read from the store alone: the decisions the agents reported (a start is a
``running`` decision, an end an ``exited`` or ``failed`` one, with the exit status
the task's shim kept: ``forge.agent.shim``), the completions the loop recorded with
the release of a batch run, and the bindings. Times are the agents' clocks. Bounded
by the job: its reports are read by workload id (``Store.job_reports``), page by
page.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass

from forge.core.models import Job, workload_id
from forge.stores.base import Store, TaskReport

__all__ = ["Run", "as_json", "fold", "read", "table"]

PAGE = 5000


@dataclass(frozen=True, slots=True)
class Run:
    workload_id: str
    #: complete (a batch run recorded done), running, exited / failed (its last end,
    #: not complete: waiting for a retry, a gang's other members, or failed for good),
    #: bound (placed, not reported yet) or pending (not placed)
    state: str
    attempts: int  # starts reported
    started: float | None  # the last attempt's start
    finished: float | None  # the last attempt's end, if it ended
    exit_code: int | None  # the last end's exit status (negative: a signal)
    node: str
    message: str  # the last decision's message


@dataclass(slots=True)
class _Seen:
    """What a run's decisions said so far (folded in seq order)."""

    status: str = ""
    attempts: int = 0
    started: float | None = None
    finished: float | None = None
    exit_code: int | None = None
    node: str = ""
    message: str = ""


def fold(job: Job, reports: Iterable[TaskReport], complete: set[str], bound: set[str]) -> list[Run]:
    """Each run of ``job`` (every desired ordinal, and any other that reported) from
    its decisions in seq order. Pure."""
    seen: dict[str, _Seen] = {}
    for r in reports:
        run = seen.setdefault(r.workload_id, _Seen())
        run.status, run.message, run.node = r.status, r.message, r.node or run.node
        if r.status == "running":  # a start: a new attempt
            run.attempts += 1
            run.started, run.finished, run.exit_code = r.at, None, None
        elif r.status in ("exited", "failed"):
            run.finished, run.exit_code = r.at, r.exit_code
    ids = {workload_id(job.id, g.name, o) for g in job.groups for o in range(g.scaling.desired)}
    out = []
    for wid in sorted(ids | set(seen), key=_order):
        run = seen.get(wid) or _Seen()
        if wid in complete:
            state = "complete"
        elif run.status and (wid in bound or run.status != "running"):
            state = run.status
        else:  # never reported, or reported running but no longer bound
            state = "bound" if wid in bound else "pending"
        at = (run.started, run.finished, run.exit_code)
        out.append(Run(wid, state, run.attempts, *at, run.node, run.message))
    return out


def read(store: Store, cluster: str, job: Job) -> list[Run]:
    """:func:`fold` over what the store holds of ``job``."""
    from forge.client.reads import completed_runs

    reports: list[TaskReport] = []
    after = 0
    while True:
        page = store.job_reports(cluster, job.id, after, PAGE)
        reports.extend(page)
        if len(page) < PAGE:
            break
        after = page[-1].seq
    prefix = f"{job.id}/"
    bound: set[str] = set()
    last = prefix
    while True:
        rows = store.assignments(cluster, last, PAGE)
        mine = [a.workload_id for a in rows if a.workload_id.startswith(prefix)]
        bound.update(mine)
        if len(rows) < PAGE or len(mine) < len(rows):
            break
        last = rows[-1].workload_id
    return fold(job, reports, set(completed_runs(store, cluster, job.id)), bound)


def table(runs: list[Run]) -> str:
    """The runs as ``forge job runs`` prints them (UTC times)."""
    head = ("RUN", "STATE", "ATTEMPTS", "STARTED", "FINISHED", "RAN", "EXIT", "NODE")
    rows = [head]
    for r in runs:
        ran = f"{r.finished - r.started:.1f}s" if r.started and r.finished else "-"
        rows.append(
            (
                r.workload_id,
                r.state,
                str(r.attempts),
                _when(r.started),
                _when(r.finished),
                ran,
                "-" if r.exit_code is None else str(r.exit_code),
                r.node or "-",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


def as_json(runs: list[Run]) -> list[dict[str, object]]:
    return [asdict(r) for r in runs]


def _when(at: float | None) -> str:
    return "-" if at is None else time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(at))


def _order(wid: str) -> tuple[str, int]:
    group, _, ordinal = wid.rpartition("/")
    return group, int(ordinal) if ordinal.isdigit() else -1
