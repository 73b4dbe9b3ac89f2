"""How queues read to a person: the table ``forge queue list`` and ``forge status``
print, the detail of ``forge queue show``, and the lines of the Web UI's details.
One place, so the three say the same thing in the same units (cpu millicores,
memory MiB, GPUs as devices, a share counted as its fraction)."""

from __future__ import annotations

from collections.abc import Sequence

from forge.wire.queues import QueueView

__all__ = ["detail", "lines", "table"]


def table(views: Sequence[QueueView]) -> str:
    """One line per queue and resource: used / nominal (+ borrowing limit)."""
    out = [
        f"{'QUEUE':<16} {'COHORT':<12} {'RESOURCE':<12} {'USED':>10} {'NOMINAL':>10}  BOUND QUEUED"
    ]
    for v in views:
        rows = _rows(v) or [("-", "", "")]
        for i, (resource, used, nominal) in enumerate(rows):
            head = (v.spec.name, v.spec.cohort or "-") if i == 0 else ("", "")
            tail = f"  {v.bound:>5} {v.queued:>6}" if i == 0 else ""
            out.append(f"{head[0]:<16} {head[1]:<12} {resource:<12} {used:>10} {nominal:>10}{tail}")
    return "\n".join(out)


def detail(v: QueueView) -> str:
    """A queue's quota per resource, what it holds, how much of that is borrowed."""
    spec = v.spec
    out = [
        f"queue {spec.name}  cohort {spec.cohort or '-'}  weight {spec.weight}",
        f"{v.bound} replica(s) bound, {v.queued} queued (the last pass)",
        f"{'RESOURCE':<14} {'USED':>10} {'NOMINAL':>10} {'BORROWED':>10} "
        f"{'MAX BORROW':>10} {'MAX LEND':>10}",
    ]
    limits = [("cpu", spec.quota.cpu, "cpu", 1), ("memory", spec.quota.memory, "memory", 1)]
    limits += [(f"gpu {m}", lim, f"gpu:{m}", 1000) for m, lim in sorted(spec.quota.gpu.items())]
    for label, lim, key, unit in limits:
        if lim is None:
            continue
        used = v.usage.get(key, 0) / unit
        over = max(used - lim.nominal, 0)
        cap = "-" if lim.borrowing_limit is None else f"{lim.borrowing_limit}"
        lend = "-" if lim.lending_limit is None else f"{lim.lending_limit}"
        out.append(f"{label:<14} {used:>10g} {lim.nominal:>10} {over:>10g} {cap:>10} {lend:>10}")
    return "\n".join(out)


def lines(views: Sequence[QueueView]) -> list[str]:
    """A line per queue for the run's details in the Web UI:
    ``- ml (cohort research): cpu 2000/2000, gpu A100 3/4; 5 bound, 2 queued``."""
    out = []
    for v in views:
        cohort = f" (cohort {v.spec.cohort})" if v.spec.cohort else ""
        used = ", ".join(f"{r} {u}/{n}" for r, u, n in _rows(v)) or "no quota"
        out.append(f"- {v.spec.name}{cohort}: {used}; {v.bound} bound, {v.queued} queued")
    return out


def _rows(v: QueueView) -> list[tuple[str, str, str]]:
    q, rows = v.spec.quota, []
    for name, lim, used in (
        ("cpu", q.cpu, v.usage.get("cpu", 0)),
        ("memory", q.memory, v.usage.get("memory", 0)),
    ):
        if lim is not None:
            rows.append((name, str(used), _nominal(lim.nominal, lim.borrowing_limit)))
    for model, lim in sorted(q.gpu.items()):
        used_gpu = v.usage.get(f"gpu:{model}", 0) / 1000
        rows.append((f"gpu {model}", f"{used_gpu:g}", _nominal(lim.nominal, lim.borrowing_limit)))
    return rows


def _nominal(nominal: int, borrowing: int | None) -> str:
    return f"{nominal}" if borrowing is None else f"{nominal}+{borrowing}"
