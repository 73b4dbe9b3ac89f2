"""The path users take: `forge node add --file`, then `forge job run FILE` into a loop
that is planning, on a real dev server and a real worker.py.

    python -m bench.cli_path                                 # both sizes, ~10 minutes
    python -m bench.cli_path --size 5000x50000               # the GPU-exhausted shape
    python -m bench.cli_path --size 10000x30000x10 --kill 2  # with two kill -9 of the worker
    python -m bench.cli_path --size 5000x50000 --store postgres --pg-restart

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

Chaos (RELIABILITY.md, "Chaos at scale"): ``--kill N`` kill -9s the worker N times while
the loop converges, starting a new worker.py after each, as a supervisor would;
``--store postgres`` runs the worker on a PostgreSQL database the script creates and
drops (``--pg``: the server), and ``--pg-restart`` stops PostgreSQL once mid-convergence
and starts it again PG_DOWN seconds later (pg_ctlcluster). Of n faults, the i-th comes
once i/(n+2) of the replicas are bound and more than at the fault before, whatever the
size and the machine's speed. Nothing else is
done by hand: the CLI, the worker and the loop must carry on by themselves.

After convergence, and again after the node loss, invariants 1-6 and 8 are checked
over the store (bench.e2e.check_invariants: capacity, GPUs, bound once and ⊆ desired,
every pending replica fits nowhere and says why, nothing on a lost node, store ==
workflow state, no job or replica lost) and every run of the history (reset runs
too) is replayed with the current code (7). A violation, a replay failure or a
workflow task failure other than the server's own (UNHANDLED_COMMAND,
RESET_WORKFLOW) makes the run exit 1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

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
from forge.client.client import ForgeClient, ensure_search_attributes
from forge.core.quota import QueueSpec
from forge.stores.postgres_conn import parse_postgres_url
from forge.wire.contract import LoopStatus, Summary

__all__ = ["main"]

#: Where --store postgres makes its database (the fault tests' server; trust auth).
PG_DEFAULT = os.environ.get("FORGE_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
PG_DOWN = 3.0  # seconds PostgreSQL stays stopped under --pg-restart (the fault's length)
SETTLED_GAP = 10.0  # seconds between faults once the loop has settled (see _faults)

#: Workflow task failures the server causes in normal operation (a completion refused
#: because new events arrived; a reset): not the loop's.
BENIGN_TASK_FAILURES = ("UNHANDLED_COMMAND", "RESET_WORKFLOW")


def loop_problems(hist: Any, replay: list[dict[str, Any]]) -> list[str]:
    """What a loop bench fails on besides its own checks: a workflow task failure other
    than the server's own (``hist``: bench.e2e.history_stats), a run that does not
    replay (``replay``: :func:`_replay_seconds`)."""
    problems = []
    failed = {k: n for k, n in hist.failure_causes.items() if k not in BENIGN_TASK_FAILURES}
    if failed:
        problems.append(f"WorkflowTaskFailed events {failed}")
    if any(r.get("failure") for r in replay):
        problems.append(f"a run's history does not replay: {replay}")
    return problems


def _cli_env(env: Env, name: str, store: str) -> dict[str, str]:
    return {
        **os.environ,
        "FORGE_TEMPORAL_ADDRESS": env.server.address,
        "FORGE_CLUSTER": name,
        "FORGE_TASK_QUEUE": name,
        "FORGE_STORE": store,
    }


def _pg_database(base: str, name: str) -> str:
    """A fresh database on ``base``'s server; the store URL naming it."""
    with psycopg.connect(base, autocommit=True, connect_timeout=10) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return urlunsplit(urlsplit(base)._replace(path="/" + name))


def _pg_drop(base: str, name: str) -> None:
    with psycopg.connect(base, autocommit=True, connect_timeout=30) as admin:
        admin.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


def _pg_ctl(action: str) -> None:
    version = sorted(os.listdir("/etc/postgresql"))[-1]
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", action],
        check=True,
        timeout=120,
        capture_output=True,
    )


def _pg_accepts(url: str) -> bool:
    try:
        psycopg.connect(parse_postgres_url(url)[0], connect_timeout=2).close()
        return True
    except psycopg.OperationalError:
        return False


def _on_node(store: str, cluster: str, node: str) -> int:
    """Bindings persisted on ``node`` (plain SQL: cheap enough to poll)."""
    if store.startswith("sqlite:///"):
        return stored_count(Path(store.removeprefix("sqlite:///")), cluster, node)
    with psycopg.connect(parse_postgres_url(store)[0], connect_timeout=5) as conn:
        row = conn.execute(
            "SELECT COUNT(*) FROM assignments WHERE cluster = %s AND node = %s", (cluster, node)
        ).fetchone()
        return int(row[0]) if row else 0


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


