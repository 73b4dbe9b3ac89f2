"""What a task is told of its GPUs, checked on this machine's devices (issue 33).

    python -m bench.gpu_node             # on a GPU machine, as is (nvidia-smi on PATH)
    python -m bench.gpu_node --fake 4    # a stand-in nvidia-smi listing 4 GPUs: a dry run

Starts the embedded dev server, a ``worker.py`` and one ``forge agent`` for this
machine (its GPUs as ``nvidia-smi`` lists them), then runs one whole-GPU replica per
device but one, and two replicas sharing the last device at 500 milli each. Each
task writes what it was told (and, where PyTorch with CUDA is installed, what CUDA
shows it, then keeps its device busy) to a results file. Checked: each replica's
``CUDA_VISIBLE_DEVICES`` is its binding's devices by UUID, no device is in two whole
replicas, CUDA sees exactly those devices (with PyTorch), the shares carry their
milli and MPS limits, and the agent reports a ``gpu`` utilisation for every GPU
replica. Prints the table and exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.e2e import ROOT, BenchFailure, DevServer, Env, cluster_client, connect, free_port, poll
from forge.agent.config import detect_gpus
from forge.core.models import Job

CLUSTER = "gpu-node"
TASK = """
import json, os, sys, time
env = {k: os.environ.get(k) for k in ("FORGE_WORKLOAD_ID", "CUDA_VISIBLE_DEVICES",
       "FORGE_GPU_IDS", "FORGE_GPU_MILLI", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")}
cuda = None
try:
    import torch
    if torch.cuda.is_available():
        n = torch.cuda.device_count()
        cuda = [str(torch.cuda.get_device_properties(i).uuid) for i in range(n)]
except ImportError:
    pass
with open(sys.argv[1], "a") as out:
    out.write(json.dumps({"env": env, "cuda": cuda}) + "\\n")
if cuda:
    x = torch.rand(2048, 2048, device="cuda")
    while True:
        x = x @ x
        x = x / x.norm()
time.sleep(3600)
"""


def _fake_smi(bin_dir: Path, count: int) -> None:
    """An ``nvidia-smi`` that lists ``count`` A100s and says each is 40% busy."""
    rows = " ".join(
        f"'{i}, GPU-{i:08d}-0000-0000-0000-000000000000, NVIDIA A100-SXM4-40GB, 40960'"
        for i in range(count)
    )
    busy = " ".join(f"'{i}, 40'" for i in range(count))
    smi = bin_dir / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\n"
        f"case \"$*\" in *utilization.gpu*) printf '%s\\n' {busy}; exit 0;; esac\n"
        f"printf '%s\\n' {rows}\n"
    )
    smi.chmod(0o755)


def _job(name: str, replicas: int, gpu: dict[str, int], results: Path) -> Job:
    task = {
        "name": "t",
        "command": [sys.executable, "-c", TASK, str(results)],
        "resources": {"cpu": 100, "memory": 512, "gpu": gpu},
        "stop_grace": 2.0,
    }
    scaling = {"min": 0, "max": replicas, "desired": replicas}
    return Job.model_validate(
        {"name": name, "groups": [{"name": "main", "scaling": scaling, "tasks": [task]}]}
    )


def _checks(
    told: list[dict[str, Any]], bindings: dict[str, Any], uuids: dict[str, str]
) -> dict[str, bool]:
    whole = [t for t in told if not t["env"]["FORGE_GPU_MILLI"]]
    shares = [t for t in told if t["env"]["FORGE_GPU_MILLI"]]
    used = [d for t in whole for d in bindings[t["env"]["FORGE_WORKLOAD_ID"]].gpu_ids]

    def by_uuid(t: dict[str, Any]) -> str:
        return ",".join(uuids[d] for d in bindings[t["env"]["FORGE_WORKLOAD_ID"]].gpu_ids)

    with_cuda = [t for t in told if t["cuda"] is not None]
    return {
        "every replica told its devices by UUID": all(
            t["env"]["CUDA_VISIBLE_DEVICES"] == by_uuid(t) for t in told
        ),
        "no device in two whole replicas": len(used) == len(set(used)),
        (
            "CUDA sees exactly its devices (PyTorch)"
            if with_cuda
            else "CUDA sees exactly its devices: not checked (no PyTorch with CUDA)"
        ): all(t["cuda"] == t["env"]["CUDA_VISIBLE_DEVICES"].split(",") for t in with_cuda),
        "shares told 500 milli and MPS 50%": all(
            t["env"]["FORGE_GPU_MILLI"] == "500"
            and t["env"]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
            for t in shares
        ),
    }


def _start_agent(work: Path, address: str, queue: str, db: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "FORGE_TEMPORAL_ADDRESS": address,
        "FORGE_TASK_QUEUE": queue,
        "FORGE_STORE": f"sqlite:///{db}",
        "FORGE_CLUSTER": CLUSTER,
    }
    with (work / "agent.log").open("ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "forge", "agent", "--node-id", "this-node",
             "--data-dir", str(work / "agent"), "--usage-every", "1",
             "--logs-address", f"127.0.0.1:{free_port()}", "--stop-tasks-on-exit"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip


def _stop(agent: subprocess.Popen[bytes] | None, results: Path) -> None:
    if agent is not None:
        agent.terminate()  # --stop-tasks-on-exit: its tasks go with it
        agent.wait(timeout=30)
    subprocess.run(["pkill", "-f", str(results)], check=False)  # any left behind


async def run(fake: int, work: Path) -> int:
    if fake:
        (work / "bin").mkdir()
        _fake_smi(work / "bin", fake)
        os.environ["PATH"] = f"{work / 'bin'}:{os.environ['PATH']}"
    gpus, why = detect_gpus()
    if not gpus:
        print(f"no GPUs here ({why}): run with --fake N for a dry run")
        return 1
    uuids = {f"gpu{i}": g.uuid for i, g in enumerate(gpus)}
    server = DevServer.start(work)
    env = Env(server, await connect(server.address), work)
    queue, db, results = "gpu-node", work / "forge.db", work / "told.jsonl"
    agent: subprocess.Popen[bytes] | None = None
    whole = len(gpus) - 1
    try:
        env.worker(queue, db)
        fc = cluster_client(env, CLUSTER, queue, db)
        store = fc.store
        assert store is not None
        agent = _start_agent(work, server.address, queue, db)
        jobs = [_job("shares", 2, {"count": 1, "milli": 500}, results)]
        if whole:
            jobs.append(_job("whole", whole, {"count": 1}, results))
        await poll(fc.status, lambda s: bool(s.nodes), limit=120, every=0.5)
        await fc.submit_jobs(jobs)

        async def told() -> list[dict[str, Any]]:
            text = results.read_text() if results.exists() else ""
            return [json.loads(x) for x in text.splitlines()]

        said = await poll(told, lambda t: len(t) == whole + 2, limit=120, every=0.5)
        bindings = {a.workload_id: a for a in store.assignments(CLUSTER)}
        checks = _checks(said, bindings, uuids)

        async def usage() -> dict[str, float | None]:
            return {r.workload_id: r.gpu for r in store.latest_usage(CLUSTER)}

        def measured(u: dict[str, float | None]) -> bool:
            return len(u) == whole + 2 and all(v is not None for v in u.values())

        try:
            await poll(usage, measured, limit=60, every=1)
            checks["gpu utilisation reported for each"] = True
        except BenchFailure:
            checks["gpu utilisation reported for each"] = False
        print(f"{len(gpus)} GPU ({'fake' if fake else 'nvidia-smi'}): {whole} whole, 2 shares")
        print("| check | result |\n|---|---|")
        for name, ok in checks.items():
            print(f"| {name} | {'ok' if ok else 'FAILED'} |")
        print(f"\nreproduce: python -m bench.gpu_node{f' --fake {fake}' if fake else ''}")
        for job in jobs:
            await fc.stop_job(job.id)
        return 0 if all(checks.values()) else 1
    finally:
        _stop(agent, results)
        env.kill_workers()
        server.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fake", type=int, default=0, help="a stand-in nvidia-smi with N GPUs")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="forge-gpu-node-") as tmp:
        try:
            return asyncio.run(run(args.fake, Path(tmp)))
        except BenchFailure as err:
            print(f"FAILED: {err}")
            return 1


if __name__ == "__main__":
    sys.exit(main())
