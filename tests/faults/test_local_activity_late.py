"""A local activity's result reached the loop one workflow task after its marker.

``histories/kill-random-local-activity-late.json.gz`` is a run of
``test_kill_random.py`` (with queries) that failed its own replay, online and
offline, with the code that wrote it: an intake (a local activity, seq 45) was
recorded by the task that ran it (event 246), but the loop took its result only in
the next task, after that task had accepted two ``drain_node`` updates, and
scheduled its persist there (events 250-252). A replay resolves a local activity at
its marker, so it scheduled the persist in the earlier task, before the acceptances,
and Core refused: "Activity machine does not handle this event: HistoryEvent(id:
250, WorkflowExecutionUpdateAccepted)". No workflow code can replay that history to
the same commands: the defect is in when Core delivered the result, not in what the
loop did with it.

Not handled yet (RELIABILITY.md, "Open: a local activity's result taken late"): the
kill test with queries meets it about once in ten runs. Making the intake and the job
write ordinary activities was tried and is worse: an ordinary activity's result, a
signal and a timer all reach a query's stale activation (the defect
``test_upstream_query_takeover.py`` pins), and no clock or history-length test told
that activation apart when the killed worker died inside a task. This test keeps
the evidence: the history replays to exactly this failure, and it was written by
today's loop (intakes on).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

from forge.wire.codec import data_converter
from tests.faults.checks import la_late
from workflows import patches
from workflows.cluster import ClusterWorkflow

HISTORY = Path(__file__).parent / "histories" / "kill-random-local-activity-late.json.gz"
LA_MARKER = "core_local_activity"


def _events(history: WorkflowHistory) -> list[tuple[int, str]]:
    return [(ev.event_id, ev.WhichOneof("attributes") or "") for ev in history.events]


def _patches(history: WorkflowHistory) -> set[str]:
    return {
        json.loads(ev.marker_recorded_event_attributes.details["patch-data"].payloads[0].data)["id"]
        for ev in history.events
        if ev.marker_recorded_event_attributes.marker_name == "core_patch"
    }


async def test_the_recorded_history_fails_where_the_late_result_was_taken() -> None:
    history = WorkflowHistory.from_json(
        "forge-cluster-kill-random", gzip.decompress(HISTORY.read_bytes()).decode()
    )
    replayer = Replayer(workflows=[ClusterWorkflow], data_converter=data_converter())
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is not None
    assert (
        "Activity machine does not handle this event: HistoryEvent(id: 250, "
        "WorkflowExecutionUpdateAccepted)" in str(result.replay_failure)
    )
    by_id = {ev.event_id: ev for ev in history.events}
    marker = by_id[246].marker_recorded_event_attributes
    assert marker.marker_name == LA_MARKER
    assert b'"activity_type":"forge.intake"' in marker.details["data"].payloads[0].data
    # the marker closes task 244-245; the next task accepts the updates, then persists
    kinds = dict(_events(history))
    assert kinds[245] == "workflow_task_completed_event_attributes"
    assert kinds[249] == "workflow_task_completed_event_attributes"
    assert [kinds[i] for i in (250, 251, 252)] == [
        "workflow_execution_update_accepted_event_attributes",
        "workflow_execution_update_accepted_event_attributes",
        "activity_task_scheduled_event_attributes",
    ]
    assert patches.PASS_INTAKE in _patches(history), "written by today's loop"
    # the fault tests recognise it by this shape, and nothing else by it
    assert la_late(history.events, str(result.replay_failure))
    shifted = str(result.replay_failure).replace("id: 250", "id: 251")
    assert not la_late(history.events, shifted), "a failure one event away is not it"
    assert not la_late(history.events, "Update machine does not handle ActivityTaskScheduled")


async def test_the_held_out_divergence_is_not_taken_for_it() -> None:
    held_out = Path(__file__).parent / "histories" / "takeover-divergence-1k.json.gz"
    history = WorkflowHistory.from_json(
        "forge-cluster-default", gzip.decompress(held_out.read_bytes()).decode()
    )
    replayer = Replayer(workflows=[ClusterWorkflow], data_converter=data_converter())
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is not None
    assert not la_late(history.events, str(result.replay_failure))
