"""Periodic batch jobs with real processes (issue 32): ``forge job run`` of a job with
a ``schedule`` makes a Temporal Schedule (the template is never submitted); a
firing, triggered with the raw ``temporal`` CLI as an operator would, submits an
instance ``NAME-<UTC second>`` that a real agent runs to completion; ``keep``
prunes finished instances; ``concurrency: replace`` stops the running instance
before the next starts, across a kill -9 of the worker; a firing no worker could
start within ``catch_up`` is skipped; ``forge job stop`` removes the schedule.

Real ``forge agent`` and ``worker.py`` processes, a SQLite store, the ``forge`` CLI.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
import zoneinfo
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from temporalio.client import (
    Client,
    ScheduleActionExecutionStartWorkflow,
    ScheduleBackfill,
    ScheduleOverlapPolicy,
    WorkflowFailureError,
)
from temporalio.service import RPCError, RPCStatusCode

from forge.client.periodic import firing_id, schedule_id
from forge.core.models import Job
from forge.errors import InvalidInput
from tests.agent.cluster import AgentCluster, own_cluster
from tests.e2e.procs import ROOT, eventually

pytestmark = pytest.mark.slow

ZoneBerlin = zoneinfo.ZoneInfo("Europe/Berlin")


def _spec(name: str, code: str, **schedule: Any) -> dict[str, Any]:
    return {
        "name": name,
        "type": "batch",
        "schedule": {"cron": "0 3 * * *", **schedule},
        "groups": [
            {
                "name": "main",
                "scaling": {"min": 0, "max": 1, "desired": 1},
                "reschedule": {"attempts": 1, "delay": 0.5, "interval": 3600.0},
                "tasks": [
                    {
                        "name": "t",
                        "command": [sys.executable, "-c", code],
                        "resources": {"cpu": 500, "memory": 64},
                    }
                ],
            }
        ],
    }


def _forge(cl: AgentCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "forge", *args],
        env={**os.environ, **cl.env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


async def _run_file(cl: AgentCluster, spec: dict[str, Any]) -> str:
    path = cl.tmp / f"{spec['name']}.yaml"
    path.write_text(json.dumps(spec))  # JSON is YAML
    done = await asyncio.to_thread(_forge, cl, "job", "run", str(path))
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


async def _firings(client: Client, sid: str) -> list[ScheduleActionExecutionStartWorkflow]:
    desc = await client.get_schedule_handle(sid).describe()
    return [
        a.action
        for a in desc.info.recent_actions
        if isinstance(a.action, ScheduleActionExecutionStartWorkflow)
    ]


async def _result(client: Client, firing: ScheduleActionExecutionStartWorkflow) -> Any:
    handle = client.get_workflow_handle(firing.workflow_id, run_id=firing.first_execution_run_id)
    return await asyncio.wait_for(handle.result(), timeout=120)


async def _one_agent(cl: AgentCluster) -> None:
    cl.start_agent("a")
    await eventually(cl.fc.status, lambda s: len(s.nodes) == 1, what="agent a registered")


async def _utc_second() -> str:
    return f"{datetime.now(UTC):%Y%m%d%H%M%S}"


def _instances(cl: AgentCluster, name: str) -> list[str]:
    return sorted(j.id for j in cl.store.list_jobs(cl.name) if j.id.startswith(f"{name}-"))


@pytest_asyncio.fixture
async def cluster(
    dev_env: Any, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[AgentCluster]:
    name = f"periodic-{uuid.uuid4().hex[:8]}"
    async with own_cluster(dev_env, tmp_path, request, name, make=AgentCluster) as cl:
        yield cl


async def test_a_schedule_fires_an_instance_that_runs_to_completion(
    cluster: AgentCluster, dev_env: Any, temporal_cli: str
) -> None:
    cl, client = cluster, dev_env.client
    await _one_agent(cl)
    ran = cl.tmp / "ran.txt"
    code = f"import os; open({str(ran)!r}, 'a').write(os.environ['FORGE_WORKLOAD_ID'] + '\\n')"
    spec = _spec("nightly", code, timezone="Europe/Berlin", concurrency="forbid", keep=1)
    sid = schedule_id(cl.name, "nightly")
    assert f"nightly: scheduled (Temporal Schedule {sid})" in await _run_file(cl, spec)

    desc = await client.get_schedule_handle(sid).describe()
    assert desc.schedule.spec.time_zone_name == "Europe/Berlin"
    assert desc.schedule.policy.overlap == ScheduleOverlapPolicy.SKIP
    [next_at, *_] = desc.info.next_action_times
    assert next_at.astimezone(ZoneBerlin).hour == 3  # 03:00 Berlin, whatever UTC is
    assert cl.store.get_job(cl.name, "nightly") is None  # the template is never submitted

    # as an operator would: the raw temporal CLI (the Web UI's "Trigger" does the same)
    address = cl.env["FORGE_TEMPORAL_ADDRESS"]
    trigger = [temporal_cli, "schedule", "trigger", "--schedule-id", sid, "--address", address]
    await asyncio.to_thread(subprocess.run, trigger, check=True, capture_output=True, timeout=60)
    [firing] = await eventually(lambda: _firings(client, sid), bool, what="the firing started")
    said = await _result(client, firing)
    [instance] = _instances(cl, "nightly")
    assert said == f"{instance}: complete: 1/1 runs complete"
    assert firing.workflow_id == firing_id(sid, instance)  # what pruning relies on
    assert ran.read_text().split() == [f"{instance}/main/0"]
    waited = await asyncio.to_thread(_forge, cl, "job", "wait", instance, "--timeout", "10")
    assert waited.returncode == 0, waited.stdout + waited.stderr

    # run again with a changed spec: updated in place, the operator's pause kept
    await client.get_schedule_handle(sid).pause(note="maintenance")
    out = await _run_file(cl, {**spec, "schedule": {**spec["schedule"], "cron": "30 4 * * *"}})
    assert "nightly: schedule updated" in out
    desc = await client.get_schedule_handle(sid).describe()
    assert desc.schedule.state.paused and desc.schedule.state.note == "maintenance"
    assert desc.schedule.spec.time_zone_name == "Europe/Berlin"
    [at, *_] = desc.info.next_action_times
    assert (at.astimezone(ZoneBerlin).hour, at.minute) == (4, 30)  # the new cron

    stopped = await asyncio.to_thread(_forge, cl, "job", "stop", "nightly")
    assert stopped.returncode == 0 and "nightly: schedule removed" in stopped.stdout
    with pytest.raises(RPCError) as err:
        await client.get_schedule_handle(sid).describe()
    assert err.value.status == RPCStatusCode.NOT_FOUND
    assert _instances(cl, "nightly") == [instance]  # an instance is a job of its own


async def test_keep_prunes_old_instances_and_the_loop_refuses_a_template(
    cluster: AgentCluster, dev_env: Any
) -> None:
    cl, client = cluster, dev_env.client
    await _one_agent(cl)
    spec = _spec("hourly", "pass", cron="* * * * *", keep=1)
    with pytest.raises(InvalidInput, match="schedule: a periodic job is created as a Temporal"):
        await cl.fc.submit_job(Job.model_validate(spec))  # a raw client's submit_job
    await _run_file(cl, spec)
    sid = schedule_id(cl.name, "hourly")
    await client.get_schedule_handle(sid).pause()  # only the backfill fires
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    await client.get_schedule_handle(sid).backfill(
        ScheduleBackfill(
            start_at=now - timedelta(minutes=3, seconds=30),
            end_at=now - timedelta(seconds=30),
            overlap=ScheduleOverlapPolicy.ALLOW_ALL,
        )
    )
    firings = await eventually(
        lambda: _firings(client, sid), lambda f: len(f) == 3, what="three backfilled firings"
    )
    said = [await _result(client, f) for f in firings]
    assert all(s.endswith(": complete: 1/1 runs complete") for s in said), said
    newest = max(s.split(":")[0] for s in said)
    assert newest.startswith("hourly-") and newest.endswith("00")  # a minute of the backfill
    assert _instances(cl, "hourly") == [newest]  # keep: 1
    await client.get_schedule_handle(sid).delete()


async def test_replace_stops_the_running_instance_across_a_worker_kill(
    cluster: AgentCluster, dev_env: Any
) -> None:
    cl, client = cluster, dev_env.client
    await _one_agent(cl)
    await _run_file(cl, _spec("eval", "import time; time.sleep(3600)", concurrency="replace"))
    handle = client.get_schedule_handle(schedule_id(cl.name, "eval"))

    def bound() -> Any:
        async def read() -> list[str]:
            return sorted({a.job for a in cl.store.assignments(cl.name)})

        return read

    await handle.trigger()
    [first] = await eventually(bound(), lambda j: len(j) == 1, what="the first instance bound")
    cl.worker.kill9()  # the firing's wait outlives its worker
    cl.new_worker()
    # instances are named by their firing's second: the next firing is in a later one
    await eventually(_utc_second, lambda s: s > first[-14:], what="the next second")
    await handle.trigger()  # replace: the running firing is cancelled, stops its instance
    [second] = await eventually(
        bound(), lambda j: len(j) == 1 and j[0] != first, timeout=90, what="replaced"
    )
    assert second > first and _instances(cl, "eval") == [second]
    firings = await _firings(client, handle.id)
    with pytest.raises(WorkflowFailureError):  # cancelled
        await _result(client, firings[0])
    await handle.delete()
    running = client.get_workflow_handle(
        firings[-1].workflow_id, run_id=firings[-1].first_execution_run_id
    )
    await running.cancel()  # cancelling a firing by hand stops its instance too
    await eventually(bound(), lambda j: j == [], what="the second instance stopped")


async def test_a_firing_no_worker_started_within_catch_up_is_skipped(
    cluster: AgentCluster, dev_env: Any
) -> None:
    cl, client = cluster, dev_env.client
    await _run_file(cl, _spec("late", "pass", catch_up=10))
    handle = client.get_schedule_handle(schedule_id(cl.name, "late"))
    cl.worker.kill9()
    await handle.trigger()
    [firing] = await eventually(lambda: _firings(client, handle.id), bool, what="fired")
    await asyncio.sleep(11)  # past catch_up with no worker: what is under test, not a sync
    cl.new_worker()
    said = await _result(client, firing)
    assert said.startswith("skipped: no worker ran it for") and "catch_up 10 s" in said
    assert _instances(cl, "late") == []
    await handle.delete()
