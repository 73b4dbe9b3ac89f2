"""The path users take: `forge node add --file`, then `forge job run FILE` into a loop
that is planning, on a real dev server and a real worker.py.

    python -m bench.cli_path                                 # both sizes, ~10 minutes
    python -m bench.cli_path --size 5000x50000               # the GPU-exhausted shape
    python -m bench.cli_path --size 10000x30000x10 --kill 2  # with two kill -9 of the worker

``NODESxJOBS`` is the shape a user reported the loop stuck on (``bench.pending.
gpu_exhausted``, as Alibaba CSV: a quarter of the nodes with 1-8 GPUs of three models,
~15% of the pods asking 1-4 GPUs, some pinned to a model, so GPU capacity runs out
and thousands stay pending); ``NODESxJOBSxREPLICAS`` is ``pending_heavy`` with 300
request shapes and 10% unplaceable, as a JSON job file. The CLI runs as a
subprocess, exactly as a user runs it, while the loop plans what came before.

Measured: how long `forge job run` takes to return; submit -> converged (every
replica tried, nothing deferred, the bound count steady); WorkflowTaskFailed events
and the longest workflow task over every run of the history; continue-as-new count;
the worker's longest garbage collection (its own log) and peak RSS; then a node
loss (signal -> every replica of the node bound elsewhere or pending, persisted).
The invariants are checked at the end (bench.e2e.check_invariants); a violation or a
failed workflow task makes the run exit 1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.e2e import (
    BIN,
    BenchFailure,
    DevServer,
    Env,
    check_invariants,
    cluster_client,
    connect,
    history_stats,
    poll,
    stored_count,
    summary,
    until_converged,
)
from bench.pending import gpu_exhausted, pending_heavy, write_csv
from forge.client.client import ensure_search_attributes
from forge.stores.sqlite import SqliteStore

__all__ = ["main"]


def _cli_env(env: Env, name: str, db: Path) -> dict[str, str]:
    return {
        **os.environ,
        "FORGE_TEMPORAL_ADDRESS": env.server.address,
        "FORGE_CLUSTER": name,
        "FORGE_TASK_QUEUE": name,
        "FORGE_STORE": f"sqlite:///{db}",
    }


def _forge(args: list[str], cli_env: dict[str, str], timeout: float) -> tuple[float, str]:
    """Run the forge CLI; (seconds, its output). A non-zero exit fails the bench."""
    t0 = time.perf_counter()
    proc = subprocess.run(
        [str(BIN / "forge"), *args],
        env=cli_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    took = time.perf_counter() - t0
    if proc.returncode != 0:
        raise BenchFailure(f"forge {' '.join(args)} exited {proc.returncode}: {proc.stderr[-800:]}")
    return took, (proc.stdout + proc.stderr).strip()


def _gc_and_rss(log: Path, pid: int) -> tuple[float, int, float]:
    """The worker's longest logged collection (s), how many over 100 ms, peak RSS (MiB)."""
    longest, count = 0.0, 0
    for line in log.read_text(errors="replace").splitlines():
        if '"long garbage collection"' in line:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            longest = max(longest, float(rec.get("seconds", 0.0)))
            count += 1
    rss = 0.0
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                rss = int(line.split()[1]) / 1024
    except OSError:
        pass
    return longest, count, rss


