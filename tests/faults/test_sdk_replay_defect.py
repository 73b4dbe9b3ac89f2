"""Evidence of the SDK defect a query can trigger during a takeover (temporalio 1.35).

``histories/sdk-update-split-activation.json`` was recorded by ``test_kill_random``
when it still read through queries. The trigger is a **query**: the worker holding
the run was killed while the loop waited on a timer; a query arrived while no
workflow task was pending; the server handed it to a worker that had never seen the
run, and Core ran the trailing events (the timer firing) through the workflow code
as a *non-replay* activation with the previous task's clock before answering. The
updates that came with the next real workflow task ran as a second activation. A
replay runs both as one activation, creates one timer fewer and fails on every
attempt: "Timer fired event did not have expected timer id 4, it was 5". It is not
an update/timer split in the loop (restructuring the loop fails the same way); not
querying avoids it. The reproduction, a 50-line model of the loop and the evidence
are in ``../shared/research/temporal-query-takeover/``.

So Forge reads what the loop publishes (the store, describe()) and never queries;
an operator's query can still trigger it, and the watchdog every worker runs
(``forge.client.watchdog``) resets such a run; ``test_kill_random[with-queries]`` exercises
that path and requires every failing run to fail offline replay too.

When this test fails because the history now replays, the SDK has changed how it
replays such tasks: re-check whether the watchdog's reset is still needed.
"""

from __future__ import annotations

import json
from pathlib import Path

from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

from forge.wire.codec import data_converter
from workflows.cluster import ClusterWorkflow

HISTORY = Path(__file__).parent / "histories" / "sdk-update-split-activation.json"


async def test_a_query_takeover_history_does_not_replay() -> None:
    history = WorkflowHistory.from_json(HISTORY.stem, json.loads(HISTORY.read_text()))
    replayer = Replayer(workflows=[ClusterWorkflow], data_converter=data_converter())
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is not None, "the SDK now replays it: see the docstring"
    assert "Timer fired event did not have expected timer id 4, it was 5" in str(
        result.replay_failure
    )
