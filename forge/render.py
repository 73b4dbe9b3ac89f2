"""Presentation shared by the ``forge`` command and the services: tables, units,
grouped reasons, JSON shapes.

Below both :mod:`forge.cli` and :mod:`forge.services` (neither imports upwards) so
the command code reads as "get data, hand it to a renderer", and so ``forge dev``
prints status exactly the way ``forge status`` does. Nothing here talks to a
server or reads a file: every function takes plain data and returns strings or
JSON-ready dicts. ``forge plan``'s own output is :mod:`forge.cli.plan_output`.

The JSON shape built here (``status_json``) is the CLI's machine interface:
scripts depend on its keys, so change it only by adding.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from forge.core.models import Job
    from forge.wire.contract import AssignmentView, Explanation, JobResult, StatusView
    from forge.wire.views import NodeUsage

__all__ = [
    "SMALL_CLUSTER",
    "TOP",
    "cores",
    "explain_text",
    "gib",
    "group_reasons",
    "job_result_line",
    "jobs_table",
    "more",
    "pct",
    "reason_key",
    "reasons_table",
    "status_json",
    "status_line",
    "status_text",
    "table",
]

#: Tables of nodes and reason groups show this many rows, then "... and N more":
#: a 1,500-node cluster must not scroll the summary off the screen.
TOP = 20
_MAX_CELL = 90

# ----------------------------------------------------------------------- basics


def table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A plain-text table: numeric columns right-aligned, text left-aligned, long
    cells cut.

    Plain spaces, no box drawing: the output stays greppable and pastes cleanly
    into an issue.
    """
    raw = [list(row) for row in rows]
    numeric = [bool(raw) and all(_is_number(row[i]) for row in raw) for i in range(len(headers))]
    cells = [[_cell(v) for v in row] for row in raw]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, text in enumerate(row):
            widths[i] = max(widths[i], len(text))
    lines = ["  ".join(h.ljust(widths[i]) for i, h in enumerate(headers)).rstrip()]
    for row in cells:
        parts = [
            text.rjust(widths[i]) if numeric[i] else text.ljust(widths[i])
            for i, text in enumerate(row)
        ]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _cell(value: object) -> str:
    text = f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)
    text = " ".join(text.split())  # no newlines or tabs inside a cell
    return text if len(text) <= _MAX_CELL else text[: _MAX_CELL - 3] + "..."


def cores(millicores: int) -> str:
    """Millicores as cores: 16000 -> "16", 1500 -> "1.5", 125272 -> "125"."""
    value = millicores / 1000
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.2f}".rstrip("0").rstrip(".")


def gib(mib: int) -> str:
    """MiB as GiB: 65536 -> "64", 1536 -> "1.5", 534220 -> "522"."""
    value = mib / 1024
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.1f}".removesuffix(".0")


def pct(used: float, total: int) -> str:
    return f"{100 * used / total:.0f}%" if total else "-"


def more(shown: int, total: int, what: str) -> list[str]:
    return [f"... and {total - shown:,} more {what}"] if total > shown else []


# ---------------------------------------------------------------- pending reasons


def reason_key(reason: str) -> str:
    """The shape of a pending reason without its counts, for grouping.

    ``"0/1523 nodes available: 1496 insufficient gpu, 27 insufficient cpu"`` and
    ``"0/1523 nodes available: 1490 insufficient gpu, 33 insufficient cpu"`` are the
    same problem for a reader, so both become ``"insufficient cpu, insufficient gpu"``
    (sorted, so the per-node counts deciding the order cannot split a group).
    Reasons of another form (reschedule delays, deferrals) are kept whole. The
    text is read by the placement core's own reader, the inverse of its writer.
    """
    from forge.core.placement.reasons import read_diagnosis  # (loads the core's models)

    d = read_diagnosis(reason)
    if d is None:
        return reason
    if not d.causes:
        return "no nodes registered" if d.total == 0 else "no node fits"
    return ", ".join(sorted({cause for cause, _ in d.causes}))