async def run_size(env: Env, size: str, kills: int) -> dict[str, Any]:
    parts = [int(x) for x in size.split("x")]
    name = "cli-" + size.replace("x", "-")
    db = env.work / f"{name}.db"
    worker = env.worker(name, db)
    files = env.work / name
    if len(parts) == 2:
        nodes, pods = parts
        w = gpu_exhausted(nodes, pods)
        nodes_file, jobs_file = write_csv(w, files)
        total = pods
    else:
        nodes, pods, replicas = parts
        w = pending_heavy(nodes, pods, shapes=300, replicas=replicas)
        nodes_file, _ = write_csv(w, files)
        jobs_file = files / "jobs.json"
        jobs_file.write_text(json.dumps([j.model_dump(mode="json") for j in w.jobs]))
        total = pods * replicas
    cli_env = _cli_env(env, name, db)
    fc = cluster_client(env, name, name, db)
    added, _ = _forge(["node", "add", "--file", str(nodes_file)], cli_env, timeout=600)
    await poll(lambda: summary(fc), lambda s: s.nodes == nodes, limit=600, every=0.5)

    # submit while the loop is planning: the first batches are placed as the rest arrive
    t0 = time.perf_counter()
    runner = asyncio.create_task(
        asyncio.to_thread(_forge, ["job", "run", str(jobs_file)], cli_env, 1800)
    )
    killed = 0
    while kills and killed < kills:
        await asyncio.sleep(8.0 if killed == 0 else 12.0)  # a fault's timing, not a sync
        worker.kill9()
        killed += 1
        worker = env.worker(name, db)
    returned, said = await runner
    submit_done = time.perf_counter()

    bound, pending, converged = await until_converged(fc, total, t0, limit=1800, every=0.25)
    store = SqliteStore(db)
    await check_invariants(fc, store, bound)

    # node loss: the busiest node's replicas bound elsewhere (or pending), persisted
    counts: dict[str, int] = {}
    for a in store.assignments(name, limit=10_000_000):
        counts[a.node] = counts.get(a.node, 0) + 1
    victim = max(sorted(counts), key=lambda n: counts[n])
    signalled = time.perf_counter()
    await fc.node_lost(victim)  # the signal `forge node lost` sends, without its start-up
    await poll(
        lambda: asyncio.sleep(0, stored_count(db, name, victim)),
        lambda n: n == 0,
        limit=120,
        every=0.02,
    )
    loss = time.perf_counter() - signalled
    hist = await history_stats(env.client, fc.workflow_id)
    replay = await _replay_seconds(env, fc.workflow_id)
    longest_gc, long_gcs, rss = _gc_and_rss(env.work / f"{name}.log", worker.proc.pid)
    store.close()
    if hist.task_failures and not kills:
        raise BenchFailure(f"{name}: {hist.task_failures} WorkflowTaskFailed events")
    return {
        "size": size,
        "nodes": nodes,
        "replicas": total,
        "node_add_seconds": round(added, 2),
        "job_run_returned": round(returned, 2),
        "job_run_said": said.splitlines()[-1] if said else "",
        "submitted_seconds": round(submit_done - t0, 2),
        "converged_seconds": round(converged, 2),
        "bound": bound,
        "pending": pending,
        "kills": kills,
        "task_failures": hist.task_failures,
        "longest_task": round(hist.longest_task, 3),
        "longest_woken_by": hist.longest_woken_by,
        "tasks": hist.tasks,
        "runs": hist.runs,
        "history_events": sum(hist.events),
        "node_loss": {"node": victim, "replicas": counts[victim], "seconds": round(loss, 3)},
        "replay_seconds": replay,
        "longest_gc": longest_gc,
        "gcs_over_100ms": long_gcs,
        "worker_rss_mib": round(rss),
    }  # fmt: skip


async def _replay_seconds(env: Env, workflow_id: str) -> list[dict[str, Any]]:
    """How long replaying each run of the history takes (what a worker taking the run
    over does before it can go on), newest run first: each in a fresh process set up
    as worker.py is (the collector governor on), with any failure it met."""
    out = []
    run_id: str | None = (await env.client.get_workflow_handle(workflow_id).describe()).run_id
    while run_id:
        handle = env.client.get_workflow_handle(workflow_id, run_id=run_id)
        history = await handle.fetch_history()
        path = env.work / f"replay-{run_id}.json"
        await asyncio.to_thread(path.write_text, history.to_json())
        proc = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "bench.cli_path", "--replay", str(path)],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        lines = proc.stdout.strip().splitlines()
        if proc.returncode != 0 or not lines:
            out.append({"run": run_id, "seconds": None, "failure": proc.stderr[-300:]})
        else:
            out.append({"run": run_id, **json.loads(lines[-1])})
        first = history.events[0].workflow_execution_started_event_attributes
        run_id = first.continued_execution_run_id or None
    return out


