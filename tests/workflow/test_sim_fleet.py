"""The simulated fleet (``forge sim fleet``) against the real loop: it reports what
an agent reports, so a batch job of ``sleep`` runs completes, each ordinal started
once, on its nodes only; a task that is not ``sleep`` runs until stopped."""

from __future__ import annotations

import asyncio
import io
import json
import time
from collections import Counter
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from forge.client import reads
from forge.core.models import Job
from forge.sim.fleet import Fleet, run_seconds
from tests.workflow.harness import cluster, default_options, node


def _job(name: str, runs: int, command: list[str], kind: str = "batch") -> Job:
    return Job.model_validate(
        {
            "name": name,
            "type": kind,
            "groups": [
                {
                    "name": "main",
                    "scaling": {"min": 0, "max": runs, "desired": runs},
                    "tasks": [
                        {"name": "t", "command": command, "resources": {"cpu": 1000, "memory": 64}}
                    ],
                }
            ],
        }
    )


@pytest.mark.parametrize(
    ("commands", "want"),
    [
        ([["sleep", "2"]], 2.0),
        ([["sleep", "2"], ["/bin/sleep", "3.5"]], 3.5),  # the longest task
        ([["sleep", "2"], ["python", "serve.py"]], None),  # one runs until stopped
        ([["sleep", "nan"]], None),
        ([["sleep", "soon"]], None),
        ([["sleep"]], None),
    ],
)
def test_run_seconds_is_the_longest_sleep_or_none(commands: list[list[str]], want: Any) -> None:
    job = Job.model_validate(
        {
            "name": "j",
            "groups": [
                {
                    "name": "g",
                    "tasks": [
                        {"name": f"t{i}", "command": cmd, "resources": {"cpu": 1, "memory": 1}}
                        for i, cmd in enumerate(commands)
                    ],
                }
            ],
        }
    )
    assert run_seconds(job, "g") == want
    assert run_seconds(job, "other") is None and run_seconds(None, "g") is None


async def test_the_fleet_runs_a_batch_job_to_completion_each_ordinal_once(
    skipping_env: WorkflowEnvironment,
) -> None:
    options = default_options(watch=True, watch_poll=0.02, heartbeat_ttl=10_000_000.0)
    ids = ["sim-0", "sim-1", "sim-2"]
    async with cluster(skipping_env.client, options=options) as (fc, store):
        # a node of a real agent, filled by a service first: the fleet leaves it alone
        await fc.register_nodes([node("real-0", cpu=1000, memory=4096)])
        placed = await fc.submit_job(_job("svc", 1, ["python", "serve.py"], kind="service"))
        assert placed.bound == 1
        await fc.register_nodes([node(n, cpu=2000, memory=4096) for n in ids])
        await fc.submit_job(_job("web", 2, ["python", "serve.py"], kind="service"))
        await fc.submit_job(_job("b", 12, ["sleep", "0.1"]))
        log = io.StringIO()
        fleet = Fleet(store, fc.cluster, ids, heartbeat_every=0.5, poll_every=0.02, events=log)
        deadline = time.monotonic() + 60
        while (reads.batch_state(store, fc.cluster, "b") or ("",))[0] != "complete":
            assert time.monotonic() < deadline, reads.batch_state(store, fc.cluster, "b")
            if not fleet.step():
                await asyncio.sleep(0.01)  # the loop's turn: a poll interval
        events = [json.loads(line) for line in log.getvalue().splitlines()]
        starts = Counter(e["workload_id"] for e in events if e["event"] == "started")
        exits = Counter(e["workload_id"] for e in events if e["event"] == "exited")
        runs = {f"b/main/{i}" for i in range(12)}
        assert {w: n for w, n in starts.items() if w in runs} == dict.fromkeys(runs, 1)
        assert {w: n for w, n in exits.items() if w in runs} == dict.fromkeys(runs, 1)
        assert {e["node"] for e in events} <= set(ids)  # never another node's replica
        assert store.completions(fc.cluster) == sorted(runs)
        assert "svc/main/0" not in starts  # real-0's
        # the fleet's services: reported running once, never exited, still bound
        web = ["web/main/0", "web/main/1"]
        assert [starts[w] for w in web] == [1, 1] and [exits[w] for w in web] == [0, 0]
        assert sorted(a.workload_id for a in store.assignments(fc.cluster) if a.job == "web") == web
        assert fleet.heartbeats >= len(ids) and fleet.errors == 0
