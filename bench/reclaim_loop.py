"""Reclaim and fair share through the loop (issue 34), as users cause them.

    python -m bench.reclaim_loop                     # 500 nodes, ~3 minutes
    python -m bench.reclaim_loop --nodes 2000

A dev server, a real ``worker.py`` on SQLite and the ``forge`` CLI as a subprocess
(bench.cli_path's): ``forge cluster start``, ``forge node add --file``, ``forge queue
apply`` of two queues ``b`` and ``r`` in one cohort, each owning half the cluster's cpu
and memory. Then, each step waiting for the loop to settle:

1. **borrow**: ``b`` runs priority-50 jobs asking the whole cluster (1-core replicas):
   it holds its half and borrows ``r``'s.
2. **reclaim**: ``r`` runs priority-10 jobs asking exactly its nominal half. Measured:
   seconds from the ``forge job run`` until all of r's replicas are bound in the store
   (polled with SQL, never a query; target: 2 s), and ``b``'s replicas evicted for
   them (the minimum is one per replica: every replica is one core).
3. **fair share**: a third queue ``c`` owning nothing is applied, and ``c`` runs the
   same jobs as ``b``: measured, the seconds until the loop settles and the replicas
   each queue holds then. ``b`` borrows nothing after step 2, so by Kueue's rule there
   is nothing to take (``c``'s share stays 0%): the row checks that no queue within its
   nominal loses a replica to a fair-share claim.

After each step: invariants over the store (bench.e2e.check_invariants), and at the
end WorkflowTaskFailed and every run of the history replayed. Exit 1 on a violation,
a replay failure, a workflow task failure other than the server's own, or r's nominal
not bound once the loop settles.
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from bench.cli_path import _cli_env, _forge, _longest_replay, _replay_seconds, loop_problems
from bench.e2e import (
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
from bench.preemption import _job
from forge.core.models import Job, Node

NODE_CPU, NODE_MEM = 8000, 32768
PER_JOB = 50


def _jobs(prefix: str, replicas: int, priority: int, queue: str) -> list[Job]:
    out = []
    for i in range(-(-replicas // PER_JOB)):
        n = min(PER_JOB, replicas - i * PER_JOB)
        job = _job(f"{prefix}{i:04d}", n, 1000, 1024, priority)
        out.append(job.model_copy(update={"queue": queue}))
    return out


def _dump(path: Path, items: list[Any]) -> Path:
    docs = [i.model_dump(mode="json", exclude_defaults=True) for i in items]
    path.write_text(yaml.safe_dump(docs, sort_keys=False))
    return path


def _queues(path: Path, nodes: int, third: bool) -> Path:
    half = {"cpu": {"nominal": nodes * NODE_CPU // 2}, "memory": {"nominal": nodes * NODE_MEM // 2}}
    queues = [{"name": q, "cohort": "team", "quota": half} for q in ("b", "r")]
    if third:
        zero = {"cpu": {"nominal": 0}, "memory": {"nominal": 0}}
        queues.append({"name": "c", "cohort": "team", "quota": zero})
    path.write_text(yaml.safe_dump({"queues": queues}, sort_keys=False))
    return path


async def run(env: Env, n_nodes: int) -> dict[str, Any]:
    name = f"reclaim-{n_nodes}"
    db, files = env.work / f"{name}.db", env.work / "input"
    files.mkdir(parents=True, exist_ok=True)
    env.worker(name, db)
    cli = _cli_env(env, name, f"sqlite:///{db}")
    fc = cluster_client(env, name, name, db)
    assert fc.store is not None  # cluster_client reads the store, never a query
    nodes = [
        Node.model_validate({"id": f"n{i:05d}", "cpu": NODE_CPU, "memory": NODE_MEM})
        for i in range(n_nodes)
    ]

    def forge(*args: str | Path) -> Any:  # the CLI as a user runs it, off the loop
        return asyncio.to_thread(_forge, [str(a) for a in args], cli, 1800)

    await forge("cluster", "start")
    await forge("node", "add", "--file", _dump(files / "n.yaml", nodes))
    await poll(lambda: summary(fc), lambda s: s.nodes == n_nodes, limit=600, every=0.5)
    await forge("queue", "apply", _queues(files / "q.yaml", n_nodes, False))
    cores, half = n_nodes * NODE_CPU // 1000, n_nodes * NODE_CPU // 2000
    b, r = _jobs("b", cores, 50, "b"), _jobs("r", half, 10, "r")

    t0 = time.perf_counter()
    await forge("job", "run", _dump(files / "b.yaml", b))
    bound, _, borrow_s = await until_converged(fc, cores, t0, limit=1800, every=0.25)
    await check_invariants(fc, fc.store, bound, expect_jobs=len(b), expect_desired=cores)
    print(f"[reclaim] b holds {bound:,} of {cores:,} cores after {borrow_s:.1f} s", flush=True)

    t1 = time.perf_counter()
    runner = asyncio.create_task(forge("job", "run", _dump(files / "r.yaml", r)))
    got = await poll(
        lambda: asyncio.to_thread(stored_count, db, name, job_prefix="r"),
        lambda n: n >= half,
        limit=300,
        every=0.05,
    )
    reclaim_s = time.perf_counter() - t1
    await runner
    total = cores + half
    bound, pending, _ = await until_converged(fc, total, t1, limit=1800, every=0.25)
    b_left = await asyncio.to_thread(stored_count, db, name, job_prefix="b")
    await check_invariants(fc, fc.store, bound, expect_jobs=len(b) + len(r), expect_desired=total)
    print(
        f"[reclaim] r {got:,} of {half:,} bound {reclaim_s:.2f} s after its job run; "
        f"b evicted {cores - b_left:,}",
        flush=True,
    )

    await forge("queue", "apply", _queues(files / "q3.yaml", n_nodes, True))
    c = _jobs("c", cores, 50, "c")
    t2 = time.perf_counter()
    await forge("job", "run", _dump(files / "c.yaml", c))
    everything = total + cores
    bound, _, settle_s = await until_converged(fc, everything, t2, limit=1800, every=0.25)
    held = {
        q: await asyncio.to_thread(stored_count, db, name, job_prefix=q) for q in ("b", "r", "c")
    }
    await check_invariants(
        fc, fc.store, bound, expect_jobs=len(b) + len(r) + len(c), expect_desired=everything
    )
    hist = await history_stats(env.client, fc.workflow_id)
    replay = await _replay_seconds(env, fc.workflow_id)
    fc.store.close()
    problems = []
    if got < half:
        problems.append(f"r has {got:,} of its {half:,} nominal bound once the loop settled")
    if held["b"] < half or held["r"] < half:
        problems.append(f"a queue within its nominal lost replicas to a fair-share claim: {held}")
    problems += loop_problems(hist, replay)
    return {
        "nodes": n_nodes, "cores": cores, "borrow_seconds": round(borrow_s, 2),
        "reclaim_seconds": round(reclaim_s, 2), "reclaimed": got, "nominal": half,
        "evicted": cores - b_left, "pending_after_reclaim": pending,
        "fair_settle_seconds": round(settle_s, 2), "held_after_c": held,
        "task_failures": hist.task_failures, "longest_task": round(hist.longest_task, 3),
        "runs": hist.runs, "replay": _longest_replay(replay), "problems": problems,
    }  # fmt: skip


def report(row: dict[str, Any]) -> str:
    held = row["held_after_c"]
    return (
        "| nodes (cores) | r's nominal back | evicted (minimum) | b, r, c after c "
        "| failed tasks | longest task | runs (replay) |\n|---|---|---|---|---|---|---|\n"
        f"| {row['nodes']:,} ({row['cores']:,}) | {row['reclaimed']:,} of {row['nominal']:,} in "
        f"{row['reclaim_seconds']} s (target 2 s) | {row['evicted']:,} ({row['nominal']:,}) "
        f"| {held['b']:,}, {held['r']:,}, {held['c']:,} | {row['task_failures']} "
        f"| {row['longest_task']} s | {row['runs']} ({row['replay']}) |\n\n"
        "Reproduce: `python -m bench.reclaim_loop " + shlex.join(sys.argv[1:]) + "`"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=500)
    ap.add_argument("--keep", action="store_true", help="keep the work dir (histories, logs)")
    args = ap.parse_args(argv)
    scenario = partial(run, n_nodes=args.nodes)
    return asyncio.run(loop_bench("forge-reclaim-bench-", scenario, report, args.keep))


if __name__ == "__main__":
    sys.exit(main())
