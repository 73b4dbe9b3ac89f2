"""Status views, pure: what ``forge status`` and ``forge explain`` show.

Built the same way from the loop's state (the workflow publishes a
:class:`~forge.wire.contract.LoopStatus` with each pass, and answers the operators'
queries) and from what the store holds (the client), so the two can never
disagree on what a number means. No temporalio, no I/O. What a pass reports to
the metric meter is :mod:`forge.wire.metrics`.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Container, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import NamedTuple

from forge.core.models import Assignment, Job, Node
from forge.core.placement import Binding, Cluster, Rejection, explain_node, rejection_text
from forge.core.placement.topology import filters_for, topology_of
from forge.core.reconcile import PendingEntry, Plan
from forge.core.rolling import RolloutPlan
from forge.stores.base import TaskReport
from forge.wire import contract as c

__all__ = [
    "PENDING_SHOWN",
    "REASONS_SHOWN",
    "VERDICTS_SHOWN",
    "NodeUsage",
    "assignments_page",
    "details",
    "explanation",
    "loop_status",
    "loop_summary",
    "node_usage",
    "node_views",
    "parse_ports",
    "pass_text",
    "pending_reasons",
    "pending_views",
    "rollout_views",
    "status_view",
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


class NodeUsage(NamedTuple):
    """What the replicas on one node use, from the agents' latest usage reports
    (``forge status``; never crosses Temporal). ``reporting`` replicas had a report."""

    cpu: int  # millicores
    memory: int  # MiB
    reporting: int
    ports: tuple[tuple[str, str, int], ...]  # (workload id, port name, port)


def parse_ports(message: str) -> list[tuple[str, int]]:
    """``... ports http=8080 admin=8081`` (an agent's report message) -> pairs."""
    _, sep, tail = message.partition(" ports ")
    out = []
    for item in tail.split() if sep else ():
        name, eq, port = item.partition("=")
        if eq and port.isdigit():
            out.append((name, int(port)))
    return out


def node_usage(
    reports: Iterable[TaskReport], bindings: Iterable[Assignment]
) -> dict[str, NodeUsage]:
    """Per node: the sum of its replicas' latest usage (utilisation x the binding's
    request) and the ports they listen on. A report from another node than the
    replica's binding (it moved since) is left out."""
    where = {a.workload_id: a for a in bindings}
    cpu: Counter[str] = Counter()
    memory: Counter[str] = Counter()
    count: Counter[str] = Counter()
    ports: dict[str, list[tuple[str, str, int]]] = {}
    for r in reports:
        a = where.get(r.workload_id)
        if a is None or (r.node and r.node != a.node):
            continue
        cpu[a.node] += round((r.cpu or 0.0) * a.cpu)
        memory[a.node] += round((r.memory or 0.0) * a.memory)
        count[a.node] += 1
        ports.setdefault(a.node, []).extend(
            (r.workload_id, name, port) for name, port in parse_ports(r.message)
        )
    return {
        n: NodeUsage(cpu[n], memory[n], count[n], tuple(sorted(ports.get(n, []))))
        for n in sorted(count)
    }


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
    preemptions: int = 0,
    recent_preemptions: Sequence[c.PreemptionView] = (),
    resets: int = 0,
    last_reset: str = "",
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
        preemptions=preemptions,
        recent_preemptions=list(recent_preemptions),
        resets=resets,
        last_reset=last_reset,
    )


def preemption_views(plan: Plan) -> list[c.PreemptionView]:
    """A pass's preemptions as the status shows them."""
    return [
        c.PreemptionView(preemptor=p.preemptor, node=p.node, victims=list(p.victims), at=p.at)
        for p in plan.preemptions
    ]


def preemption_reasons(wid: str, recent: Sequence[c.PreemptionView]) -> list[str]:
    """What ``forge explain`` says of a replica's part in recent preemptions: whom
    it preempted, or who preempted it (latest first)."""
    out = []
    for p in reversed(recent):
        when = _utc(p.at)
        if p.preemptor == wid:
            out.append(f"preempted {', '.join(p.victims)} on {p.node} at {when}")
        elif wid in p.victims:
            out.append(f"preempted by {p.preemptor} on {p.node} at {when}")
    return out


