"""A periodic job's firing cancelled at its submit stops its instance (the patch
``firing-cancelled-at-submit-stops``), and histories from before it still replay.

Found through real processes (tests/agent/test_periodic_e2e.py, ``concurrency:
replace`` across a kill -9 of the worker): the submit's result and the schedule's
cancel reached the next worker in one activation, the firing ended cancelled, and
its instance ran on beside the next one. Here the firing's activities are stand-ins
whose submit the test holds open, so the cancel lands while it runs, every time.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from temporalio import activity
from temporalio.client import WorkflowFailureError, WorkflowHistory
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer, UnsandboxedWorkflowRunner, Worker

import workflows.periodic as periodic
from forge.core.models import Job
from forge.wire import periodic as p
from forge.wire.codec import data_converter
from workflows.periodic import FIRING_CANCELLED_AT_SUBMIT_STOPS, PeriodicJobWorkflow


class _Fakes:
    """The firing's activities, recording what they were asked; the submit waits
    for :attr:`release` so the test can cancel the firing while it runs."""

    def __init__(self) -> None:
        self.submitting = asyncio.Event()
        self.release = asyncio.Event()
        self.stopped: list[str] = []

    def all(self) -> list[Callable[..., Any]]:
        @activity.defn(name=p.ACT_SUBMIT)
        async def submit(fire: p.Firing) -> None:
            self.submitting.set()
            await self.release.wait()

        @activity.defn(name=p.ACT_AWAIT)
        async def wait(ref: p.Instance) -> p.Outcome:
            await asyncio.Event().wait()  # runs until cancelled
            raise AssertionError("unreachable")

        @activity.defn(name=p.ACT_STOP)
        async def stop(ref: p.Instance) -> None:
            self.stopped.append(ref.job_id)

        @activity.defn(name=p.ACT_PRUNE)
        async def prune(req: p.Prune) -> list[str]:
            return []

        return [submit, wait, stop, prune]


def _firing() -> p.Firing:
    job = Job.model_validate(
        {
            "name": "nightly",
            "type": "batch",
            "schedule": {"cron": "0 3 * * *"},
            "groups": [
                {
                    "name": "main",
                    "tasks": [
                        {"name": "t", "command": ["true"], "resources": {"cpu": 100, "memory": 64}}
                    ],
                }
            ],
        }
    )
    return p.Firing(cluster="c1", job=job)


async def _cancel_at_submit(
    env: WorkflowEnvironment, *, sandboxed: bool = True
) -> tuple[_Fakes, WorkflowHistory]:
    """Run one firing, cancel it while its submit runs; its stand-ins and history."""
    fakes, queue = _Fakes(), f"firing-{uuid.uuid4().hex[:8]}"
    runner = {} if sandboxed else {"workflow_runner": UnsandboxedWorkflowRunner()}
    async with Worker(
        env.client,
        task_queue=queue,
        workflows=[PeriodicJobWorkflow],
        activities=fakes.all(),
        graceful_shutdown_timeout=timedelta(seconds=1),
        **runner,  # type: ignore[arg-type]
    ):
        handle = await env.client.start_workflow(
            PeriodicJobWorkflow.run, _firing(), id=queue, task_queue=queue
        )
        await asyncio.wait_for(fakes.submitting.wait(), timeout=30)
        await handle.cancel()
        fakes.release.set()  # the submit completes: the instance reached the loop
        with pytest.raises(WorkflowFailureError):
            await asyncio.wait_for(handle.result(), timeout=30)
        return fakes, await handle.fetch_history()


def _patches(history: WorkflowHistory) -> set[str]:
    """The ``workflow.patched`` ids the history's markers record."""
    return {
        json.loads(payload.data)["id"]
        for e in history.events
        if e.HasField("marker_recorded_event_attributes")
        and e.marker_recorded_event_attributes.marker_name == "core_patch"
        for payload in e.marker_recorded_event_attributes.details["patch-data"].payloads
    }


async def _replays(history: WorkflowHistory) -> None:
    replayer = Replayer(workflows=[PeriodicJobWorkflow], data_converter=data_converter())
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None, result.replay_failure


async def test_a_firing_cancelled_at_its_submit_stops_its_instance(
    dev_env: WorkflowEnvironment,
) -> None:
    fakes, history = await _cancel_at_submit(dev_env)
    assert len(fakes.stopped) == 1 and fakes.stopped[0].startswith("nightly-"), fakes.stopped
    assert _patches(history) == {FIRING_CANCELLED_AT_SUBMIT_STOPS}
    await _replays(history)


async def test_a_firing_recorded_before_the_patch_replays_as_it_ran(
    dev_env: WorkflowEnvironment, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The unpatched firing let the cancel through (the bug, seen here); its history
    replays with today's code, which takes the old branch for it."""
    monkeypatch.setattr(periodic, "_guarded", lambda: False)  # as recorded before
    fakes, history = await _cancel_at_submit(dev_env, sandboxed=False)
    monkeypatch.undo()
    assert fakes.stopped == []
    assert _patches(history) == set()
    await _replays(history)
