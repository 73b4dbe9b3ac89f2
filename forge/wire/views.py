"""Status views, pure: what ``forge status`` and ``forge explain`` show.

Built the same way from the loop's state (the workflow publishes a
:class:`~forge.wire.contract.LoopStatus` with each pass, and answers the operators'
queries) and from what the store holds (the client), so the two can never
disagree on what a number means. No temporalio, no I/O.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterable, Mapping

from forge.core.models import Job, Node
from forge.core.placement import Binding, Cluster, Rejection, explain_node, rejection_text
from forge.core.reconcile import PendingEntry
from forge.wire import contract as c

__all__ = [
    "PENDING_SHOWN",
    "REASONS_SHOWN",
    "VERDICTS_SHOWN",
    "explanation",
    "loop_status",
    "node_views",
    "pending_reasons",
    "pending_views",
]

PENDING_SHOWN = 200  # pending replicas listed (the rest are counted)
REASONS_SHOWN = 10  # distinct pending reasons listed
VERDICTS_SHOWN = 20  # per-node verdicts an explanation lists
DEFERRED_REASON = "deferred to the next pass (per-pass placement or work limit)"


def allocations(nodes: Iterable[Node], bindings: Iterable[Binding]) -> Cluster:
    """Every node with what its bindings hold."""
    cluster = Cluster(list(nodes))
    for b in bindings:
        a = cluster.by_id.get(b.node)
        if a is not None:
            a.hold(b)
    return cluster


def node_views(nodes: Iterable[Node], bindings: Iterable[Binding]) -> list[c.NodeView]:
    held = list(bindings)
    counts = Counter(b.node for b in held)
    return [
        c.NodeView(
            id=a.id,
            state=str(a.node.state),
            cpu=c.ResourceView(capacity=a.node.cpu, allocated=a.cpu_used),
            memory=c.ResourceView(capacity=a.node.memory, allocated=a.mem_used),
            gpus=c.GpuView(total=len(a.node.gpus), allocated=a.gpus_used),
            replicas=counts.get(a.id, 0),
        )
        for a in allocations(nodes, held).nodes
    ]


def pending_views(
    pending: Mapping[str, PendingEntry], limit: int = PENDING_SHOWN
) -> tuple[list[c.PendingView], int]:
    """The first ``limit`` pending replicas by id (O(n), not a sort of them all),
    and how many more there are."""
    first = heapq.nsmallest(limit, pending)
    views = [
        c.PendingView(
            workload_id=w,
            reasons=list(pending[w].reasons),
            kind=pending[w].kind,
            attempts=pending[w].attempts,
            not_before=pending[w].not_before,
        )
        for w in first
    ]
    return views, max(0, len(pending) - len(first))


def pending_reasons(
    pending: Mapping[str, PendingEntry], deferred: int = 0, limit: int = REASONS_SHOWN
) -> list[tuple[str, int]]:
    """The most common first reasons, with how many replicas wait for each."""
    counts = Counter(e.reasons[0] for e in pending.values() if e.reasons)
    if deferred:
        counts[DEFERRED_REASON] += deferred
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:limit]


def loop_status(
    summary: c.Summary,
    pending: Mapping[str, PendingEntry],
    *,
    deferred: int = 0,
    notices: Iterable[str] = (),
    state_digest: str = "",
) -> c.LoopStatus:
    views, truncated = pending_views(pending)
    return c.LoopStatus(
        summary=summary,
        pending=views,
        pending_truncated=truncated + deferred,
        reasons=pending_reasons(pending, deferred),
        deferred=deferred,
        notices=list(notices),
        state_digest=state_digest,
    )


def explanation(
    wid: str,
    *,
    binding: Binding | None,
    pending: c.PendingView | None,
    job: Job | None,
    nodes: Iterable[Node],
    bindings: Iterable[Binding],
) -> c.Explanation:
    """Why a replica is where it is, or why it waits: the loop's own reason when it
    published one, and each node's verdict for the replica's request right now."""
    if binding is not None:
        return c.Explanation(
            workload_id=wid,
            state="bound",
            node=binding.node,
            gpu_ids=list(binding.gpu_ids),
            reasons=[f"bound to {binding.node} ({binding.status})"],
        )
    parts = wid.rsplit("/", 2)
    group = job.group(parts[1]) if job is not None and len(parts) == 3 else None
    ordinal = int(parts[2]) if len(parts) == 3 and parts[2].isdigit() else -1
    if group is None or not 0 <= ordinal < group.scaling.desired:
        return c.Explanation(
            workload_id=wid, state="unknown", reasons=["not a desired replica of any job"]
        )
    reasons: list[str] = []
    if pending is not None:
        reasons.extend(pending.reasons)
        if pending.kind in ("backoff", "reschedule", "exhausted"):
            reasons.append(
                f"{pending.kind}: attempt {pending.attempts}, next try at {pending.not_before:.0f}"
            )
    req = group.request()
    verdicts = [
        f"{a.id}: {_verdict(explain_node(a, req, group.constraints))}"
        for a in allocations(nodes, bindings).nodes[:VERDICTS_SHOWN]
    ]
    if not reasons:
        reasons.append("waiting for the next pass")
    return c.Explanation(workload_id=wid, state="pending", reasons=reasons, nodes=verdicts)


def _verdict(rejection: Rejection | None) -> str:
    return "fits now" if rejection is None else rejection_text(rejection)
