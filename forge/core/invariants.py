"""Checks for DESIGN.md's invariants over a persisted state, for tests and benchmarks.

Pure: give it nodes and assignments (from a store, a plan or a query) and it
returns the violations it finds, as sentences; an empty list means all hold.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from forge.core.models import Assignment, Node, NodeState

__all__ = ["violations"]


def violations(
    nodes: Iterable[Node],
    assignments: Iterable[Assignment],
    *,
    desired: Iterable[str] | None = None,
    settled: bool = True,
) -> list[str]:
    """Invariants 1, 2, 3 and (when ``settled``) 5 over one consistent state.

    ``desired``: the desired workload ids; when given, bound must be a subset.
    """
    by_id = {n.id: n for n in nodes}
    out: list[str] = []
    seen: Counter[str] = Counter()
    cpu: Counter[str] = Counter()
    mem: Counter[str] = Counter()
    gpu_holder: dict[tuple[str, str], str] = {}
    for a in assignments:
        seen[a.workload_id] += 1
        node = by_id.get(a.node)
        if node is None:
            out.append(f"{a.workload_id} is bound to unknown node {a.node}")
            continue
        if settled and node.state is not NodeState.READY:
            out.append(f"{a.workload_id} is bound to {node.state} node {a.node}")
        cpu[a.node] += a.cpu
        mem[a.node] += a.memory
        devices = {g.id for g in node.gpus}
        for gid in a.gpu_ids:
            if gid not in devices:
                out.append(f"{a.workload_id} holds gpu {gid} that node {a.node} does not have")
            other = gpu_holder.setdefault((a.node, gid), a.workload_id)
            if other != a.workload_id:
                out.append(f"gpu {a.node}/{gid} is held by {other} and {a.workload_id}")
    for wid, n in seen.items():
        if n > 1:
            out.append(f"{wid} is bound {n} times")
    for node_id, used in cpu.items():
        if used > by_id[node_id].cpu:
            out.append(f"node {node_id}: cpu {used} > capacity {by_id[node_id].cpu}")
    for node_id, used in mem.items():
        if used > by_id[node_id].memory:
            out.append(f"node {node_id}: memory {used} > capacity {by_id[node_id].memory}")
    if desired is not None:
        want = set(desired)
        extra = sorted(w for w in seen if w not in want)
        if extra:
            out.append(f"{len(extra)} bound replicas are not desired, e.g. {extra[:3]}")
    return out
