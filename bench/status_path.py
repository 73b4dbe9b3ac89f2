"""`forge status` as a user runs it, on a real dev server, worker.py and SQLite store.

    python -m bench.status_path                    # 1,000 nodes, 10,000 replicas, 10 runs
    python -m bench.status_path --nodes 1000 --runs 10 --json

Sets up the cluster once (nodes registered, jobs bound, the pass published), then
runs ``forge status`` (a fresh interpreter each time, exactly the console script)
``--runs`` times and prints each wall time and the median. Target: <= 400 ms at
1,000 nodes on the 2-core bench machine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import time
from pathlib import Path

from bench.e2e import (
    BIN,
    Env,
    cluster_client,
    dev_env,
    make_jobs,
    make_nodes,
    until_converged,
)

__all__ = ["main"]


async def run(
    nodes: int, replicas: int, runs: int, as_json: bool, keep: bool = False
) -> list[float]:
    work: Path | None = None
    try:
        async with dev_env("forge-status-bench-") as env:
            work = env.work
            return await _timed(env, nodes, replicas, runs, as_json, keep)
    finally:
        if work is not None:
            shutil.rmtree(work, ignore_errors=True)


async def _timed(
    env: Env, nodes: int, replicas: int, runs: int, as_json: bool, keep: bool
) -> list[float]:
    name = "status"
    db = env.work / "status.db"
    env.worker(name, db)
    fc = cluster_client(env, name, name, db)
    await fc.register_nodes(make_nodes(nodes))
    t0 = time.perf_counter()
    await fc.submit_jobs(make_jobs(replicas, max(1, replicas // 100)))
    await until_converged(fc, replicas, t0, limit=300, every=0.5)
    cli_env = {
        **os.environ,
        "FORGE_TEMPORAL_ADDRESS": env.server.address,
        "FORGE_CLUSTER": name,
        "FORGE_TASK_QUEUE": name,
        "FORGE_STORE": f"sqlite:///{db}",
    }
    if keep:  # leave it up for measuring by hand (until interrupted)
        print(" ".join(f"{k}={v}" for k, v in cli_env.items() if k.startswith("FORGE_")))
        await asyncio.Event().wait()
    args = [str(BIN / "forge"), "status", *(["--json"] if as_json else [])]
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        done = await asyncio.to_thread(
            subprocess.run, args, env=cli_env, capture_output=True, text=True, check=False
        )
        times.append(time.perf_counter() - t)
        if done.returncode != 0:
            raise SystemExit(f"forge status exited {done.returncode}: {done.stderr[-800:]}")
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--replicas", type=int, default=10000)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--json", action="store_true", help="time `forge status --json`")
    ap.add_argument("--keep", action="store_true", help="set up, print FORGE_*, stay up")
    a = ap.parse_args()
    times = asyncio.run(run(a.nodes, a.replicas, a.runs, a.json, a.keep))
    print("runs (ms):", " ".join(f"{t * 1000:.0f}" for t in times))
    print(f"forge status at {a.nodes} nodes: median {statistics.median(times) * 1000:.0f} ms")


if __name__ == "__main__":
    main()
