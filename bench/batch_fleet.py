"""Batch throughput through the real loop, with a simulated fleet (issue 32).

    python -m bench.batch_fleet                                  # 1,000 nodes, 100,000 runs
    python -m bench.batch_fleet --nodes 100 --jobs 100           # a smaller run

The path users take: ``temporal server start-dev``, a ``python worker.py`` process on
an SQLite store, ``forge sim fleet`` (a process acting as N nodes' agents: each
replica bound to them reported running, a ``sleep S`` task exited 0 after S s) and
``forge job run FILE`` submitting JOBS batch jobs of REPLICAS runs each (``sleep 1``
.. ``sleep 5`` by job), each run 1 cpu on nodes of SLOTS cpus: room for NODES x SLOTS
runs at once.

Measured from the fleet's event log (every start and exit, timed by the fleet) and
the worker's history:

* utilisation while work is pending: the time-integral of runs started and not yet
  exited, over capacity, from the first start to the last start (after which no
  work waits); and of runs *bound* (exited runs hold their room until released);
* makespan against the capacity bound (total work / slots, or the longest run);
* time from a run's exit to the next start on that node while work waits (p50, p99);
* ordinals started twice (must be 0) and WorkflowTaskFailed events (must be 0).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from bench.e2e import ROOT, BenchFailure, DevServer, WorkerProcess, connect, history_stats
from forge.client.client import ensure_search_attributes
from forge.wire import contract as c

TARGETS = {
    "utilisation": ">= 95%",
    "makespan": "<= 1.10x the capacity bound",
    "p99 exit to next start": "<= 1 s",
    "ordinals run twice": "0",
    "failed workflow tasks": "0",
}


def jobs_file(path: Path, jobs: int, replicas: int) -> float:
    """Write the job file; returns the total work in run-seconds."""
    specs, work = [], 0.0
    for j in range(jobs):
        seconds = 1 + j % 5
        work += seconds * replicas
        specs.append(
            {
                "name": f"b{j:05d}",
                "type": "batch",
                "groups": [
                    {
                        "name": "main",
                        "scaling": {"min": 0, "max": replicas, "desired": replicas},
                        "tasks": [
                            {
                                "name": "t",
                                "command": ["sleep", str(seconds)],
                                "resources": {"cpu": 1000, "memory": 256},
                            }
                        ],
                    }
                ],
            }
        )
    path.write_text(json.dumps(specs))  # JSON is YAML
    return work


def forge_env(address: str, store: str, queue: str, cluster: str) -> dict[str, str]:
    return {
        **os.environ,
        "FORGE_TEMPORAL_ADDRESS": address,
        "FORGE_STORE": store,
        "FORGE_TASK_QUEUE": queue,
        "FORGE_CLUSTER": cluster,
    }


def start_fleet(
    args: argparse.Namespace, env: dict[str, str], log: Path, events: Path
) -> subprocess.Popen[bytes]:
    """``forge sim fleet`` as a user runs it: nodes of ``--slots`` cpus each."""
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "forge", "sim", "fleet", "--nodes", str(args.nodes),
             "--cpu", str(args.slots * 1000), "--memory", str(args.slots * 1024),
             "--poll-every", str(args.poll), "--events", str(events)],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip


def completions(db: Path, cluster: str) -> int:
    with sqlite3.connect(db) as conn:
        row = conn.execute("SELECT COUNT(*) FROM completions WHERE cluster = ?", (cluster,))
        return int(row.fetchone()[0])


def bound_samples(samples: list[tuple[float, int]], start: float, end: float) -> float:
    """Mean of the sampled bound counts within [start, end]."""
    inside = [b for t, b in samples if start <= t <= end]
    return statistics.fmean(inside) if inside else 0.0


def analyse(events: list[dict[str, Any]], slots: int) -> dict[str, Any]:
    """What the fleet's event log says: utilisation while work waits, the exit to
    next start latency per node, ordinals started twice."""
    events.sort(key=lambda e: e["t"])
    starts = [e for e in events if e["event"] == "started"]
    exits = [e for e in events if e["event"] == "exited"]
    twice = sum(n - 1 for n in Counter(e["workload_id"] for e in starts).values() if n > 1)
    first, last_start = starts[0]["t"], starts[-1]["t"]
    busy, area, at = 0, 0.0, first
    for e in events:  # the time-integral of runs started and not yet exited
        if e["t"] > last_start:
            break
        area += busy * (e["t"] - at)
        at = e["t"]
        busy += 1 if e["event"] == "started" else -1
    window = max(last_start - first, 1e-9)
    gaps: list[float] = []
    waiting_exits: dict[str, list[float]] = defaultdict(list)
    for e in events:  # an exit, then the next start on that node (while work waits)
        if e["t"] > last_start:
            break
        if e["event"] == "exited":
            waiting_exits[e["node"]].append(e["t"])
        elif waiting_exits[e["node"]]:
            gaps.append(e["t"] - waiting_exits[e["node"]].pop(0))
    gaps.sort()
    return {
        "started": len(starts),
        "exited": len(exits),
        "twice": twice,
        "utilisation_running": area / (window * slots),
        "first_start": first,
        "last_start": last_start,
        "last_exit": exits[-1]["t"] if exits else last_start,
        "gap_p50": gaps[len(gaps) // 2] if gaps else 0.0,
        "gap_p99": gaps[min(len(gaps) - 1, int(len(gaps) * 0.99))] if gaps else 0.0,
        "gaps": len(gaps),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="forge-batch-fleet-"))
    server = DevServer.start(work)
    procs: list[subprocess.Popen[bytes]] = []
    worker: WorkerProcess | None = None
    cluster, queue = "fleet", "forge-batch-fleet"
    db = work / "forge.db"
    store = f"sqlite:///{db}"
    env = forge_env(server.address, store, queue, cluster)
    runs = args.jobs * args.replicas
    slots = args.nodes * args.slots
    try:
        client = await connect(server.address)
        await ensure_search_attributes(client, "default")
        worker = WorkerProcess.start(server.address, queue, store, work / "worker.log")
        files = work / "jobs.yaml"
        total_work = jobs_file(files, args.jobs, args.replicas)
        events = work / "events.jsonl"
        log = work / "worker.log"
        await _until(lambda: '"worker running"' in log.read_text(), 120, "the worker up")
        fleet = start_fleet(args, env, work / "fleet.log", events)
        procs.append(fleet)
        await _until(
            lambda: "nodes registered" in (work / "fleet.log").read_text(), 120, "fleet up"
        )
        await _until(lambda: _nodes(db, cluster) >= args.nodes, 120, "nodes stored")
        t0 = time.time()
        submit = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "forge", "job", "run", str(files), "--no-wait"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800,
        )  # fmt: skip
        if submit.returncode != 0:
            raise BenchFailure(f"forge job run failed: {submit.stdout}{submit.stderr}")
        submitted = time.time() - t0
        samples: list[tuple[float, int]] = []
        deadline = time.monotonic() + args.limit
        while True:
            done = await asyncio.to_thread(completions, db, cluster)
            samples.append((time.time(), await asyncio.to_thread(_bound, db, cluster)))
            if done >= runs:
                break
            if time.monotonic() > deadline:
                raise BenchFailure(f"{done:,}/{runs:,} runs complete after {args.limit:.0f} s")
            await asyncio.sleep(0.5)
        finished = time.time()
        fleet.send_signal(signal.SIGTERM)
        fleet.wait(timeout=60)
        stats = await history_stats(client, c.workflow_id(cluster))
        found = analyse([json.loads(line) for line in events.read_text().splitlines()], slots)
        longest = max(1 + j % 5 for j in range(args.jobs))  # seconds: the longest run
        bound = max(total_work / slots, float(longest))
        return {
            "nodes": args.nodes,
            "slots": slots,
            "runs": runs,
            "submitted_s": submitted,
            "makespan_s": finished - t0,
            "makespan_fleet_s": found["last_exit"] - t0,
            "capacity_bound_s": bound,
            "utilisation_running": found["utilisation_running"],
            "utilisation_bound": bound_samples(samples, found["first_start"], found["last_start"])
            / slots,
            "gap_p50_s": found["gap_p50"],
            "gap_p99_s": found["gap_p99"],
            "gaps": found["gaps"],
            "twice": found["twice"],
            "started": found["started"],
            "task_failures": stats.task_failures,
            "runs_of_workflow": stats.runs,
            "longest_task_s": stats.longest_task,
            "workflow_tasks": stats.tasks,
        }
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        if worker is not None:
            worker.stop()
        server.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept {work}", file=sys.stderr)


def _nodes(db: Path, cluster: str) -> int:
    if not db.exists():
        return 0
    try:
        with sqlite3.connect(db) as conn:
            row = conn.execute("SELECT COUNT(*) FROM nodes WHERE cluster = ?", (cluster,))
            return int(row.fetchone()[0])
    except sqlite3.Error:  # the worker has not created its tables yet
        return 0


def _bound(db: Path, cluster: str) -> int:
    with sqlite3.connect(db) as conn:
        row = conn.execute("SELECT COUNT(*) FROM assignments WHERE cluster = ?", (cluster,))
        return int(row.fetchone()[0])


async def _until(check: Any, limit: float, what: str) -> None:
    end = time.monotonic() + limit
    while not check():
        if time.monotonic() > end:
            raise BenchFailure(f"never {what} within {limit:.0f} s")
        await asyncio.sleep(0.2)


def table(r: dict[str, Any], command: str) -> str:
    met = {
        "utilisation": r["utilisation_running"] >= 0.95,
        "makespan": r["makespan_fleet_s"] <= 1.10 * r["capacity_bound_s"],
        "p99 exit to next start": r["gap_p99_s"] <= 1.0,
        "ordinals run twice": r["twice"] == 0,
        "failed workflow tasks": r["task_failures"] == 0,
    }
    said = {
        "utilisation": f"{r['utilisation_running']:.1%} running, "
        f"{r['utilisation_bound']:.1%} bound",
        "makespan": f"{r['makespan_fleet_s']:.1f} s against a bound of "
        f"{r['capacity_bound_s']:.1f} s ({r['makespan_fleet_s'] / r['capacity_bound_s']:.2f}x)",
        "p99 exit to next start": f"p50 {r['gap_p50_s']:.2f} s, p99 {r['gap_p99_s']:.2f} s "
        f"({r['gaps']:,} gaps)",
        "ordinals run twice": f"{r['twice']:,} ({r['started']:,} starts of {r['runs']:,} runs)",
        "failed workflow tasks": f"{r['task_failures']:,} (longest task "
        f"{r['longest_task_s']:.2f} s, {r['workflow_tasks']:,} tasks in "
        f"{r['runs_of_workflow']} runs)",
    }
    lines = [
        f"{r['nodes']:,} simulated nodes, {r['slots']:,} slots, {r['runs']:,} batch runs "
        f"(`forge job run` returned in {r['submitted_s']:.1f} s)",
        "",
        "| measure | target | measured | met |",
        "|---|---|---|---|",
    ]
    for name, target in TARGETS.items():
        lines.append(f"| {name} | {target} | {said[name]} | {'yes' if met[name] else 'no'} |")
    lines += ["", f"reproduce: `{command}`"]
    return "\n".join(lines)


async def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--slots", type=int, default=20, help="runs at once per node")
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--replicas", type=int, default=100)
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
    command = "python -m bench.batch_fleet " + " ".join(argv if argv is not None else sys.argv[1:])
    print(table(result, command.strip()))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