async def _replay_one(path: Path) -> dict[str, Any]:
    import gc

    from temporalio.client import WorkflowHistory
    from temporalio.worker import Replayer

    from forge.wire.codec import data_converter
    from worker import GcGovernor
    from workflows.cluster import ClusterWorkflow

    text = await asyncio.to_thread(path.read_text)
    history = WorkflowHistory.from_json(path.stem, json.loads(text))
    gc.freeze()
    stop = asyncio.Event()
    governor = asyncio.create_task(GcGovernor().run(stop))
    replayer = Replayer(workflows=[ClusterWorkflow], data_converter=data_converter())
    t0 = time.perf_counter()
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    took = time.perf_counter() - t0
    stop.set()
    await governor
    failure = None if result.replay_failure is None else str(result.replay_failure)[:300]
    return {"seconds": round(took, 2), "events": len(history.events), "failure": failure}


def _longest_replay(runs: list[dict[str, Any]]) -> str:
    if any(r.get("failure") for r in runs):
        return "**failed**: " + next(str(r["failure"])[:60] for r in runs if r.get("failure"))
    return f"{max(float(r['seconds']) for r in runs):.1f} s"


def report(rows: list[dict[str, Any]], command: str) -> str:
    out = [
        "| run | `forge job run` returned | submit → converged | bound / pending "
        "| WorkflowTaskFailed | longest task | runs | longest replay | longest GC (>100 ms) "
        "| worker RSS | node loss |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        kill = f", {r['kills']} x kill -9" if r["kills"] else ""
        loss = r["node_loss"]
        out.append(
            f"| {r['nodes']:,} nodes / {r['replicas']:,} replicas{kill} "
            f"| {r['job_run_returned']:.1f} s | {r['converged_seconds']:.1f} s "
            f"| {r['bound']:,} / {r['pending']:,} | {r['task_failures']} "
            f"| {r['longest_task'] * 1000:.0f} ms of {r['tasks']} | {r['runs']} "
            f"| {_longest_replay(r['replay_seconds'])} "
            f"| {r['longest_gc'] * 1000:.0f} ms ({r['gcs_over_100ms']}) "
            f"| {r['worker_rss_mib']:,} MiB "
            f"| {loss['seconds'] * 1000:.0f} ms for {loss['replicas']} |"
        )
    out.append("")
    out.append(f"reproduce: {command}")
    return "\n".join(out)


async def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", action="append", help="NODESxJOBS or NODESxJOBSxREPLICAS")
    ap.add_argument("--kill", type=int, default=0, help="kill -9 the worker this many times")
    ap.add_argument("--json", type=Path, help="also write the raw results here")
    ap.add_argument("--replay", type=Path, help=argparse.SUPPRESS)  # one history, timed
    ap.add_argument("--keep", action="store_true", help="keep the work dir (histories, logs)")
    args = ap.parse_args(argv)
    if args.replay is not None:
        print(json.dumps(await _replay_one(args.replay)))
        return 0
    sizes = args.size or ["5000x50000", "10000x30000x10"]
    work = Path(tempfile.mkdtemp(prefix="forge-cli-bench-"))
    server = DevServer.start(work)
    rows: list[dict[str, Any]] = []
    env: Env | None = None
    try:
        client = await connect(server.address)
        await ensure_search_attributes(client, "default")
        env = Env(server, client, work)
        for size in sizes:
            row = await run_size(env, size, args.kill)
            print(json.dumps(row), flush=True)
            rows.append(row)
    except BenchFailure as err:
        print(f"BENCHMARK FAILED: {err} (logs in {work})", file=sys.stderr)
        return 1
    finally:
        for w in env.workers if env is not None else []:
            if w.proc.poll() is None:
                w.proc.send_signal(signal.SIGKILL)
                w.proc.wait()
        server.stop()
    command = "python -m bench.cli_path " + " ".join(argv if argv is not None else sys.argv[1:])
    print(report(rows, command.strip()))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    if args.keep:
        print(f"kept: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
