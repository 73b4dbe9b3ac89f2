"""Checks for the invariants (docs/invariants.md) over a persisted state, for tests
and benchmarks.

Pure: give it nodes and assignments (from a store, a plan or a query) and it
returns the violations it finds, as sentences; an empty list means all hold.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from forge.core.models import Assignment, Job, Node, NodeState, Request, workload_id
from forge.core.nodes import tolerated
from forge.core.placement.kernel import fits
from forge.core.placement.state import Binding, Cluster

__all__ = ["fitting_pending", "violations"]


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


def fitting_pending(
    nodes: Iterable[Node],
    assignments: Iterable[Assignment],
    jobs: Iterable[Job],
    *,
    gpu_reserve: int = 0,
) -> list[str]:
    """Invariant 4 over a settled state: no desired replica is left unbound while a
    ready node could take it now (its constraints and taints allow, and the one fit
    kernel says it fits what the node has free, net of the GPU reservation the loop
    plans with: ``gpu_reserve`` per mille).

    Groups with ``distinct_hosts``, ``spread`` or ``gang`` are not checked here (whether
    one of their replicas may go on a node depends on where its siblings are).
    Settled means nothing deferred and no backoff pending on freed capacity: call it
    once the loop has tried every replica and the bound count is steady.
    """
    cluster = Cluster([n for n in nodes if n.state is NodeState.READY], gpu_reserve=gpu_reserve)
    bound: set[str] = set()
    for a in assignments:
        bound.add(a.workload_id)
        alloc = cluster.by_id.get(a.node)
        if alloc is not None:
            alloc.hold(Binding.from_assignment(a))
    where: dict[tuple[Request, tuple[object, ...]], str | None] = {}
    out: list[str] = []
    for job in jobs:
        for g in job.groups:
            if g.distinct_hosts or g.spread or g.gang:
                continue
            missing = [
                i for i in range(g.scaling.desired) if workload_id(job.id, g.name, i) not in bound
            ]
            if not missing:
                continue
            req = g.request()
            key = (req, g.constraints)
            if key not in where:
                where[key] = next(
                    (
                        a.id
                        for a in cluster.nodes
                        if fits(a, req)
                        and all(c.matches(a.node.labels) for c in g.constraints)
                        and tolerated(a.node.taints, req.tolerations) is None
                    ),
                    None,
                )
            node = where[key]
            if node is not None:
                wid = workload_id(job.id, g.name, missing[0])
                out.append(f"{wid} ({len(missing)} of its group) is pending but fits node {node}")
    return out