def _utc(t: float) -> str:
    return datetime.fromtimestamp(t, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def rollout_views(rp: RolloutPlan | None) -> list[c.RolloutView]:
    """The rollouts a pass keeps (in group order), with its step's phase and wait."""
    if rp is None:
        return []
    out: list[c.RolloutView] = []
    for name, r in sorted(rp.rollouts.items()):
        s = rp.steps.get(name)
        phase = "failed" if r.failed else (str(s.phase) if s is not None else "rolling")
        if r.failed and r.revert_asked:
            phase = "revert"
        out.append(
            c.RolloutView(
                group=name,
                version=r.rollout.version,
                previous=r.rollout.previous,
                phase=phase,
                waiting=r.failed or (s.waiting if s is not None else ""),
                promoted=r.rollout.promoted,
                healthy=s.healthy if s is not None else 0,
                updated=s.updated if s is not None else 0,
            )
        )
    return out


def explanation(
    wid: str,
    *,
    binding: Binding | None,
    pending: c.PendingView | None,
    job: Job | None,
    nodes: Iterable[Node],
    bindings: Iterable[Binding],
    preemptions: Sequence[c.PreemptionView] = (),
    done: Container[int] = (),
) -> c.Explanation:
    """Why a replica is where it is, or why it waits: the loop's own reason when it
    published one, its part in recent preemptions, and each node's verdict for the
    replica's request right now; a batch run in its group's ``done`` is complete."""
    preempted = preemption_reasons(wid, preemptions)
    if binding is not None:
        where = f"bound to {binding.node} ({binding.status})"
        return c.Explanation(workload_id=wid, state="bound", node=binding.node,
            gpu_ids=list(binding.gpu_ids), reasons=[where, *preempted])  # fmt: skip
    parts = wid.rsplit("/", 2)
    group = job.group(parts[1]) if job is not None and len(parts) == 3 else None
    ordinal = int(parts[2]) if len(parts) == 3 and parts[2].isdigit() else -1
    if group is None or not 0 <= ordinal < group.scaling.desired:
        return c.Explanation(
            workload_id=wid, state="unknown", reasons=["not a desired replica of any job"]
        )
    if ordinal in done:
        why = "complete: its tasks exited 0; a batch run is not run again"
        return c.Explanation(workload_id=wid, state="complete", reasons=[why])
    reasons: list[str] = []
    if pending is not None:
        reasons.extend(pending.reasons)
        if pending.kind in ("backoff", "reschedule", "exhausted"):
            reasons.append(
                f"{pending.kind}: attempt {pending.attempts}, next try at {pending.not_before:.0f}"
            )
    req = group.request()
    held = list(bindings)
    cluster = allocations(nodes, held)
    topology = topology_of(parts[0], group, cluster.nodes, held) if group.topology else None
    filters = filters_for(topology)
    verdicts = [
        f"{a.id}: {_verdict(explain_node(a, req, group.constraints, filters))}"
        for a in cluster.nodes[:VERDICTS_SHOWN]
    ]
    reasons.extend(r for r in preempted if r not in reasons)
    if not reasons:
        reasons.append("waiting for the next pass")
    return c.Explanation(workload_id=wid, state="pending", reasons=reasons, nodes=verdicts)


def loop_summary(
    *,
    jobs: Mapping[str, Job],
    nodes: int,
    bound: int,
    pending: int,
    passes: int,
    generation: int,
    last_pass_at: float | None,
    last_pass: str,
) -> c.Summary:
    """The loop's counts, ``pending`` including the replicas a pass deferred."""
    return c.Summary(
        desired=sum(g.scaling.desired for j in jobs.values() for g in j.groups),
        bound=bound,
        pending=pending,
        nodes=nodes,
        jobs=len(jobs),
        passes=passes,
        generation=generation,
        last_pass_at=last_pass_at,
        last_pass=last_pass,
    )


def status_view(
    summary: c.Summary,
    nodes: Iterable[Node],
    bindings: Iterable[Binding],
    pending: Mapping[str, PendingEntry],
    deferred: int = 0,
) -> c.StatusView:
    shown, truncated = pending_views(pending)
    return c.StatusView(
        summary=summary,
        nodes=node_views(nodes, bindings),
        pending=shown,
        pending_truncated=truncated + deferred,
    )


def assignments_page(bindings: Mapping[str, Binding], q: c.AssignmentsQuery) -> c.AssignmentsPage:
    """The bindings after ``q.after`` in workload-id order (on ``q.node`` only when
    given), ``q.limit`` of them, and where the next page starts."""
    ids = sorted(
        w for w, b in bindings.items() if w > q.after and (q.node is None or b.node == q.node)
    )
    page = ids[: q.limit]
    items = [
        c.AssignmentView(
            workload_id=w,
            node=bindings[w].node,
            gpu_ids=list(bindings[w].gpu_ids),
            status=str(bindings[w].status),
        )
        for w in page
    ]
    return c.AssignmentsPage(items=items, next_after=page[-1] if len(ids) > q.limit else None)


def pass_text(passes: int, plan: Plan) -> str:
    """One line on what pass number ``passes`` did."""
    return (
        f"pass {passes}: +{len(plan.placed)} placed, -{len(plan.released)} released, "
        f"{len(plan.pending) + plan.deferred} pending"
        + (f" ({plan.deferred} deferred)" if plan.deferred else "")
        + (f", {len(plan.preemptions)} by preemption" if plan.preemptions else "")
    )


def details(
    *,
    cluster: str,
    runs: int,
    generation: int,
    nodes: Iterable[Node],
    jobs: int,
    bound: int,
    pending: Mapping[str, PendingEntry],
    deferred: int,
    last_pass: str,
    notices: Iterable[str] = (),
    preemptions: int = 0,
    resets: int = 0,
    last_reset: str = "",
) -> str:
    """The workflow's current details (Markdown, shown by the Web UI): what an
    operator looking at the run wants first, without a query."""
    states = Counter(str(n.state) for n in nodes)
    reasons = pending_reasons(pending, deferred, limit=5)
    lines = [
        f"**Forge cluster `{cluster}`** (run {runs}, generation {generation})",
        "",
        f"- nodes: {sum(states.values())} ("
        + ", ".join(f"{n} {s}" for s, n in sorted(states.items()))
        + ")",
        f"- jobs: {jobs}, replicas bound: {bound}, pending: {len(pending) + deferred}",
        f"- last pass: {last_pass}",
    ]
    if preemptions:
        lines.append(f"- preemptions: {preemptions} replicas evicted for higher-priority work")
    if resets:
        lines.append(f"- {reset_text(resets, last_reset)}")
    lines.extend(f"- **{n}**" for n in notices)
    if reasons:
        lines.append("- pending because:")
        lines.extend(f"  - {n} x {r}" for r, n in reasons)
    return "\n".join(lines)


def reset_text(resets: int, last_reset: str) -> str:
    """How ``forge status`` and the details say the watchdog reset the loop."""
    return f"resets: {resets:,} by the workers' watchdog; last: {last_reset or '?'}"


def _verdict(rejection: Rejection | None) -> str:
    return "fits now" if rejection is None else rejection_text(rejection)