def dealt(w: Any, n: int, files: Path) -> tuple[dict[str, QueueSpec], Path, Path]:
    """``n`` queues in cohorts of four, each owning a ``n``-th of 90% of the cluster's
    cpu and memory and a ``n``-th of each GPU model's devices, ``w``'s jobs dealt to
    them in turn: the queues, the queue file and the job file (JSON) a user would
    apply and run. A cohort lends only among its four, so where its jobs want more
    than its share they wait ``queued``."""
    cpu, memory = sum(x.cpu for x in w.nodes), sum(x.memory for x in w.nodes)
    models: dict[str, int] = {}
    for node in w.nodes:
        for d in node.gpus:
            models[d.model] = models.get(d.model, 0) + 1
    quota = {
        "cpu": {"nominal": cpu * 9 // 10 // n},
        "memory": {"nominal": memory * 9 // 10 // n},
        "gpu": {m: {"nominal": count // n} for m, count in sorted(models.items())},
    }
    specs = {
        f"q{i:02d}": QueueSpec.model_validate(
            {"name": f"q{i:02d}", "cohort": f"c{i // 4}", "quota": quota}
        )
        for i in range(n)
    }
    queues_file = files / "queues.json"
    declared = [q.model_dump(mode="json") for q in specs.values()]
    queues_file.write_text(json.dumps({"queues": declared}))
    jobs = [j.model_copy(update={"queue": f"q{k % n:02d}"}) for k, j in enumerate(w.jobs)]
    jobs_file = files / "jobs-queued.json"
    docs = [j.model_dump(mode="json", exclude_defaults=True) for j in jobs]  # (<16 MiB)
    jobs_file.write_text(json.dumps(docs))
    return specs, queues_file, jobs_file


async def _no_more_preemptions(fc: ForgeClient, quiet: float = 10.0) -> tuple[int, int]:
    """Wait until the loop has preempted nothing for ``quiet`` seconds (queues settle
    their reclaims over passes); (bound, pending) then."""
    last, since, end = -1, time.monotonic(), time.monotonic() + 600
    while True:
        doc = await fc.published()
        count = doc.preemptions if doc is not None else 0
        if count != last:
            last, since = count, time.monotonic()
        elif time.monotonic() - since >= quiet and doc is not None:
            return doc.summary.bound, doc.summary.pending
        if time.monotonic() > end:
            raise BenchFailure(f"still preempting after 600 s ({count} preemptions)")
        await asyncio.sleep(0.5)


async def run_size(
    env: Env, size: str, kills: int, store: str, pg_restart: bool, queues: int = 0
) -> dict[str, Any]:
    """One size, on the store URL ``store`` (its database is fresh); with ``queues``,
    its jobs dealt to that many queues with quotas (:func:`dealt`)."""
    parts = [int(x) for x in size.split("x")]
    name = "cli-" + size.replace("x", "-")
    env.worker(name, store)
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
    cli_env = _cli_env(env, name, store)
    fc = cluster_client(env, name, name, store)
    added, _ = _forge(["node", "add", "--file", str(nodes_file)], cli_env, timeout=600)
    specs: dict[str, QueueSpec] = {}
    if queues:  # (the cluster's run is up once nodes are added)
        specs, queues_file, jobs_file = dealt(w, queues, files)
        _forge(["queue", "apply", str(queues_file)], cli_env, timeout=120)
    await poll(lambda: summary(fc), lambda s: s.nodes == nodes, limit=600, every=0.5)

    # submit while the loop is planning: the first batches are placed as the rest arrive
    t0 = time.perf_counter()
    runner = asyncio.create_task(
        asyncio.to_thread(_forge, ["job", "run", str(jobs_file)], cli_env, 1800)
    )
    faults = await _faults(env, fc, name, store, total, t0, kills, pg_restart)
    returned, said = await runner
    submit_done = time.perf_counter()

    bound, pending, converged = await until_converged(fc, total, t0, limit=1800, every=0.25)
    if queues:  # reclaims go on a few passes once the bound count is steady
        bound, pending = await _no_more_preemptions(fc)
    published = await fc.published()
    queued = sum(v.queued for v in published.queues) if published is not None else 0
    reads = fc.store
    assert reads is not None  # cluster_client reads the store, never a query
    check = partial(
        check_invariants, fc, reads, expect_jobs=len(w.jobs), expect_desired=total, queues=specs
    )
    await check(bound)

    # node loss: the busiest node's replicas bound elsewhere (or pending), persisted
    counts: dict[str, int] = {}
    for a in reads.assignments(name, limit=10_000_000):
        counts[a.node] = counts.get(a.node, 0) + 1
    victim = max(sorted(counts), key=lambda n: counts[n])
    signalled = time.perf_counter()
    await fc.node_lost(victim)  # the signal `forge node lost` sends, without its start-up
    await poll(
        lambda: asyncio.to_thread(_on_node, store, name, victim),
        lambda n: n == 0,
        limit=120,
        every=0.02,
    )
    loss = time.perf_counter() - signalled
    # and the invariants again once the loop has settled after the loss
    after, _, _ = await until_converged(fc, total, signalled, limit=600, every=0.25)
    await check(after)
    hist = await history_stats(env.client, fc.workflow_id)
    replay = await _replay_seconds(env, fc.workflow_id)
    worker = env.workers[-1]
    longest_gc, long_gcs, rss = _gc_and_rss(env.work / f"{name}.log", worker.proc.pid)
    reads.close()
    failed = {k: n for k, n in hist.failure_causes.items() if k not in BENIGN_TASK_FAILURES}
    if failed:
        raise BenchFailure(f"{name}: WorkflowTaskFailed events {failed}")
    if any(r.get("failure") for r in replay):
        raise BenchFailure(f"{name}: a run's history does not replay: {replay}")
    return {
        "size": size,
        "store": store.partition(":")[0],
        "queues": queues,
        "queued": queued,
        "nodes": nodes,
        "jobs": len(w.jobs),
        "replicas": total,
        "node_add_seconds": round(added, 2),
        "job_run_returned": round(returned, 2),
        "job_run_said": said.splitlines()[-1] if said else "",
        "submitted_seconds": round(submit_done - t0, 2),
        "converged_seconds": round(converged, 2),
        "bound": bound,
        "pending": pending,
        "kills": kills,
        "faults": faults,
        "invariant_violations": 0,  # checked twice above: any violation raised
        "lost": 0,  # jobs and replicas (checked with the invariants)
        "task_failures": hist.task_failures,
        "failure_causes": hist.failure_causes,
        "activity_retries": hist.activity_retries,
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


async def _faults(
    env: Env,
    fc: ForgeClient,
    name: str,
    store: str,
    total: int,
    t0: float,
    kills: int,
    pg_restart: bool,
) -> list[dict[str, Any]]:
    """Inject the faults asked for while the loop converges, whatever the size and
    the machine's speed: of n faults, the i-th (from 1) once i/(n+2) of the replicas
    are bound and more than at the fault before (the loop recovered and went on).
    Each is recorded with when it happened and how far the loop had got (what it
    last published; ``settled``: every replica had been tried, nothing deferred).
    A loop that settles first (a small size) gets the rest SETTLED_GAP s apart."""
    done: list[dict[str, Any]] = []
    plan = ["kill"] * kills + ["pg"] * pg_restart

    def settled(doc: LoopStatus | None) -> bool:
        return doc is not None and doc.summary.desired == total and not doc.deferred

    async def record(fault: str, **more: Any) -> None:
        # a read right after the store came back may meet a dead pooled connection
        doc = await poll(fc.published, lambda _: True, limit=60, every=0.5)
        s = doc.summary if doc is not None else Summary.empty()
        at = round(time.perf_counter() - t0, 1)
        more = {"bound": s.bound, "desired": s.desired, "settled": settled(doc), **more}
        done.append({"fault": fault, "at": at, **more})
        print(f"[chaos] {fault} at {at} s: {more}", flush=True)

    for i, fault in enumerate(plan, start=1):
        # and more bound than at the fault before: the loop recovered and went on
        due = max(total * i // (len(plan) + 2), done[-1]["bound"] + 1 if done else 0)
        last = t0 + (done[-1]["at"] if done else 0.0)

        def now_due(doc: LoopStatus | None, due: int = due, last: float = last) -> bool:
            if doc is not None and doc.summary.bound >= due:
                return True
            return settled(doc) and time.perf_counter() - last >= SETTLED_GAP

        await poll(fc.published, now_due, limit=1800, every=0.25)
        if fault == "kill":
            await record("kill -9 of the worker")
            env.workers[-1].kill9()
            env.worker(name, store)  # a new worker, as a supervisor would start it
            continue
        await record("PostgreSQL stopped")
        stopped = time.perf_counter()
        await asyncio.to_thread(_pg_ctl, "stop")
        await asyncio.sleep(PG_DOWN)
        await asyncio.to_thread(_pg_ctl, "start")
        await poll(lambda: asyncio.to_thread(_pg_accepts, store), bool, limit=120, every=0.2)
        await record("PostgreSQL started", down_s=round(time.perf_counter() - stopped, 1))
    return done


async def _replay_seconds(env: Env, workflow_id: str) -> list[dict[str, Any]]:
    """How long replaying each run of the history takes (what a worker taking the run
    over does before it can go on), newest run first: each in a fresh process set up
    as worker.py is (the collector governor on), with any failure it met."""
    out = []
    run_id: str | None = (await env.client.get_workflow_handle(workflow_id).describe()).run_id
    # the continue-as-new chain, then any run a reset ended (not on the chain)
    listed = [r.run_id async for r in env.client.list_workflows(f"WorkflowId = '{workflow_id}'")]
    seen: set[str] = set()
    while run_id or (run_id := next((r for r in listed if r not in seen), None)):
        seen.add(run_id)
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
        if run_id in seen:
            run_id = None
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
        kill = f", {r['store']}" + (f", {r['kills']} x kill -9" if r["kills"] else "")
        if r.get("queues"):
            kill += f", {r['queues']} queues ({r['queued']:,} queued)"
        if any(f["fault"] == "PostgreSQL stopped" for f in r["faults"]):
            kill += ", PostgreSQL restarted"
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
    for r in rows:
        if not r["faults"]:
            continue
        causes = f" {r['failure_causes']}" if r["failure_causes"] else ""
        out.append("")
        out.append(
            f"chaos, {r['nodes']:,} nodes / {r['replicas']:,} replicas ({r['store']}): "
            f"converged {r['converged_seconds']:.1f} s after the submission began "
            f"(the last fault at {r['faults'][-1]['at']:.1f} s); "
            f"invariant violations {r['invariant_violations']}; jobs and replicas lost "
            f"{r['lost']}; WorkflowTaskFailed {r['task_failures']}{causes}; "
            f"{r['activity_retries']} activity retries; "
            f"{len(r['replay_seconds'])} runs, every one replays; 0 manual steps"
        )
        for f in r["faults"]:
            more = f", down {f['down_s']} s" if "down_s" in f else ""
            if f["settled"] and f["fault"] != "PostgreSQL started":
                more += " (**after** every replica had been tried)"
            out.append(
                f"- {f['fault']} at {f['at']} s, {f['bound']:,} bound of {f['desired']:,} "
                f"desired so far{more}"
            )
    out.append("")
    out.append(f"reproduce: {command}")
    return "\n".join(out)


async def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", action="append", help="NODESxJOBS or NODESxJOBSxREPLICAS")
    ap.add_argument("--kill", type=int, default=0, help="kill -9 the worker this many times")
    ap.add_argument("--store", choices=("sqlite", "postgres"), default="sqlite")
    ap.add_argument("--pg", default=PG_DEFAULT, help="the PostgreSQL server for --store postgres")
    ap.add_argument(
        "--pg-restart", action="store_true", help="stop and start PostgreSQL once mid-convergence"
    )
    ap.add_argument("--json", type=Path, help="also write the raw results here")
    ap.add_argument("--queues", type=int, default=0, help="deal the jobs to this many queues")
    ap.add_argument("--replay", type=Path, help=argparse.SUPPRESS)  # one history, timed
    ap.add_argument("--keep", action="store_true", help="keep the work dir (histories, logs)")
    args = ap.parse_args(argv)
    if args.pg_restart and args.store != "postgres":
        ap.error("--pg-restart needs --store postgres")
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
            if args.store == "sqlite":
                url = f"sqlite:///{work / ('cli-' + size.replace('x', '-'))}.db"
                row = await run_size(env, size, args.kill, url, False, args.queues)
            else:  # a database of this run, dropped after it
                database = f"forge_chaos_{uuid.uuid4().hex[:10]}"
                url = await asyncio.to_thread(_pg_database, args.pg, database)
                try:
                    row = await run_size(env, size, args.kill, url, args.pg_restart, args.queues)
                finally:
                    await asyncio.to_thread(_pg_drop, args.pg, database)
            print(json.dumps(row), flush=True)
            rows.append(row)
    except BenchFailure as err:
        print(f"BENCHMARK FAILED: {err} (logs in {work})", file=sys.stderr)
        return 1
    finally:
        if env is not None:
            env.kill_workers()
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
