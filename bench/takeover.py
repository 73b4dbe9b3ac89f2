"""Takeovers as users cause them: kill -9 of the worker at random moments, with the
Web UI's and operators' queries and users' changes around each (issue 35).

    python -m bench.takeover --size 1000x10000 --takeovers 30
    python -m bench.takeover --size 5000x50000 --takeovers 30
    python -m bench.takeover --size 200x2000 --takeovers 6 --seed 1   # a quick slice

A real dev server and ``worker.py`` on SQLite; the cluster is loaded through the CLI
(``forge node add --file``, ``forge job run``: ``bench.pending.gpu_exhausted``, GPU
capacity exhausted) and converged. Then, for each takeover: a new worker is started
(as a supervisor would), a user change is sent through the CLI (``forge job scale``
down or up, ``forge job run`` of a new job, or ``forge job stop``), the old worker is
killed with SIGKILL after a random 0-1.5 s (so during a pass, a persist, a submission
or idle), and at once the run is queried as the Web UI does on opening it
(``__temporal_workflow_metadata``, then ``__stack_trace`` for its Call Stack tab) and as
an operator does (``temporal workflow query --type status``); one more change follows
the kill. The takeover has converged once every change the CLI acknowledged is in the
store and the loop has tried every replica of the desired count it implies.

At the end: every acknowledged change in the store (none lost), the invariants over
the store, WorkflowTaskFailed events, the longest workflow task, resets (runs the
watchdog terminated), and every run replayed offline with this code. Any lost change,
failed task, reset or replay failure makes the run exit 1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.cli_path import BENIGN_TASK_FAILURES, _cli_env, _forge, _replay_seconds
from bench.e2e import (
    BenchFailure,
    DevServer,
    Env,
    check_invariants,
    cluster_client,
    connect,
    history_stats,
    poll,
    summary,
    until_converged,
)
from bench.pending import gpu_exhausted, write_csv
from forge.client.client import ForgeClient, ensure_search_attributes
from forge.core.models import Job

__all__ = ["main"]

MAX_DELAY = 1.5  # seconds between the change before a kill and the kill
QUERIES = ("__temporal_workflow_metadata", "__stack_trace", "status")
QUERY_TIMEOUT = 30.0


def _new_job(name: str) -> dict[str, Any]:
    task = {"name": "main", "resources": {"cpu": 250, "memory": 256}}
    group = {"name": "main", "tasks": [task], "scaling": {"min": 0, "max": 4, "desired": 2}}
    return {"id": name, "name": name, "groups": [group]}


class Changes:
    """The user's changes and what the store must hold after them."""

    def __init__(self, rng: random.Random, jobs: list[Job], work: Path, cli: dict[str, str]):
        self.rng = rng
        self.desired = {j.id: j.groups[0].scaling.desired for j in jobs}
        self.work = work
        self.cli = cli
        self.sent: list[str] = []
        self.serial = 0
        self.busy: set[str] = set()  # jobs with a change in flight: never two at once

    def pick(self) -> tuple[list[str], str, int | None]:
        """The CLI arguments of one change, the job it touches and the desired count
        it leaves (None: the job is gone)."""
        kind = self.rng.choice(["scale", "scale", "submit", "stop"])
        if kind == "submit":
            self.serial += 1
            name = f"takeover-{self.serial:03d}"
            path = self.work / f"{name}.json"
            path.write_text(json.dumps([_new_job(name)]))
            return ["job", "run", str(path)], name, 2
        job = self.rng.choice(sorted(set(self.desired) - self.busy))
        if kind == "stop":
            return ["job", "stop", job], job, None
        count = 1 - min(self.desired[job], 1)  # 0 <-> 1 (the shape's max is 1)
        return ["job", "scale", job, "main", str(count)], job, count

    async def send(self) -> float:
        args, job, after = self.pick()
        self.busy.add(job)
        try:
            took, _ = await asyncio.to_thread(_forge, args, self.cli, 300)
        finally:
            self.busy.discard(job)
        if after is None:
            self.desired.pop(job, None)
        else:
            self.desired[job] = after
        self.sent.append(" ".join(args[:2] + args[2:3]))
        return took

    def total(self) -> int:
        return sum(self.desired.values())


async def _query(env: Env, workflow_id: str, name: str, failed: list[str]) -> None:
    try:
        handle = env.client.get_workflow_handle(workflow_id)
        await asyncio.wait_for(handle.query(name), QUERY_TIMEOUT)
    except Exception as err:  # a query lost with its worker is the user's problem only
        failed.append(f"{name}: {type(err).__name__}: {str(err)[:120]}")


async def _stored(fc: ForgeClient, want: dict[str, int]) -> None:
    """Wait until the store holds every acknowledged change."""
    await poll(
        lambda: asyncio.to_thread(_stored_desired, fc), lambda d: d == want, limit=120, every=0.25
    )


def _stored_desired(fc: ForgeClient) -> dict[str, int]:
    assert fc.store is not None
    return {j.id: j.groups[0].scaling.desired for j in fc.store.list_jobs(fc.cluster)}


