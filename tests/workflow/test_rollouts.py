"""Rolling updates in the loop, on the time-skipping server: waves wait on durable
timers, and a wave whose replicas never become healthy fails at its deadline."""

from __future__ import annotations

import asyncio
import time

from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.testing import WorkflowEnvironment

from forge.client.client import ForgeClient
from forge.core.models import Job
from forge.stores import Store
from tests.workflow.harness import cluster, job, node

UPDATE = {"max_parallel": 1, "min_healthy_time": 10.0, "healthy_deadline": 60.0}


def web(env: str) -> Job:
    j = job("web", replicas=3, cpu=500, memory=256, update=UPDATE)
    g = j.groups[0]
    task = g.tasks[0].model_copy(update={"env": {"V": env}})
    return j.model_copy(update={"groups": (g.model_copy(update={"tasks": (task,)}),)})


def versions(store: Store, fc: ForgeClient) -> list[str]:
    return [a.version for a in store.assignments(fc.cluster)]


async def details(fc: ForgeClient) -> str:
    meta = await fc.handle().query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
    return meta.current_details


async def details_once(fc: ForgeClient, text: str, timeout: float = 20.0) -> str:
    """The details once they say ``text``: the timer has fired by the time the
    environment's sleep returns, but the pass it wakes may still be running."""
    deadline = time.monotonic() + timeout
    while True:
        got = await details(fc)
        if text in got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"details never said {text!r}; last: {got}")
        await asyncio.sleep(0.05)  # poll interval, not synchronisation


async def test_a_wave_without_healthy_replicas_fails_at_its_deadline_on_a_timer(
    skipping_env: WorkflowEnvironment,
) -> None:
    async with cluster(skipping_env.client) as (fc, store):
        await fc.register_nodes([node("n1", cpu=8000)])
        old, new = web("1"), web("2")
        await fc.submit_job(old)
        assert versions(store, fc) == [old.groups[0].version] * 3
        await fc.submit_job(new)
        # the first wave: one replica (the highest ordinal) replaced, the others wait
        assert versions(store, fc) == [old.groups[0].version] * 2 + [new.groups[0].version]
        assert "to version " + new.groups[0].version in await details(fc)
        assert "failed" not in await details(fc)
        # nobody reports it running: its deadline timer fires and fails the rollout
        await skipping_env.sleep(61)
        await details_once(fc, "failed: replica 2")
        await skipping_env.sleep(600)
        assert versions(store, fc) == [old.groups[0].version] * 2 + [new.groups[0].version]
        assert [v.number for v in store.group_versions(fc.cluster, "web")] == [1, 2]