def group_reasons(
    pending: Iterable[tuple[str, Sequence[str]]],
) -> list[tuple[str, int, str]]:
    """(reason, replicas, an example workload id), most frequent first.

    A replica counts under its first reason: that is the one the planner found
    (later ones are backoff bookkeeping).
    """
    counts: Counter[str] = Counter()
    example: dict[str, str] = {}
    for wid, reasons in pending:
        key = reason_key(reasons[0]) if reasons else "unknown"
        counts[key] += 1
        example.setdefault(key, wid)
    return [(k, n, example[k]) for k, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]


def reasons_table(pending: Sequence[tuple[str, Sequence[str]]], total: int) -> list[str]:
    groups = group_reasons(pending)
    lines = [f"pending by reason ({total:,} replicas):"]
    rows = [(n, key, wid) for key, n, wid in groups[:TOP]]
    lines.append(table(("REPLICAS", "REASON", "EXAMPLE"), rows))
    lines += more(min(len(groups), TOP), len(groups), "reasons")
    if total > len(pending):
        lines.append(f"(grouped over the first {len(pending):,} pending replicas)")
    return lines


# ------------------------------------------------------------------------- status


def status_json(
    status: StatusView,
    assignments: Sequence[AssignmentView],
    usage: Mapping[str, NodeUsage] | None = None,
) -> dict[str, Any]:
    """The ``forge status --json`` object (documented in ``forge status --help``)."""
    used = usage or {}
    summary = status.summary.model_dump()
    summary["pending_truncated"] = status.pending_truncated
    summary["notices"] = list(status.notices)
    summary["preemptions"] = status.preemptions
    summary["resets"] = status.resets
    summary["last_reset"] = status.last_reset
    return {
        "summary": summary,
        "nodes": [
            {
                "id": n.id,
                "state": n.state,
                "cpu": {"capacity": n.cpu.capacity, "allocated": n.cpu.allocated},
                "memory": {"capacity": n.memory.capacity, "allocated": n.memory.allocated},
                "gpus": {"total": n.gpus.total, "allocated": n.gpus.allocated},
                **({"usage": _usage_json(used[n.id])} if n.id in used else {}),
            }
            for n in status.nodes
        ],
        "assignments": [
            {
                "workload_id": a.workload_id,
                "node": a.node,
                "gpu_ids": list(a.gpu_ids),
                "status": a.status,
            }
            for a in assignments
        ],
        "pending": [
            {"workload_id": p.workload_id, "reasons": list(p.reasons)} for p in status.pending
        ],
        "queues": [v.model_dump(mode="json") for v in status.queues],
    }


def _usage_json(u: NodeUsage) -> dict[str, Any]:
    return {
        "cpu": u.cpu,
        "memory": u.memory,
        "reporting": u.reporting,
        "ports": [{"workload_id": w, "name": name, "port": p} for w, name, p in u.ports],
    }


def status_line(cluster: str, status: StatusView) -> str:
    """One line: the counts a person checks first."""
    s = status.summary
    return (
        f"cluster {cluster}: {s.desired:,} desired, {s.bound:,} bound, {s.pending:,} pending "
        f"({s.nodes:,} nodes, {s.jobs:,} jobs, {s.passes:,} passes)"
    )


def status_text(
    cluster: str, status: StatusView, usage: Mapping[str, NodeUsage] | None = None
) -> str:
    """Human output of ``forge status``: summary, node table (with what the agents
    report the replicas use, and their ports, when agents report), pending by reason."""
    s = status.summary
    lines = [status_line(cluster, status), f"last pass: {s.last_pass}"]
    if status.preemptions:
        lines.append(f"preemptions: {status.preemptions:,} replicas evicted for higher priority")
    if status.resets:
        from forge.wire.views import reset_text  # rare: not imported for every status

        lines.append(reset_text(status.resets, status.last_reset))
    lines += [f"attention: {n}" for n in status.notices]
    if status.nodes:
        lines += ["", *_nodes_table(status, usage or {})]
    else:
        lines += ["", "no nodes registered (forge node add ...)"]
    if status.pending:
        pending = [(p.workload_id, p.reasons) for p in status.pending]
        lines += ["", *reasons_table(pending, s.pending)]
    if status.queues:  # teams sharing the cluster (forge queue show NAME: one in full)
        from forge.queue_text import table as queue_table

        lines += ["", queue_table(status.queues)]
    return "\n".join(lines)


