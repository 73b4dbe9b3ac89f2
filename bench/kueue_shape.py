"""Queues at Kueue's own scheduler-performance shape, through the real loop (issue 34).

    python -m bench.kueue_shape                  # 5 cohorts x 6 queues, 15,000 workloads
    python -m bench.kueue_shape --per-queue 100  # a smaller run

Kueue's baseline (test/performance/scheduler/configs/baseline): 5 cohorts of 6
ClusterQueues, each with a nominal quota of 20 cpu and a borrowing limit of 100,
``withinClusterQueue: LowerPriority``, ``reclaimWithinCohort: Any``; per queue 350
small workloads (1 cpu, 200 ms, priority 50), 100 medium (5 cpu, 500 ms, 100) and 50
large (20 cpu, 1 s, 200): 15,000 in all. Kueue's recorded runs: about 351 s wall
(~43 admitted/s) and 58.7% of the quota in use.

Here each workload is a batch job of one run in its queue, ``sleep`` for its runtime,
on ``forge sim fleet`` nodes of NODE_CPU cpus holding the cohorts' quota between them,
through the path users take (``forge queue apply``, ``forge job run``, a
``python worker.py`` on SQLite, the dev server). One difference: Kueue creates the
workloads over about a minute; here ``forge job run`` submits them all at once.

Measured from the fleet's event log and the worker's history: the wall time to the
last completion against the capacity bound (the work over the quota), workloads
admitted per second (each started: admitted and placed), the quota in use while work
waits (cpu of runs started and not yet ended, over the cohorts' nominal total),
runs started twice (a preemption's victim runs again), failed workflow tasks.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.batch_fleet import _nodes, _until, completions, forge_env
from bench.e2e import ROOT, BenchFailure, DevServer, WorkerProcess, connect, history_stats
from forge.client.client import ensure_search_attributes
from forge.wire import contract as c

#: (class, cpu, seconds, priority, share of a queue's workloads): Kueue's baseline,
#: its priorities 50 / 100 / 200 halved into Forge's 0-100 (the same order)
CLASSES = (("small", 1, 0.2, 25, 350), ("medium", 5, 0.5, 50, 100), ("large", 20, 1.0, 100, 50))
TARGETS = {
    "admitted per second": ">= 1,000 (Kueue ~43)",
    "quota in use while work waits": ">= 95% (Kueue 58.7%)",
    "failed workflow tasks": "0",
}


def write_files(work: Path, args: argparse.Namespace) -> tuple[Path, Path, float, int]:
    """The queues file and the jobs file; returns them, the work (cpu-seconds) and
    the number of workloads."""
    queues, jobs, total, n = [], [], 0.0, 0
    scale = args.per_queue / 500
    for k in range(args.cohorts):
        for q in range(args.queues):
            name = f"c{k}q{q}"
            queues.append(
                {
                    "name": name,
                    "cohort": f"c{k}",
                    "preemption": {
                        "within_queue": "lower_priority",
                        "reclaim_within_cohort": "any",
                    },
                    "quota": {
                        "cpu": {
                            "nominal": args.nominal * 1000,
                            "borrowing_limit": args.borrow * 1000,
                        }
                    },
                }
            )
            for cls, cpu, seconds, priority, count in CLASSES:
                for i in range(max(1, round(count * scale))):
                    jobs.append(_job(f"{cls[0]}-{name}-{i:04d}", name, cpu, seconds, priority))
                    total += cpu * seconds
                    n += 1
    qfile, jfile = work / "queues.yaml", work / "jobs.yaml"
    qfile.write_text(json.dumps({"queues": queues}))  # JSON is YAML
    jfile.write_text(json.dumps(jobs))
    return qfile, jfile, total, n


def _job(name: str, queue: str, cpu: int, seconds: float, priority: int) -> dict[str, Any]:
    task = {
        "name": "t",
        "command": ["sleep", str(seconds)],
        "resources": {"cpu": cpu * 1000, "memory": 16},
    }
    return {
        "name": name,
        "type": "batch",
        "queue": queue,
        "priority": priority,
        "groups": [
            {"name": "main", "scaling": {"min": 0, "max": 1, "desired": 1}, "tasks": [task]}
        ],
    }


def _cpu_of(workload_id: str) -> int:
    return {cls[0]: cpu for cls, cpu, *_ in CLASSES}[workload_id[0]]


def analyse(events: list[dict[str, Any]], quota_cpu: int) -> dict[str, Any]:
    """Starts per second and the quota in use while work waits (first to last start)."""
    events.sort(key=lambda e: e["t"])
    starts = [e for e in events if e["event"] == "started"]
    first, last = starts[0]["t"], starts[-1]["t"]
    busy, area, at = 0, 0.0, first
    for e in events:
        if e["t"] > last:
            break
        area += busy * (e["t"] - at)
        at = e["t"]
        busy += _cpu_of(e["workload_id"]) * (1 if e["event"] == "started" else -1)
    seen: dict[str, int] = {}
    for e in starts:
        seen[e["workload_id"]] = seen.get(e["workload_id"], 0) + 1
    return {
        "starts": len(starts),
        "first_start": first,
        "last_start": last,
        "in_use": area / (max(last - first, 1e-9) * quota_cpu),
        "twice": sum(v - 1 for v in seen.values()),
        "last_exit": max(e["t"] for e in events),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="forge-kueue-shape-"))
    server = DevServer.start(work)
    fleet: subprocess.Popen[bytes] | None = None
    worker: WorkerProcess | None = None
    cluster, queue = "kueue", "forge-kueue-shape"
    db = work / "forge.db"
    env = forge_env(server.address, f"sqlite:///{db}", queue, cluster)
    quota_cpu = args.cohorts * args.queues * args.nominal
    try:
        client = await connect(server.address)
        await ensure_search_attributes(client, "default")
        worker = WorkerProcess.start(server.address, queue, f"sqlite:///{db}", work / "worker.log")
        qfile, jfile, total, n = write_files(work, args)
        await _until(lambda: '"worker running"' in (work / "worker.log").read_text(), 120, "worker")
        nodes = -(-quota_cpu // args.node_cpu)
        events = work / "events.jsonl"
        fleet = _start_fleet(args, env, nodes, work, events)
        await _until(lambda: _nodes(db, cluster) >= nodes, 120, "nodes stored")
        for argv in (["queue", "apply", str(qfile)], ["job", "run", str(jfile), "--no-wait"]):
            t0 = time.time()
            done = await asyncio.to_thread(
                subprocess.run, [sys.executable, "-m", "forge", *argv],
                cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800,
            )  # fmt: skip
            if done.returncode != 0:
                raise BenchFailure(f"forge {argv[0]} {argv[1]} failed: {done.stdout}{done.stderr}")
        submitted = time.time() - t0
        deadline = time.monotonic() + args.limit
        while (got := await asyncio.to_thread(completions, db, cluster)) < n:
            if time.monotonic() > deadline:
                raise BenchFailure(f"{got:,}/{n:,} workloads complete after {args.limit:.0f} s")
            await asyncio.sleep(0.5)
        fleet.terminate()
        fleet.wait(timeout=60)
        stats = await history_stats(client, c.workflow_id(cluster))
        found = analyse([json.loads(x) for x in events.read_text().splitlines()], quota_cpu)
        wall = found["last_exit"] - t0
        return {
            "queues": args.cohorts * args.queues,
            "workloads": n,
            "nodes": nodes,
            "quota_cpu": quota_cpu,
            "submitted_s": submitted,
            "wall_s": wall,
            "bound_s": max(total / quota_cpu, 1.0),
            "admitted_per_s": n / wall,
            "admitted_per_s_window": found["starts"] / max(found["last_start"] - t0, 1e-9),
            "in_use": found["in_use"],
            "twice": found["twice"],
            "task_failures": stats.task_failures,
            "longest_task_s": stats.longest_task,
            "runs_of_workflow": stats.runs,
        }
    finally:
        if fleet is not None and fleet.poll() is None:
            fleet.kill()
            fleet.wait()
        if worker is not None:
            worker.stop()
        server.stop()
        if args.keep:
            print(f"kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)


def _start_fleet(
    args: argparse.Namespace, env: dict[str, str], nodes: int, work: Path, events: Path
) -> subprocess.Popen[bytes]:
    """``forge sim fleet`` as a user runs it: ``nodes`` nodes of ``--node-cpu`` cpus."""
    with (work / "fleet.log").open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "forge", "sim", "fleet", "--nodes", str(nodes),
             "--cpu", str(args.node_cpu * 1000), "--memory", str(args.node_cpu * 1024),
             "--poll-every", str(args.poll), "--events", str(events)],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip


def table(r: dict[str, Any], command: str) -> str:
    met = {
        "admitted per second": r["admitted_per_s"] >= 1000,
        "quota in use while work waits": r["in_use"] >= 0.95,
        "failed workflow tasks": r["task_failures"] == 0,
    }
    said = {
        "admitted per second": f"{r['admitted_per_s']:.0f} over the whole run "
        f"({r['workloads']:,} in {r['wall_s']:.1f} s; the work needs {r['bound_s']:.1f} s "
        f"of the quota); {r['admitted_per_s_window']:.0f} from submission to the last start",
        "quota in use while work waits": f"{r['in_use']:.1%} of {r['quota_cpu']} cpu",
        "failed workflow tasks": f"{r['task_failures']} (longest task {r['longest_task_s']:.2f} s, "
        f"{r['runs_of_workflow']} runs; {r['twice']} workloads started twice: preempted)",
    }
    lines = [
        f"{r['queues']} queues, {r['workloads']:,} workloads on {r['nodes']} simulated nodes "
        f"(`forge job run` returned in {r['submitted_s']:.1f} s)",
        "",
        "| measure | target | measured | met |",
        "|---|---|---|---|",
    ]
    for name, target in TARGETS.items():
        lines.append(f"| {name} | {target} | {said[name]} | {'yes' if met[name] else 'no'} |")
    return "\n".join([*lines, "", f"reproduce: `{command}`"])


async def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cohorts", type=int, default=5)
    ap.add_argument("--queues", type=int, default=6, help="queues per cohort")
    ap.add_argument("--per-queue", type=int, default=500, help="workloads per queue (Kueue: 500)")
    ap.add_argument("--nominal", type=int, default=20, help="cpus per queue")
    ap.add_argument("--borrow", type=int, default=100, help="borrowing limit, cpus")
    ap.add_argument("--node-cpu", type=int, default=20, help="cpus per simulated node")
    ap.add_argument("--poll", type=float, default=0.1, help="the fleet's binding reads (s)")
    ap.add_argument("--limit", type=float, default=1800.0, help="give up after (s)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--json", type=Path, help="also write the raw results here")
    args = ap.parse_args(argv)
    try:
        result = await run(args)
    except BenchFailure as err:
        print(f"BENCHMARK FAILED: {err}", file=sys.stderr)
        return 1
    command = "python -m bench.kueue_shape " + " ".join(argv if argv is not None else sys.argv[1:])
    print(table(result, command.strip()))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
