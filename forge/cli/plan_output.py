"""What ``forge plan`` prints: the placements and preemptions as JSON, or a summary
with the busiest nodes, the preemptions and the pending reasons grouped (the tables
come from ``forge.render``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from forge.core.models import Node
from forge.render import TOP, cores, gib, more, pct, reasons_table, table

if TYPE_CHECKING:
    from forge.core.placement import Binding
    from forge.core.reconcile import Plan

__all__ = ["plan_json", "plan_text"]


def _milli(b: Binding) -> int:
    """Milli-GPU a binding holds: its share, or 1000 per whole device."""
    return b.gpu_milli if b.gpu_milli else 1000 * len(b.gpu_ids)


def _gpus(value: float) -> str:
    return f"{value:,.0f}" if value == int(value) else f"{value:,.1f}"


def _kept(plan: Plan) -> int:
    """Bindings the pass kept (it was given them and did not release them)."""
    return len(plan.bindings) - len(plan.placed)


def plan_json(plan: Plan, seconds: float) -> dict[str, Any]:
    """The ``forge plan --json`` object (documented in ``forge plan --help``)."""
    nodes_used = {b.node for b in plan.bindings.values()}
    return {
        "placements": [
            {"workload_id": b.workload_id, "node": b.node, "gpu_ids": list(b.gpu_ids)}
            | ({"gpu_milli": b.gpu_milli} if b.gpu_milli else {})
            for b in plan.placed
        ],
        "preemptions": [
            {"preemptor": p.preemptor, "node": p.node, "victims": list(p.victims)}
            for p in plan.preemptions
        ],
        "pending": [
            {"workload_id": wid, "reasons": list(entry.reasons)}
            for wid, entry in plan.pending.items()
        ],
        "summary": {
            "placed": len(plan.placed),
            "pending": len(plan.pending),
            "running": _kept(plan),
            "preemptions": len(plan.preemptions),
            "preempted": sum(len(p.victims) for p in plan.preemptions),
            "nodes_used": len(nodes_used),
            # devices holding anything (a shared device counts once) and milli-GPU held
            "gpus_used": len({(b.node, g) for b in plan.bindings.values() for g in b.gpu_ids}),
            "gpu_milli_used": sum(_milli(b) for b in plan.bindings.values()),
            "seconds": round(seconds, 6),
        },
    }


def plan_text(
    plan: Plan, nodes: Sequence[Node], seconds: float, *, algorithm: str, candidates: int
) -> str:
    """Human output of ``forge plan``: summary, allocation, busiest nodes, reasons."""
    per_node: dict[str, list[int]] = {}  # node -> [replicas, cpu, memory, gpus]
    for b in plan.bindings.values():
        acc = per_node.setdefault(b.node, [0, 0, 0, 0])
        acc[0] += 1
        acc[1] += b.cpu
        acc[2] += b.memory
        acc[3] += _milli(b)
    by_id = {n.id: n for n in nodes}
    total_cpu = sum(n.cpu for n in nodes)
    total_mem = sum(n.memory for n in nodes)
    total_gpu = sum(len(n.gpus) for n in nodes)
    used_cpu = sum(a[1] for a in per_node.values())
    used_mem = sum(a[2] for a in per_node.values())
    used_gpu = sum(a[3] for a in per_node.values()) / 1000  # milli-GPU: shares count as shares
    sample = "all nodes" if candidates == 0 else f"{candidates} candidates"
    lines = [
        f"planned {plan.desired:,} replicas on {len(nodes):,} nodes in {seconds:.2f} s "
        f"({algorithm}, {sample}): {len(plan.placed):,} placed, {len(plan.pending):,} pending"
        + (f", {_kept(plan):,} running" if _kept(plan) else ""),
        f"allocated: cpu {cores(used_cpu)}/{cores(total_cpu)} cores ({pct(used_cpu, total_cpu)}), "
        f"memory {gib(used_mem)}/{gib(total_mem)} GiB ({pct(used_mem, total_mem)}), "
        f"gpus {_gpus(used_gpu)}/{total_gpu:,} ({pct(used_gpu, total_gpu)})",
    ]
    if per_node:
        counts = sorted(a[0] for a in per_node.values())
        lines.append(
            f"nodes used: {len(per_node):,}/{len(nodes):,}; replicas per used node: "
            f"min {counts[0]}, median {counts[len(counts) // 2]}, max {counts[-1]}"
        )
        busiest = sorted(per_node.items(), key=lambda kv: (-kv[1][0], kv[0]))[:TOP]
        rows = []
        for node_id, (n, cpu, mem, gpus) in busiest:
            node = by_id[node_id]
            rows.append(
                (
                    node_id,
                    n,
                    f"{cores(cpu)}/{cores(node.cpu)}",
                    f"{gib(mem)}/{gib(node.memory)}",
                    f"{_gpus(gpus / 1000)}/{len(node.gpus)}",
                )
            )
        lines += ["", f"busiest nodes (top {min(TOP, len(per_node))} by replicas placed):"]
        lines.append(table(("NODE", "REPLICAS", "CPU", "MEMORY GiB", "GPUS"), rows))
        lines += more(len(busiest), len(per_node), "nodes")
    if plan.preemptions:
        lines += ["", *_preemptions_text(plan)]
    if plan.pending:
        pending = [(wid, e.reasons) for wid, e in plan.pending.items()]
        lines += ["", *reasons_table(pending, len(pending))]
    return "\n".join(lines)


def _preemptions_text(plan: Plan) -> list[str]:
    """Who would evict whom: the count, then the first preemptions in plan order."""
    shown = plan.preemptions[:TOP]
    victims = sum(len(p.victims) for p in plan.preemptions)
    rows = [(p.preemptor, p.node, len(p.victims), ", ".join(p.victims)) for p in shown]
    return [
        f"preemptions: {len(plan.preemptions):,} placed by evicting {victims:,} replicas:",
        table(("PREEMPTOR", "NODE", "EVICTED", "VICTIMS"), rows),
        *more(len(shown), len(plan.preemptions), "preemptions"),
    ]
