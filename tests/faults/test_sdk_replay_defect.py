"""Evidence of the SDK defect the kill test works around (temporalio 1.35).

``histories/sdk-update-split-activation.json`` was recorded by
``test_kill_random``: a freshly started worker took over a workflow task that
carried a timer firing and two updates. It ran them as two activations (the timer
first: the loop planned, then waited on a new timer, which the updates cancelled
before it was sent), but a replay runs them as one (the updates first), creates one
timer fewer and fails on every attempt: the cluster loop is stuck until a reset.
No workflow code is involved in the split; the history replays up to that task.

When this test fails because the history now replays, the SDK has changed how it
replays such tasks: re-check whether the kill test's reset watchdog is still needed.
(A deliberate, patched change of the workflow code may also change the failure;
then drop this file.)
"""

from __future__ import annotations

import json
from pathlib import Path

from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

from forge.codec import data_converter
from workflows.cluster import ClusterWorkflow

HISTORY = Path(__file__).parent / "histories" / "sdk-update-split-activation.json"


async def test_a_split_update_activation_does_not_replay() -> None:
    history = WorkflowHistory.from_json(HISTORY.stem, json.loads(HISTORY.read_text()))
    replayer = Replayer(workflows=[ClusterWorkflow], data_converter=data_converter())
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is not None, "the SDK now replays it: see the docstring"
    assert "Timer fired event did not have expected timer id 4, it was 5" in str(
        result.replay_failure
    )
