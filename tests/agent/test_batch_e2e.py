"""Batch jobs with real agents (issue 32): runs that exit 0 complete and never run
again, a kill -9 of the worker in the middle changes nothing of that, ``forge job
wait`` returns 0 once every run completed, and a job whose run exits 3 ends failed
(``forge job wait`` exit 1, the run named), after one run when its group lists the
exit status in ``fail_on_exit``.

Real ``forge agent`` processes, a ``worker.py`` process, a SQLite store and the
``forge`` CLI as a pipeline runs it; which runs started is read from a file each run
appends its workload id to.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from forge.client import reads
from forge.client.client import ForgeClient
from forge.core.models import Job
from tests.agent.cluster import AgentCluster, own_cluster
from tests.e2e.procs import ROOT, eventually

pytestmark = pytest.mark.slow


def _batch(
    name: str,
    runs: int,
    code: str,
    *,
    attempts: int = 3,
    fail_on_exit: tuple[int, ...] = (),
    max_failed: int = 0,
) -> Job:
    return Job.model_validate(
        {
            "name": name,
            "type": "batch",
            "groups": [
                {
                    "name": "main",
                    "scaling": {
                        "min": 0,
                        "max": runs,
                        "desired": runs,
                        "max_failed": max_failed,
                    },
                    "reschedule": {
                        "attempts": attempts,
                        "delay": 0.5,
                        "interval": 3600.0,
                        "fail_on_exit": list(fail_on_exit),
                    },
                    "tasks": [
                        {
                            "name": "t",
                            "command": [sys.executable, "-c", code],
                            "resources": {"cpu": 1000, "memory": 64},
                        }
                    ],
                }
            ],
        }
    )


def _wait(cl: AgentCluster, job: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "forge", "job", "wait", job, "--timeout", str(timeout)],
        env={**os.environ, **cl.env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout + 60,
    )


@pytest_asyncio.fixture
async def cluster(
    dev_env: Any, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[AgentCluster]:
    name = f"batch-e2e-{uuid.uuid4().hex[:8]}"
    async with own_cluster(dev_env, tmp_path, request, name, make=AgentCluster) as cl:
        yield cl


async def test_runs_complete_once_through_a_worker_kill_and_wait_returns_0(
    cluster: AgentCluster,
) -> None:
    cl = cluster
    cl.start_agent("a")
    await eventually(cl.fc.status, lambda s: len(s.nodes) == 1, what="agent a registered")
    ran = cl.tmp / "ran.txt"
    code = (
        "import os, time; "
        f"open({str(ran)!r}, 'a').write(os.environ['FORGE_WORKLOAD_ID'] + '\\n'); "
        "time.sleep(2)"
    )
    first = await cl.fc.submit_job(_batch("train", 5, code))
    assert (first.bound, first.pending) == (2, 3)  # room for two at a time

    async def runs() -> list[str]:
        return ran.read_text().split() if ran.exists() else []

    await eventually(runs, lambda r: len(r) >= 3, timeout=60, what="a third run started")
    cl.worker.kill9()  # mid-job: two runs done, others running or waiting
    cl.new_worker()

    waited = await asyncio.to_thread(_wait, cl, "train", 120)
    assert waited.returncode == 0, waited.stdout + waited.stderr
    assert "complete: 5/5 runs complete" in waited.stdout
    started = await runs()
    assert sorted(started) == [f"train/main/{i}" for i in range(5)]  # each once
    assert cl.store.completions(cl.name) == sorted(started)
    assert [a for a in cl.store.assignments(cl.name) if a.job == "train"] == []


async def test_a_run_that_exits_3_fails_the_job_and_wait_says_which(
    cluster: AgentCluster,
) -> None:
    cl = cluster
    cl.start_agent("a")
    await eventually(cl.fc.status, lambda s: len(s.nodes) == 1, what="agent a registered")
    await cl.fc.submit_job(_batch("bad", 1, "import sys; sys.exit(3)", attempts=1))
    waited = await asyncio.to_thread(_wait, cl, "bad", 120)
    assert waited.returncode == 1, waited.stdout + waited.stderr
    assert "bad: failed: 0/1 runs complete; bad/main/0:" in waited.stdout
    assert "exhausted" in waited.stdout and "exited with status 3" in waited.stdout
    assert cl.store.completions(cl.name) == []

    # an exit status the group lists: failed after its first run, attempts unused
    ran = cl.tmp / "fatal.txt"
    code = f"import sys; open({str(ran)!r}, 'a').write('ran\\n'); sys.exit(42)"
    await cl.fc.submit_job(_batch("fatal", 1, code, attempts=3, fail_on_exit=(42,)))
    waited = await asyncio.to_thread(_wait, cl, "fatal", 120)
    assert waited.returncode == 1, waited.stdout + waited.stderr
    assert "fatal/main/0: exit status 42 is in reschedule.fail_on_exit" in waited.stdout
    assert ran.read_text().split() == ["ran"]  # once: never retried

    await cl.fc.submit_job(_batch("slow", 1, "import time; time.sleep(3600)"))
    timed = await asyncio.to_thread(_wait, cl, "slow", 1)
    assert timed.returncode == 124, timed.stdout + timed.stderr
    await cl.fc.stop_job("slow")


async def test_runs_that_end_while_their_agent_is_away_keep_their_exit_status(
    cluster: AgentCluster,
) -> None:
    """kill -9 of the agent in the middle of runs: a run that exits 0 while no agent
    watches it, and one that exits 0 after a new agent adopted it, complete once
    (never re-run: one attempt each, so a run taken for failed would fail its job);
    one that exits 3 while the agent is away fails its job at once by that status
    (``fail_on_exit``), where an unknown one would have been retried. The exit
    status outlives the agent that started the run (Nomad's executor, conmon)."""
    cl = cluster
    cl.start_agent("a", "--cpu", "4000")  # room for the three runs at once
    await eventually(cl.fc.status, lambda s: len(s.nodes) == 1, what="agent a registered")
    log = cl.tmp / "runs.txt"
    away, later = cl.tmp / "gate-away", cl.tmp / "gate-later"

    def gated(gate: Path, status: int) -> str:
        return (
            "import os, sys, time; w = os.environ['FORGE_WORKLOAD_ID']; "
            f"open({str(log)!r}, 'a').write('start ' + w + '\\n'); "
            f"[time.sleep(0.05) for _ in iter(lambda: os.path.exists({str(gate)!r}), True)]; "
            f"open({str(log)!r}, 'a').write('end ' + w + '\\n'); sys.exit({status})"
        )

    jobs = {"ok": (away, 0), "three": (away, 3), "adopted": (later, 0)}
    for name, (gate, status) in jobs.items():
        # fail_on_exit decides by the status: known here only if it outlived the agent
        job = _batch(name, 1, gated(gate, status), attempts=1, fail_on_exit=(3,))
        await cl.fc.submit_job(job)

    async def lines() -> list[str]:
        return log.read_text().splitlines() if log.exists() else []

    await eventually(lines, lambda seen: len(seen) == 3, timeout=60, what="three runs started")
    cl.agents["a"].send_signal(signal.SIGKILL)
    cl.agents["a"].wait(timeout=10)
    away.touch()  # "ok" exits 0 and "three" exits 3 with no agent watching
    await eventually(lines, lambda seen: len(seen) == 5, timeout=30, what="two runs ended")
    cl.start_agent("a", "--cpu", "4000")  # within the heartbeat TTL: adopts its runs
    await eventually(
        lambda: asyncio.to_thread(reads.job_state, cl.store, cl.name, "ok"),
        lambda st: st is not None and st.state != "running",
        timeout=60,
        what="ok ended",
    )
    later.touch()  # "adopted" exits 0 under an agent that did not start it

    for name, want in (("ok", 0), ("three", 1), ("adopted", 0)):
        waited = await asyncio.to_thread(_wait, cl, name, 60)
        assert waited.returncode == want, f"{name}: {waited.stdout}{waited.stderr}"
    said = (await asyncio.to_thread(_wait, cl, "three", 5)).stdout
    assert "three/main/0: exit status 3 is in reschedule.fail_on_exit" in said, said
    starts = sorted(x for x in await lines() if x.startswith("start "))
    assert starts == ["start adopted/main/0", "start ok/main/0", "start three/main/0"]  # once
    assert cl.store.completions(cl.name) == ["adopted/main/0", "ok/main/0"]


_FORGE = (sys.executable, "-m", "forge")
_WAIT = ("--wait-finished", "--timeout", "150")


async def test_the_training_example_completes_once_through_kill_9_of_worker_and_agent(
    cluster: AgentCluster,
) -> None:
    """examples/train.yaml as a user runs it (``forge job run --wait-finished``): three
    agents with two A100s each; once both gang members run, kill -9 of the worker and
    of rank 0's agent (started again within the heartbeat TTL). The gang completes,
    each member ran exactly once with its rank, and the waiting CLI exits 0."""
    cl = cluster
    gpus = ("--gpu", "A100:40960") * 2
    big = ("--cpu", "16000", "--memory", "65536", "--label", "gpu-model=A100", *gpus)
    for name in "abc":
        cl.start_agent(name, *big)
    await eventually(cl.fc.status, lambda s: len(s.nodes) == 3, what="three agents registered")
    run = asyncio.create_task(
        asyncio.to_thread(
            subprocess.run,
            [*_FORGE, "job", "run", str(ROOT / "examples" / "train.yaml"), *_WAIT],
            env={**os.environ, **cl.env},
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=210,
        )
    )

    def said(node: str, ordinal: int) -> list[str]:
        log = cl.tmp / f"agent-{node}" / "logs" / "train" / "workers" / str(ordinal) / "worker.log"
        return [x for x in (log.read_text() if log.exists() else "").splitlines() if "rank" in x]

    async def ranks() -> dict[int, list[tuple[str, str]]]:
        return {o: [(n, x) for n in "abc" for x in said(n, o)] for o in (0, 1)}

    started = await eventually(
        ranks, lambda r: all(r.values()), timeout=90, what="both members running"
    )
    rank0 = started[0][0][0]  # rank 0's node
    cl.worker.kill9()
    cl.agents[rank0].send_signal(signal.SIGKILL)
    cl.agents[rank0].wait(timeout=10)
    cl.new_worker()
    cl.start_agent(rank0, *big)  # adopts its member, whether it still runs or ended

    done = await run
    assert done.returncode == 0, done.stdout + done.stderr
    assert "train: complete: 2/2 runs complete" in done.stdout, done.stdout
    final = await ranks()
    assert {o: len(lines) for o, lines in final.items()} == {0: 1, 1: 1}, final  # once each
    assert final[0][0][1].startswith("rank 0 of 2") and final[1][0][1].startswith("rank 1 of 2")
    assert cl.store.completions(cl.name) == ["train/workers/0", "train/workers/1"]


def _run_waiting(
    cl: AgentCluster, jobs: list[Job], *flags: str
) -> subprocess.CompletedProcess[str]:
    path = cl.tmp / f"{jobs[0].id}.yaml"
    path.write_text(json.dumps([j.model_dump(mode="json") for j in jobs]))  # JSON is YAML
    return subprocess.run(
        [sys.executable, "-m", "forge", "job", "run", str(path), "--wait-finished", *flags],
        env={**os.environ, **cl.env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )


async def test_job_run_wait_finished_exits_as_its_jobs_end_and_the_query_agrees(
    cluster: AgentCluster,
) -> None:
    """A pipeline step: ``forge job run FILE --wait-finished`` submits and returns once
    every batch job of the file ended (0 all complete, 1 one failed); a client without
    the store asks the workflow (``job_state``) and hears what the store says."""
    cl = cluster
    cl.start_agent("a")
    await eventually(cl.fc.status, lambda s: len(s.nodes) == 1, what="agent a registered")
    quick = "import time; time.sleep(0.5)"
    done = await asyncio.to_thread(_run_waiting, cl, [_batch("etl", 3, quick)], "--timeout", "120")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "etl: complete: 3/3 runs complete" in done.stdout
    assert sorted(cl.store.completions(cl.name)) == [f"etl/main/{i}" for i in range(3)]

    plain = ForgeClient(cl.fc.client, cluster=cl.name)  # no store: the job_state query
    asked = (await plain.wait_finished(["etl"], timeout=60))["etl"]
    assert asked == reads.job_state(cl.store, cl.name, "etl")
    assert (asked.state, asked.complete, asked.bound) == ("complete", 3, 0)

    # one of two fails: exit 1 once both ended, the failure named
    jobs = [_batch("ok", 1, quick), _batch("bad", 1, "import sys; sys.exit(3)", attempts=0)]
    ended = await asyncio.to_thread(_run_waiting, cl, jobs, "--timeout", "120")
    assert ended.returncode == 1, ended.stdout + ended.stderr
    assert "ok: complete: 1/1 runs complete" in ended.stdout
    assert "bad: failed: 0/1 runs complete; bad/main/0:" in ended.stdout
    assert (await plain.wait_finished(["bad"], timeout=60))["bad"].state == "failed"

    # a run failing for good within max_failed: the job completes without it (exit 0)
    one_bad = "import os, sys; sys.exit(3 if os.environ['FORGE_WORKLOAD_ID'].endswith('/0') else 0)"
    sweep = _batch("sweep", 3, one_bad, attempts=0, max_failed=1)
    swept = await asyncio.to_thread(_run_waiting, cl, [sweep], "--timeout", "120")
    assert swept.returncode == 0, swept.stdout + swept.stderr
    assert "sweep: complete: 2/3 runs complete, 1 failed within scaling.max_failed" in swept.stdout

    slow = await asyncio.to_thread(
        _run_waiting, cl, [_batch("slow", 1, "import time; time.sleep(3600)")], "--timeout", "1"
    )
    assert slow.returncode == 124, slow.stdout + slow.stderr
    assert "slow: still running after 1 s: 0/1 runs complete" in slow.stdout
    await cl.fc.stop_job("slow")