async def run_size(env: Env, size: str, takeovers: int, seed: int) -> dict[str, Any]:
    nodes, pods = (int(x) for x in size.split("x"))
    name = "takeover-" + size.replace("x", "-")
    store = f"sqlite:///{env.work / name}.db"
    env.worker(name, store)
    w = gpu_exhausted(nodes, pods)
    nodes_file, jobs_file = write_csv(w, env.work / name)
    cli = _cli_env(env, name, store)
    fc = cluster_client(env, name, name, store)
    await asyncio.to_thread(_forge, ["node", "add", "--file", str(nodes_file)], cli, 600)
    await poll(lambda: summary(fc), lambda s: s.nodes == nodes, limit=600, every=0.5)
    t0 = time.perf_counter()
    await asyncio.to_thread(_forge, ["job", "run", str(jobs_file)], cli, 1800)
    await until_converged(fc, pods, t0, limit=1800, every=0.25)
    print(f"[takeover] {size}: converged in {time.perf_counter() - t0:.1f} s", flush=True)

    rng = random.Random(seed)
    changes = Changes(rng, list(w.jobs), env.work / name, cli)
    converge: list[float] = []
    failed_q: list[str] = []
    for i in range(1, takeovers + 1):
        env.worker(name, store)  # the next worker, already polling
        before = asyncio.create_task(changes.send())
        await asyncio.sleep(rng.uniform(0.0, MAX_DELAY))  # the kill's moment
        env.workers[-2].kill9()
        killed = time.perf_counter()
        reads = [asyncio.create_task(_query(env, fc.workflow_id, q, failed_q)) for q in QUERIES]
        await changes.send()
        await before
        await asyncio.gather(*reads)
        await _stored(fc, dict(changes.desired))
        _, _, seconds = await until_converged(fc, changes.total(), killed, limit=300, every=0.25)
        converge.append(seconds)
        print(f"[takeover] {size} #{i}: converged {converge[-1]:.1f} s after the kill "
              f"({changes.sent[-2]}; {changes.sent[-1]})", flush=True)  # fmt: skip

    stored = await asyncio.to_thread(_stored_desired, fc)
    lost: dict[str, object] = {j: n for j, n in changes.desired.items() if stored.get(j) != n}
    lost.update({j: "stopped, still stored" for j in stored if j not in changes.desired})
    settled = time.perf_counter()
    bound, _, _ = await until_converged(fc, changes.total(), settled, limit=300, every=0.25)
    assert fc.store is not None
    await check_invariants(fc, fc.store, bound, expect_jobs=len(changes.desired),
                           expect_desired=changes.total())  # fmt: skip
    hist = await history_stats(env.client, fc.workflow_id)
    resets = await _resets(env, fc.workflow_id)
    replay = await _replay_seconds(env, fc.workflow_id)
    failed = {k: n for k, n in hist.failure_causes.items() if k not in BENIGN_TASK_FAILURES}
    row = {
        "size": size,
        "seed": seed,
        "takeovers": takeovers,
        "changes_acknowledged": len(changes.sent),
        "changes_lost": len(lost),
        "converged_after_kill_s": {
            "median": round(statistics.median(converge), 2),
            "max": round(max(converge), 2),
        },
        "task_failures": failed,
        "resets": resets,
        "runs": hist.runs,
        "longest_task_s": round(hist.longest_task, 3),
        "runs_failing_replay": sum(1 for r in replay if r.get("failure")),
        "longest_replay_s": max((r.get("seconds") or 0.0 for r in replay), default=0.0),
        "queries_unanswered": len(failed_q),
    }
    problems = [
        f"changes lost: {lost}" if lost else "",
        f"WorkflowTaskFailed: {failed}" if failed else "",
        f"{resets} reset(s) by the watchdog" if resets else "",
        f"{row['runs_failing_replay']} run(s) fail replay" if row["runs_failing_replay"] else "",
    ]
    row["problems"] = [p for p in problems if p]
    return row


async def _resets(env: Env, workflow_id: str) -> int:
    """Runs the watchdog ended with a reset (their closing event says so)."""
    from temporalio.api.enums.v1 import EventType

    n = 0
    async for wf in env.client.list_workflows(f"WorkflowId = '{workflow_id}'"):
        hist = await env.client.get_workflow_handle(workflow_id, run_id=wf.run_id).fetch_history()
        last = hist.events[-1]
        if last.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED:
            reason = last.workflow_execution_terminated_event_attributes.reason
            n += reason.startswith("forge watchdog:")
    return n


def report(rows: list[dict[str, Any]], command: str) -> str:
    out = [
        "| size | takeovers | changes (lost) | converged after the kill, median / max | "
        "failed tasks | resets | longest task | runs (failing replay) | queries unanswered |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        c = r["converged_after_kill_s"]
        out.append(
            f"| {r['size']} | {r['takeovers']} | {r['changes_acknowledged']} "
            f"({r['changes_lost']}) | {c['median']} / {c['max']} s | "
            f"{sum(r['task_failures'].values())} | {r['resets']} | {r['longest_task_s']} s | "
            f"{r['runs']} ({r['runs_failing_replay']}) | {r['queries_unanswered']} |"
        )
    out.append(f"\nReproduce: `{command}`")
    return "\n".join(out)


async def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", action="append", help="NODESxJOBS (default 1000x10000)")
    ap.add_argument("--takeovers", type=int, default=30)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--json", type=Path, help="also write the raw results here")
    args = ap.parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1_000_000)
    work = Path(tempfile.mkdtemp(prefix="forge-takeover-"))
    server = DevServer.start(work)
    rows: list[dict[str, Any]] = []
    env: Env | None = None
    try:
        client = await connect(server.address)
        await ensure_search_attributes(client, "default")
        env = Env(server, client, work)
        for size in args.size or ["1000x10000"]:
            row = await run_size(env, size, args.takeovers, seed)
            print(json.dumps(row), flush=True)
            rows.append(row)
    except BenchFailure as err:
        print(f"BENCHMARK FAILED: {err} (logs in {work})", file=sys.stderr)
        return 1
    finally:
        if env is not None:
            env.kill_workers()
        server.stop()
    command = "python -m bench.takeover " + " ".join(
        [f"--size {s}" for s in (args.size or ["1000x10000"])]
        + [f"--takeovers {args.takeovers}", f"--seed {seed}"]
    )
    print(report(rows, command))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 1 if any(r["problems"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
