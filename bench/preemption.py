"""Preemption at scale (issue 21): a full cluster receives high-priority work.

``--nodes`` nodes of 32 cores / 128 GiB, each filled to 100% cpu by eight 4-core
replicas of priority-10..40 jobs (what ``forge plan --running`` plans first), then
``--replicas`` priority-90 replicas of 8 cores arrive: each fits only by evicting
two of them. Measured, medians of ``--repeat`` runs, with exactly the code the
workflow runs (``forge.cli.plan.plan_passes``, as ``forge plan``):

* **offline plan**: the one pass that preempts for all of them, as ``forge plan``
  plans it (no work budget). Target: <= 10 s for 5,000 replicas on 5,000 nodes.
* **through the loop's budget**: the same arrival planned pass by pass with a carry
  and the workflow's work budget (``MAX_WORK``): how many passes place them all,
  the slowest pass, and that each stays within its budget.
* **overhead with nothing to preempt**: the same new replicas on a cluster half
  full, where all of them fit, planned with preemption on and off (medians of at
  least 5 interleaved runs each, after a warm-up). Target: <= 5%.
  Also the full cluster with priority-15 newcomers (nothing is ``min_gap`` below).

Seeded and deterministic. ``--write DIR`` writes ``nodes.yaml``, ``running.yaml``
and ``urgent.yaml``: ``forge plan --nodes DIR/nodes.yaml --running DIR/running.yaml
--jobs DIR/urgent.yaml`` shows the preemptions of the first measurement.

``--e2e`` runs the same cluster through the loop instead, as a user would: a dev
server, a real ``worker.py`` on SQLite, and the ``forge`` CLI as a subprocess
(bench.cli_path's): ``forge cluster start`` (default options: preemption on),
``forge node add --file nodes.yaml``, ``forge job run running.yaml`` and, once the
loop has settled with every node >= 90% allocated (checked), ``forge job run
urgent.yaml`` of ``--replicas`` single-replica priority-90 jobs. Measured: seconds from
that submission until every one is bound in the store (polled with SQL, never a
query), the replicas preempted (the published status), WorkflowTaskFailed and the
longest workflow task over every run (bench.e2e.history_stats), each run replayed with
the current code; then the invariants over the store (bench.e2e.check_invariants) and
preemption's own rule (each victim at least ``min_gap`` below its preemptor) over
every pass's persisted delta in the history. Exit 1 if an arrival is
left unplaced once the loop settles, on a workflow task failure other than the
server's own, a violation or a replay failure.

    python -m bench.preemption                    # 5,000 nodes, 5,000 replicas
    python -m bench.preemption --nodes 500 --replicas 500 --repeat 1
    python -m bench.preemption --e2e              # through the loop, 5,000 / 5,000
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import yaml
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from bench.cli_path import _cli_env, _forge, _longest_replay, _replay_seconds, loop_problems
from bench.e2e import (
    BenchFailure,
    Env,
    check_invariants,
    cluster_client,
    history_stats,
    loop_bench,
    poll,
    stored_count,
    summary,
    until_converged,
)
from forge.cli.plan import plan_passes
from forge.client.client import ForgeClient
from forge.core.models import Job, Node
from forge.core.reconcile import MAX_WORK, PENDING_UNITS, Plan, ReconcileOptions, reconcile
from forge.wire.activity_contract import ACT_PERSIST, PersistIn, assignment_from_row

__all__ = ["full_cluster", "main", "through_loop", "urgent"]

NODE_CPU, NODE_MEM = 32_000, 131_072
LOW_CPU, LOW_MEM = 4_000, 8_192  # eight fill a node's cpu
HIGH_CPU, HIGH_MEM = 8_000, 8_192  # each evicts two


def full_cluster(nodes: int, jobs: int = 40) -> tuple[list[Node], list[Job]]:
    """``nodes`` nodes and ``jobs`` low-priority jobs (10, 20, 30, 40 in turn) whose
    replicas fill every node's cpu exactly."""
    node_list = [
        Node.model_validate({"id": f"n{i:05d}", "cpu": NODE_CPU, "memory": NODE_MEM})
        for i in range(nodes)
    ]
    total = nodes * (NODE_CPU // LOW_CPU)
    sizes = [total // jobs + (1 if i < total % jobs else 0) for i in range(jobs)]
    return node_list, [
        _job(f"batch{i:02d}", n, LOW_CPU, LOW_MEM, 10 + 10 * (i % 4)) for i, n in enumerate(sizes)
    ]


def urgent(replicas: int, priority: int = 90, per_job: int = 100) -> list[Job]:
    jobs = -(-replicas // per_job)
    return [
        _job(
            f"urgent{i:03d}",
            min(per_job, replicas - i * per_job),
            HIGH_CPU,
            HIGH_MEM,
            priority,
        )
        for i in range(jobs)
    ]


def _job(name: str, replicas: int, cpu: int, memory: int, priority: int) -> Job:
    return Job.model_validate(
        {
            "name": name,
            "priority": priority,
            "groups": [
                {
                    "name": "g",
                    "scaling": {"max": max(replicas, 1), "desired": replicas},
                    "tasks": [{"name": "t", "resources": {"cpu": cpu, "memory": memory}}],
                }
            ],
        }
    )


def _options(replicas: int, *, preemption: bool = True) -> ReconcileOptions:
    """``forge plan``'s options (placement version 2, no work budget)."""
    return ReconcileOptions(max_placements=max(1, replicas), preemption=preemption)


def _median(runs: int, fn: Callable[[], tuple[Plan, float]]) -> tuple[Plan, float, list[float]]:
    times: list[float] = []
    plan: Plan | None = None
    for _ in range(runs):
        plan, seconds = fn()
        times.append(seconds)
    assert plan is not None
    return plan, statistics.median(times), times


def offline(nodes: list[Node], low: list[Job], high: list[Job], runs: int) -> dict[str, Any]:
    n = sum(g.scaling.desired for j in [*low, *high] for g in j.groups)
    plan, median, times = _median(runs, lambda: plan_passes(nodes, low, high, _options(n)))
    placed_high = sum(1 for b in plan.placed if b.job.startswith("urgent"))
    victims = sum(len(p.victims) for p in plan.preemptions)
    return {
        "median": median,
        "times": times,
        "placed": placed_high,
        "preemptions": len(plan.preemptions),
        "victims": victims,
        "pending_high": sum(1 for w in plan.pending if w.startswith("urgent")),
    }


def through_budget(nodes: list[Node], low: list[Job], high: list[Job]) -> dict[str, Any]:
    """Pass after pass with a carry and the workflow's work budget, as the loop."""
    by_id = {n.id: n for n in nodes}
    loop_opts = ReconcileOptions(rollouts=True, max_work=MAX_WORK, pending_units=PENDING_UNITS)
    jobs = {j.id: j for j in low}
    plan = reconcile(
        jobs=jobs, nodes=by_id, bindings={}, pending={}, failures={}, now=0.0, options=loop_opts
    )
    while plan.deferred:  # the low jobs' own placement, before the arrival
        plan = reconcile(
            jobs=jobs,
            nodes=by_id,
            bindings={},
            pending=plan.pending,
            failures=plan.failures,
            now=0.0,
            options=loop_opts,
            carry=plan.carry,
        )
    jobs = {**jobs, **{j.id: j for j in high}}
    now, passes, slowest, over = 1.0, 0, 0.0, 0
    placed = 0
    want = sum(g.scaling.desired for j in high for g in j.groups)
    changed: Sequence[str] | None = [j.id for j in high]
    while placed < want and passes < 200:
        start = time.perf_counter()
        plan = reconcile(
            jobs=jobs,
            nodes=by_id,
            bindings={},
            pending=plan.pending,
            failures=plan.failures,
            now=now,
            options=loop_opts,
            carry=plan.carry,
            jobs_changed=changed,
        )
        slowest = max(slowest, time.perf_counter() - start)
        changed = ()
        passes += 1
        over += plan.work > 2 * MAX_WORK  # (release and the last step may go a little past)
        placed += sum(1 for b in plan.placed if b.job.startswith("urgent"))
        placed -= sum(1 for w, why in plan.released if w.startswith("urgent"))
        if not plan.changed and not plan.deferred:
            wake = plan.next_wake
            if wake is None:
                break
            now = max(now + 1.0, wake)
        else:
            now += 1.0
    return {"passes": passes, "slowest": slowest, "placed": placed, "over_budget": over}


def overhead(
    nodes: list[Node], low: list[Job], high: list[Job], runs: int
) -> tuple[float, float, float]:
    """Median seconds with preemption on and off, and the ratio on/off - 1."""
    n = sum(g.scaling.desired for j in [*low, *high] for g in j.groups)
    on: list[float] = []
    off: list[float] = []
    plan_passes(nodes, low, high, _options(n))  # warm-up, untimed (caches, allocator)
    for i in range(runs):  # interleaved, in turn first, so a noisy neighbour hits both alike
        for preemption in (True, False) if i % 2 == 0 else (False, True):
            gc.collect()
            seconds = plan_passes(nodes, low, high, _options(n, preemption=preemption))[1]
            (on if preemption else off).append(seconds)
    m_on, m_off = statistics.median(on), statistics.median(off)
    return m_on, m_off, m_on / m_off - 1


def write(directory: Path, nodes: list[Node], low: list[Job], high: list[Job]) -> None:
    directory.mkdir(parents=True, exist_ok=True)

    def dump(name: str, items: Sequence[Node | Job]) -> None:
        docs = [i.model_dump(mode="json", exclude_defaults=True) for i in items]
        (directory / name).write_text(yaml.safe_dump(docs, sort_keys=False))

    dump("nodes.yaml", nodes)
    dump("running.yaml", low)
    dump("urgent.yaml", high)


# -- through the loop (--e2e) ------------------------------------------------------------

FILL_TARGET = 0.90  # every node at least this allocated (cpu) before the arrival
SETTLED_FOR = 15.0  # seconds with no arrival bound and the loop settled: give up


def _fill(fc: ForgeClient) -> tuple[float, float]:
    """The least and the mean cpu allocated over the nodes, from the store."""
    assert fc.store is not None
    nodes = fc.store.nodes(fc.cluster, limit=1_000_000)
    used: dict[str, int] = dict.fromkeys((n.id for n in nodes), 0)
    for a in fc.store.assignments(fc.cluster, limit=10_000_000):
        used[a.node] = used.get(a.node, 0) + a.cpu
    fractions = [used[n.id] / n.cpu for n in nodes]
    return min(fractions), statistics.fmean(fractions)


async def _until_placed(
    fc: ForgeClient,
    db: Path,
    want: int,
    total: int,
    t0: float,
    limit: float,
) -> tuple[int, float]:
    """Poll the store until ``want`` arrivals (jobs ``urgent...``) are bound; (bound,
    seconds since ``t0``). Stops early once the loop has settled (every replica
    tried, nothing deferred) with no arrival bound for SETTLED_FOR seconds."""
    end = time.monotonic() + limit
    last, since = -1, time.monotonic()
    while True:
        bound = await asyncio.to_thread(stored_count, db, fc.cluster, job_prefix="urgent")
        if bound >= want:
            return bound, time.perf_counter() - t0
        doc = await fc.published()
        settled = doc is not None and doc.summary.desired == total and not doc.deferred
        if bound != last or not settled:
            last, since = bound, time.monotonic()
        if time.monotonic() - since >= SETTLED_FOR or time.monotonic() > end:
            return bound, time.perf_counter() - t0
        await asyncio.sleep(0.25)


async def _evictions(
    client: Client, workflow_id: str, priority: dict[str, int], min_gap: int
) -> tuple[Counter[int], list[str]]:
    """Preemption's rule over every pass of every run (oldest first), from the deltas
    the loop persisted (the history's ``forge.persist`` inputs): here nothing but
    preemption releases a replica, so each replica a pass released must have been on
    a node where that pass bound a replica of a job at least ``min_gap`` higher.
    (replicas released by the highest priority bound beside them, the violations)."""
    runs: list[str] = []
    run_id: str | None = (await client.get_workflow_handle(workflow_id).describe()).run_id
    histories = []
    while run_id and run_id not in runs:
        runs.append(run_id)
        hist = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
        histories.append(hist)
        first = hist.events[0].workflow_execution_started_event_attributes
        run_id = first.continued_execution_run_id or None
    dc = client.data_converter
    where: dict[str, str] = {}  # workload id -> node, as persisted so far
    released: Counter[int] = Counter()
    out = []
    for hist in reversed(histories):
        for e in hist.events:
            if e.event_type != EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                continue
            attrs = e.activity_task_scheduled_event_attributes
            if attrs.activity_type.name != ACT_PERSIST:
                continue
            inp = (await dc.decode(list(attrs.input.payloads), [PersistIn]))[0]
            bound = [assignment_from_row(r, validate=False) for r in inp.bind]
            top: dict[str, int] = {}
            for a in bound:
                top[a.node] = max(top.get(a.node, 0), priority[a.job])
            for wid in inp.release:
                node = where.pop(wid, "?")
                released[top.get(node, 0)] += 1
                job = wid.rsplit("/", 2)[0]
                if priority[job] > top.get(node, 0) - min_gap:
                    out.append(
                        f"pass {inp.pass_no}: {wid} (priority {priority[job]}) released from "
                        f"{node}, where the highest bound that pass is {top.get(node)}"
                    )
            for a in bound:
                where[a.workload_id] = a.node
    return released, out


async def through_loop(env: Env, n_nodes: int, replicas: int) -> dict[str, Any]:
    """The scenario through a real worker and the forge CLI; see the module's doc."""
    name = f"preempt-{n_nodes}-{replicas}"
    db = env.work / f"{name}.db"
    store = f"sqlite:///{db}"
    nodes, low = full_cluster(n_nodes)
    high = urgent(replicas, per_job=1)
    write(env.work / "input", nodes, low, high)
    files = env.work / "input"
    env.worker(name, db)
    cli_env = _cli_env(env, name, store)
    fc = cluster_client(env, name, name, db)
    await asyncio.to_thread(_forge, ["cluster", "start"], cli_env, 120)
    await asyncio.to_thread(
        _forge, ["node", "add", "--file", str(files / "nodes.yaml")], cli_env, 600
    )
    await poll(lambda: summary(fc), lambda s: s.nodes == n_nodes, limit=600, every=0.5)

    filled = sum(g.scaling.desired for j in low for g in j.groups)
    t0 = time.perf_counter()
    await asyncio.to_thread(_forge, ["job", "run", str(files / "running.yaml")], cli_env, 1800)
    bound, _, fill_seconds = await until_converged(fc, filled, t0, limit=1800, every=0.5)
    assert fc.store is not None  # cluster_client reads the store, never a query
    await check_invariants(fc, fc.store, bound, expect_jobs=len(low), expect_desired=filled)
    least, mean = await asyncio.to_thread(_fill, fc)
    print(
        f"[e2e] fill: {bound:,} of {filled:,} bound in {fill_seconds:.1f} s; cpu allocated "
        f"least {least:.1%}, mean {mean:.1%}",
        flush=True,
    )
    if least < FILL_TARGET:
        raise BenchFailure(f"a node is only {least:.1%} allocated before the arrival")
    before = await fc.published()
    preempted_before = before.preemptions if before is not None else 0

    total = filled + replicas
    t1 = time.perf_counter()
    runner = asyncio.create_task(
        asyncio.to_thread(_forge, ["job", "run", str(files / "urgent.yaml")], cli_env, 1800)
    )
    placed, placed_seconds = await _until_placed(fc, db, replicas, total, t1, limit=1800)
    returned, _ = await runner
    bound, pending, _ = await until_converged(fc, total, t1, limit=1800, every=0.5)
    doc = await fc.published()
    problems = []
    if placed < replicas:
        problems.append(f"{replicas - placed:,} of {replicas:,} priority-90 arrivals not placed")
    try:
        await check_invariants(
            fc, fc.store, bound, expect_jobs=len(low) + len(high), expect_desired=total
        )
    except BenchFailure as err:
        problems.append(str(err))
    priority = {j.id: j.priority for j in [*low, *high]}
    min_gap = ReconcileOptions().min_gap  # the cluster was started with the defaults
    by, gap = await _evictions(env.client, fc.workflow_id, priority, min_gap)
    problems += gap[:5] + ([f"{len(gap):,} replicas released too close in all"] if gap[5:] else [])
    preempted = (doc.preemptions if doc is not None else 0) - preempted_before
    released = sum(by.values())
    if released != preempted:
        problems.append(f"{released:,} replicas released, {preempted:,} counted preempted")
    hist = await history_stats(env.client, fc.workflow_id)
    replay = await _replay_seconds(env, fc.workflow_id)
    fc.store.close()
    problems += loop_problems(hist, replay)
    return {
        "nodes": n_nodes, "low": filled, "replicas": replicas, "fill_seconds": fill_seconds,
        "fill_least": least, "fill_mean": mean, "placed": placed,
        "placed_seconds": placed_seconds, "job_run_returned": returned, "bound": bound,
        "pending": pending, "preempted": preempted, "released": released,
        "by": dict(sorted(by.items(), reverse=True)), "min_gap": min_gap,
        "task_failures": hist.task_failures, "failure_causes": hist.failure_causes,
        "longest_task": hist.longest_task, "longest_woken_by": hist.longest_woken_by,
        "tasks": hist.tasks, "runs": hist.runs, "replay": replay, "problems": problems,
    }  # fmt: skip


def e2e_report(r: dict[str, Any], command: str) -> str:
    ok = not r["problems"]
    met = ok and r["placed"] == r["replicas"] and r["task_failures"] == 0
    lines = [
        f"through the loop: {r['nodes']:,} nodes filled by {r['low']:,} priority-10..40 "
        f"replicas in {r['fill_seconds']:.1f} s (cpu allocated: least {r['fill_least']:.1%}, "
        f"mean {r['fill_mean']:.1%}); {r['replicas']:,} priority-90 single-replica jobs "
        "submitted with forge job run",
        f"- {r['placed']:,} of {r['replicas']:,} bound "
        + (
            f"{r['placed_seconds']:.1f} s after the submission began"
            if r["placed"] == r["replicas"]
            else f"when the loop had settled ({r['placed_seconds']:.1f} s after the submission)"
        )
        + f" (forge job run returned after {r['job_run_returned']:.1f} s); "
        f"{r['preempted']:,} replicas preempted"
        + "".join(f", {n:,} by priority {p}" for p, n in r["by"].items())
        + f"; settled at {r['bound']:,} bound, "
        f"{r['pending']:,} pending",
        f"- WorkflowTaskFailed {r['task_failures']}"
        + (f" {r['failure_causes']}" if r["failure_causes"] else "")
        + f"; longest "
        f"workflow task {r['longest_task'] * 1000:.0f} ms of {r['tasks']:,} "
        f"({r['longest_woken_by']}); {r['runs']} runs, longest replay "
        f"{_longest_replay(r['replay'])}",
        f"- invariants over the store, and min_gap ({r['min_gap']}) over the "
        f"{r['released']:,} replicas released by every pass (the persisted deltas): "
        + ("0 violations" if ok else "**" + "; ".join(r["problems"]) + "**"),
        "",
        "| figure | measured | target | |",
        "|---|---|---|---|",
        f"| through the loop (dev server, worker.py, `forge` CLI): {r['replicas']:,} "
        f"priority-90 replicas on {r['nodes']:,} full nodes "
        f"| {r['placed']:,} placed in **{r['placed_seconds']:.1f} s**, evicting "
        f"{r['by'].get(90, 0):,} (their victims then evicted "
        f"{r['preempted'] - r['by'].get(90, 0):,} lower ones); WorkflowTaskFailed "
        f"{r['task_failures']}, longest task {r['longest_task'] * 1000:.0f} ms; "
        f"{r['runs']} runs, longest replay {_longest_replay(r['replay'])}; "
        f"{'0 violations' if ok else str(len(r['problems'])) + ' problems'} "
        f"| all placed, 0 failed workflow tasks | **{'met' if met else 'MISSED'}** |",
        "",
        f"reproduce: nice -n 10 {command}",
    ]
    return "\n".join(lines)


async def e2e_main(nodes: int, replicas: int, command: str, *, keep: bool = False) -> int:
    return await loop_bench(
        "forge-preempt-bench-",
        partial(through_loop, n_nodes=nodes, replicas=replicas),
        partial(e2e_report, command=command),
        keep,
    )


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--replicas", type=int, default=5000, help="priority-90 replicas arriving")
    ap.add_argument("--repeat", type=int, default=3, help="runs per figure (median)")
    ap.add_argument("--no-loop", action="store_true", help="skip the pass-by-pass figure")
    ap.add_argument("--write", type=Path, metavar="DIR", help="write the input as YAML")
    ap.add_argument(
        "--e2e",
        action="store_true",
        help="through the loop: dev server, worker.py, the forge CLI (not the offline figures)",
    )
    ap.add_argument("--keep", action="store_true", help="--e2e: keep the work dir (logs, input)")
    args = ap.parse_args(argv)
    command = "python -m bench.preemption " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.e2e:
        return asyncio.run(e2e_main(args.nodes, args.replicas, command.strip(), keep=args.keep))
    nodes, low = full_cluster(args.nodes)
    high = urgent(args.replicas)
    if args.write:
        write(args.write, nodes, low, high)
    lines = [
        f"cluster: {len(nodes):,} nodes, {sum(g.scaling.desired for j in low for g in j.groups):,} "
        f"replicas of priority 10-40 filling every node's cpu; {args.replicas:,} priority-90 "
        "replicas arrive, each needing two evictions"
    ]
    o = offline(nodes, low, high, args.repeat)
    met = "met" if o["median"] <= 10 and not o["pending_high"] else "MISSED"
    lines.append(
        f"offline plan (forge plan): median {o['median']:.2f} s of "
        f"{', '.join(f'{t:.2f}' for t in o['times'])}; {o['placed']:,} placed, "
        f"{o['pending_high']:,} pending, {o['preemptions']:,} preemptions evicting "
        f"{o['victims']:,} replicas  [target <= 10 s, all placed: {met}]"
    )
    if not args.no_loop:
        b = through_budget(nodes, low, high)
        lines.append(
            f"through the loop's work budget ({MAX_WORK:,} units a pass, with a carry): "
            f"{b['placed']:,} placed in {b['passes']} passes, slowest pass "
            f"{b['slowest']:.2f} s, passes over twice the budget: {b['over_budget']}"
        )
    half_low = [
        j.with_desired("g", j.groups[0].scaling.desired // 2) for j in low
    ]  # (the cluster half full: every newcomer fits)
    on, off, ratio = overhead(nodes, half_low, high, max(args.repeat, 5))
    lines.append(
        f"nothing to preempt (half-full cluster, all fit): preemption on {on:.3f} s, off "
        f"{off:.3f} s: {ratio:+.1%}  [target <= +5%: {'met' if ratio <= 0.05 else 'MISSED'}]"
    )
    polite = urgent(args.replicas, priority=15)
    on, off, ratio = overhead(nodes, low, polite, max(args.repeat, 5))
    lines.append(
        f"nothing to preempt (full cluster, priority-15 newcomers): on {on:.3f} s, off "
        f"{off:.3f} s: {ratio:+.1%}  [target <= +5%: {'met' if ratio <= 0.05 else 'MISSED'}]"
    )
    lines += ["", f"reproduce: nice -n 10 {command.strip()}"]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
