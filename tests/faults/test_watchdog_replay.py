"""The run the kill test left stuck (with queries, seed 327777): diagnosed now.

``histories/kill-random-327777-stuck-run.json.gz`` is the current run's history as
the failing test saved it, two minutes into the streak: a takeover's bad commands
(the SDK's query-takeover defect) recorded long before, then a workflow task whose
first attempt timed out after it was started (event 238), then the transient
attempt 6 (scheduled and started, not failed: the failures of attempts 2-5 are not
in history). Every update was refused meanwhile ("Workflow Task in failed state").

The watchdog used to see a timeout and leave it to heal; with the worker's replay
(``worker.history_replay``: the workflow code of this worker) it finds the
nondeterminism and would reset the run to its first completed workflow task."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import cast

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHistory

import worker
from forge.client import watchdog
from forge.wire.codec import data_converter
from tests.client.test_watchdog_unrecorded import _FakeClient

STUCK = Path(__file__).parent / "histories" / "kill-random-327777-stuck-run.json.gz"
WF = "forge-cluster-kill-random"


def _stuck_run() -> _FakeClient:
    history = WorkflowHistory.from_json(WF, gzip.decompress(STUCK.read_bytes()).decode())
    return _FakeClient(list(history.events), attempt=6)  # attempt: as describe() said


async def test_the_stuck_run_shows_a_timeout_and_no_failure() -> None:
    """What history gives without a replay: nothing the watchdog acts on."""
    fake = _stuck_run()
    kinds = {ev.event_type for ev in fake.events}
    assert EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED not in kinds
    assert EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT in kinds
    assert await watchdog.diagnose(cast(Client, fake), WF) is None


async def test_the_workers_replay_finds_the_nondeterminism_of_the_stuck_run() -> None:
    replay = watchdog.ReplayCheck(worker.history_replay(data_converter()))
    stuck = await watchdog.diagnose(cast(Client, _stuck_run()), WF, replay=replay)
    assert stuck is not None, "the stuck run was not diagnosed"
    assert stuck.cause == "nondeterminism"
    assert stuck.reset_to == 4  # the run's first completed workflow task
    assert "[TMPRL1100]" in stuck.message and "found by replaying the run" in stuck.message