#: Up to this many nodes, ``forge status`` lists every node; above, the busiest and
#: the ones not ready (the rows someone acts on), with a count by state.
SMALL_CLUSTER = 50


def _nodes_table(status: StatusView, usage: Mapping[str, NodeUsage]) -> list[str]:
    nodes = sorted(status.nodes, key=lambda n: n.id)
    title: list[str] = []
    if len(nodes) > SMALL_CLUSTER:
        states = Counter(n.state for n in nodes)
        counts = ", ".join(
            f"{n:,} {s}" for s, n in sorted(states.items(), key=lambda kv: (-kv[1], kv[0]))
        )
        busiest = sorted(nodes, key=lambda n: (-n.replicas, n.id))[:TOP]
        unready = [n for n in nodes if n.state != "ready"][:TOP]
        shown = {n.id for n in busiest} | {n.id for n in unready}
        nodes = [n for n in nodes if n.id in shown]
        title = [
            f"nodes: {counts}; showing the {len(busiest)} busiest and up to {TOP} not ready "
            "(forge status --json lists all)"
        ]
    rows: list[tuple[object, ...]] = [
        (
            n.id,
            n.state,
            f"{cores(n.cpu.allocated)}/{cores(n.cpu.capacity)}",
            f"{gib(n.memory.allocated)}/{gib(n.memory.capacity)}",
            f"{n.gpus.allocated}/{n.gpus.total}",
            n.replicas,
        )
        for n in nodes
    ]
    headers: tuple[str, ...] = ("NODE", "STATE", "CPU", "MEMORY GiB", "GPUS", "REPLICAS")
    if usage:  # agents report: what the replicas use (not what they asked for), ports
        headers += ("CPU USED", "MEMORY USED", "PORTS")
        rows = [(*row, *_usage_cells(usage.get(n.id))) for row, n in zip(rows, nodes, strict=True)]
    return [*title, table(headers, rows)]


def _usage_cells(u: NodeUsage | None) -> tuple[str, str, str]:
    if u is None:
        return "-", "-", "-"
    ports = sorted(p for _, _, p in u.ports)
    shown = ",".join(map(str, ports[:PORTS_SHOWN]))
    if len(ports) > PORTS_SHOWN:
        shown += f" +{len(ports) - PORTS_SHOWN}"
    return (
        cores(u.cpu),
        f"{gib(u.memory)} GiB" if u.memory >= 1024 else f"{u.memory} MiB",
        shown or "-",
    )


#: Ports listed per node in the human table (``--json`` lists them all, by replica).
PORTS_SHOWN = 6


def explain_text(e: Explanation) -> str:
    """Human output of ``forge explain``."""
    if e.state == "bound":
        gpus = ", ".join(e.gpu_ids) if e.gpu_ids else "none"
        lines = [f"{e.workload_id}: bound to {e.node} (gpus: {gpus})"]
    else:
        lines = [f"{e.workload_id}: {e.state}"]
    if e.reasons:
        lines.append("reasons:")
        lines += [f"  {r}" for r in e.reasons]
    if e.nodes:
        lines.append("nodes:")
        lines += [f"  {v}" for v in e.nodes]
    return "\n".join(lines)


def job_result_line(r: JobResult) -> str:
    return f"{r.job_id}: {r.desired:,} desired, {r.bound:,} bound, {r.pending:,} pending"


def jobs_table(jobs: Sequence[Job], bound: Mapping[str, int], states: Mapping[str, str]) -> str:
    """``forge job list``: one row per job, desired replicas from the spec, bound
    replicas from the persisted bindings, and a batch job's state (``service``
    when it has none: forge.client.reads.JobList.labels)."""
    rows = []
    for job in jobs:
        desired = sum(g.scaling.desired for g in job.groups)
        groups = " ".join(f"{g.name}={g.scaling.desired}" for g in job.groups)
        state = states.get(job.id, "service")
        rows.append((job.id, job.priority, state, desired, bound.get(job.id, 0), groups))
    return table(("JOB", "PRIORITY", "STATE", "DESIRED", "BOUND", "GROUPS"), rows)
