"""Placement with a group's own rules (issue 22): the synthetic cluster of
``bench.placement`` with its nodes in 10 zones, planned once as it is and once with
half of its groups spread by zone (``do_not_schedule``, max_skew 1) and 5% of them
gangs (5% of those of 2-8 replicas). Reports both times and their ratio (the issue's
target: at most 1.5x), and checks invariants 1-3 and the rules after each run.

    python -m bench.rules --sizes 5000x50000 --repeat 3
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections import Counter
from collections.abc import Sequence

from bench.workloads import synthetic
from forge.core.invariants import violations
from forge.core.models import Job, Node
from forge.core.reconcile import Plan, ReconcileOptions, reconcile

ZONES = 10
OPTIONS = ReconcileOptions(max_placements=10**9)


def zoned(nodes: Sequence[Node]) -> list[Node]:
    return [
        n.model_copy(update={"labels": {**n.labels, "zone": f"z{i % ZONES}"}})
        for i, n in enumerate(nodes)
    ]


def with_rules(jobs: Sequence[Job], seed: int) -> tuple[list[Job], int, int]:
    """Half the groups spread by zone; 5% of the groups of 2-8 replicas gangs."""
    rng = random.Random(f"forge-bench-rules/{seed}")
    out: list[Job] = []
    spread = gangs = 0
    for job in jobs:
        groups = []
        for g in job.groups:
            update: dict[str, object] = {}
            if rng.random() < 0.5:
                update["spread"] = ({"label": "zone"},)
                spread += 1
            if 2 <= g.scaling.desired <= 8 and rng.random() < 0.05:
                update["gang"] = True
                gangs += 1
            data = {**g.model_dump(), **update}
            groups.append(data)
        out.append(Job.model_validate({**job.model_dump(), "groups": groups}))
    return out, spread, gangs


def run(nodes: list[Node], jobs: list[Job], repeat: int) -> tuple[list[float], Plan]:
    node_map = {n.id: n for n in nodes}
    job_map = {j.id: j for j in jobs}
    times: list[float] = []
    plan: Plan | None = None
    for _ in range(repeat):
        start = time.process_time()
        plan = reconcile(
            jobs=job_map,
            nodes=node_map,
            bindings={},
            pending={},
            failures={},
            now=0.0,
            options=OPTIONS,
        )
        times.append(time.process_time() - start)
    assert plan is not None
    bad = violations(nodes, [b.to_assignment() for b in plan.bindings.values()])
    if bad:
        raise SystemExit(f"invariants broken: {bad[:5]}")
    zone = {n.id: n.labels["zone"] for n in nodes}
    for job in jobs:
        for g in job.groups:
            mine = [b for b in plan.bindings.values() if b.job == job.id and b.group == g.name]
            if g.gang and len(mine) not in (0, g.scaling.desired):
                raise SystemExit(f"gang {job.id}/{g.name} half bound")
            if g.spread:
                counts = Counter(zone[b.node] for b in mine)
                values = [counts.get(f"z{i}", 0) for i in range(ZONES)]
                if max(values) - min(values) > 1:
                    raise SystemExit(f"{job.id}/{g.name} skewed: {values}")
    return times, plan


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.rules")
    parser.add_argument("--sizes", default="5000x50000")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for size in args.sizes.split(","):
        n, r = (int(x) for x in size.split("x"))
        w = synthetic(n, r, seed=args.seed)
        nodes = zoned(w.nodes)
        ruled, spread, gangs = with_rules(w.jobs, args.seed)
        groups = sum(len(j.groups) for j in w.jobs)
        plain_t, plain = run(nodes, list(w.jobs), args.repeat)
        rules_t, rules = run(nodes, ruled, args.repeat)
        a, b = statistics.median(plain_t), statistics.median(rules_t)
        print(
            f"{size}: {groups:,} groups ({spread:,} spread by zone, {gangs:,} gangs), "
            f"{ZONES} zones; CPU s, median of {args.repeat}"
        )
        print(f"  without rules {a:6.2f} s  placed {len(plain.placed):,}/{w.replicas:,}")
        print(f"  with rules    {b:6.2f} s  placed {len(rules.placed):,}/{w.replicas:,}")
        print(f"  ratio {b / a:.2f}x (target <= 1.5x: {'met' if b / a <= 1.5 else 'MISSED'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
