"""What a pass reports to the metric meter: replica and node gauges, placement and
release counters, the planning time and work of the pass.

Pure, like :mod:`forge.wire.views` beside it: the cluster workflow builds the
readings from the plan and hands them to ``workflow.metric_meter()``
(:mod:`workflows.presentation`), so what a number means is written once, here,
and tested without a worker.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Literal, NamedTuple

from forge.core.models import Node
from forge.core.reconcile import Plan
from forge.wire.queues import QueueView

__all__ = ["NODE_STATES", "Metric", "pass_metrics", "queue_metrics"]

NODE_STATES = ("ready", "draining", "lost")  # each has a gauge, zero included


class Metric(NamedTuple):
    """One instrument reading: the workflow hands these to its metric meter."""

    kind: Literal["gauge", "counter", "histogram", "histogram_float"]
    name: str
    description: str
    value: float
    attributes: Mapping[str, str] = {}
    unit: str | None = None


def pass_metrics(plan: Plan, nodes: Iterable[Node], elapsed: float) -> list[Metric]:
    """What a pass reports: replica and node gauges, placement counters, and the
    planning time (``elapsed`` seconds) and work of the pass."""
    pending = len(plan.pending) + plan.deferred
    backoff = sum(1 for e in plan.pending.values() if e.kind == "backoff")
    out = [
        Metric("gauge", "forge_replicas_desired", "desired replicas", plan.desired),
        Metric("gauge", "forge_replicas_bound", "bound replicas", len(plan.bindings)),
        Metric("gauge", "forge_replicas_pending", "pending replicas", pending),
        Metric("gauge", "forge_replicas_backoff", "replicas in backoff", backoff),
    ]
    states = Counter(str(n.state) for n in nodes)
    out.extend(
        Metric("gauge", "forge_nodes", "nodes by state", states.get(s, 0), {"state": s})
        for s in NODE_STATES
    )
    out.append(Metric("counter", "forge_placements_total", "replicas placed", len(plan.placed)))
    out.append(Metric("counter", "forge_releases_total", "replicas released", len(plan.released)))
    # every release moves or stops a running replica: by reason, so a move that
    # nothing asked for (a restart churn bug) shows up in production
    out.extend(
        Metric(
            "counter",
            "forge_replicas_moved_total",
            "replicas released from their node, by reason",
            n,
            {"reason": reason},
        )
        for reason, n in sorted(Counter(r for _, r in plan.released).items())
    )
    out.extend(
        Metric(
            "counter",
            "forge_preemptions_total",
            "replicas evicted for higher-priority work, by reason",
            n,
            {"reason": "priority"},
        )
        for n in (sum(len(p.victims) for p in plan.preemptions),)
        if n
    )
    out.append(Metric("counter", "forge_passes_total", "reconcile passes", 1))
    out.append(
        Metric("histogram_float", "forge_pass_seconds", "time to plan one pass", elapsed, {}, "s")
    )
    out.append(
        Metric("histogram", "forge_pass_work_units", "node checks and scores of a pass", plan.work)
    )
    return out


def queue_metrics(queues: Iterable[QueueView]) -> list[Metric]:
    """Per queue: what its bound replicas hold and its nominal quota, per resource
    (``cpu`` millicores, ``memory`` MiB, ``gpu:<model>`` milli-devices, as the quota
    counts them), and its bound and queued replicas. A resource the queue has no
    quota for is left out, so a dashboard divides used by nominal safely."""
    out: list[Metric] = []
    for v in queues:
        name, quota = v.spec.name, v.spec.quota
        limits = {"cpu": quota.cpu, "memory": quota.memory}
        limits.update({f"gpu:{m}": lim for m, lim in sorted(quota.gpu.items())})
        for resource, lim in limits.items():
            if lim is None:
                continue
            scale = 1000 if resource.startswith("gpu:") else 1
            attrs = {"queue": name, "resource": resource}
            used = v.usage.get(resource, 0)
            out.append(
                Metric("gauge", "forge_queue_used", "what a queue's replicas hold", used, attrs)
            )
            out.append(
                Metric(
                    "gauge",
                    "forge_queue_nominal",
                    "a queue's nominal quota",
                    lim.nominal * scale,
                    attrs,
                )
            )
        attrs = {"queue": name}
        out.append(Metric("gauge", "forge_queue_bound", "a queue's bound replicas", v.bound, attrs))
        out.append(
            Metric("gauge", "forge_queue_queued", "replicas its quota held back", v.queued, attrs)
        )
    return out
