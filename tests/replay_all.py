"""Replay every cluster workflow run (and periodic job firing) a test session made,
with this code.

The end-to-end and fault suites run real workers against a dev server; when their
server stops, every run of the cluster workflow it holds is fetched and replayed
offline (``temporalio.worker.Replayer``), so a divergence that only shows on a later
takeover fails the suite that recorded it (issue 35). Runs a worker's watchdog reset
are left to the tests that make them (a planted determinism bug is reset on purpose,
and the kill matrices check their own): their history ends with the reset's mark.
So are runs failing with the open Core defect of a local activity's result taken one
task late, recognised by its exact shape (``tests.faults.checks.la_late``).
"""

from __future__ import annotations

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.worker import Replayer

from forge.wire import contract as c
from forge.wire.codec import data_converter
from forge.wire.periodic import WORKFLOW_PERIODIC
from tests.faults.checks import la_late
from workflows.cluster import ClusterWorkflow
from workflows.periodic import PeriodicJobWorkflow

__all__ = ["replay_every_run"]


async def replay_every_run(client: Client) -> list[str]:
    """Each run that fails replay, as ``workflow id/run id: error``."""
    replayer = Replayer(
        workflows=[ClusterWorkflow, PeriodicJobWorkflow], data_converter=data_converter()
    )
    failures: list[str] = []
    types = f"WorkflowType = '{c.WORKFLOW_TYPE}' OR WorkflowType = '{WORKFLOW_PERIODIC}'"
    async for wf in client.list_workflows(types):
        history = await client.get_workflow_handle(wf.id, run_id=wf.run_id).fetch_history()
        last = history.events[-1] if history.events else None
        if (
            last is not None
            and last.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED
            and last.workflow_execution_terminated_event_attributes.reason.startswith(
                "forge watchdog:"
            )
        ):
            continue
        result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
        if result.replay_failure is None:
            continue
        if la_late(history.events, str(result.replay_failure)):
            continue  # the open Core defect, by its exact shape: the kill test counts it
        failures.append(f"{wf.id}/{wf.run_id}: {str(result.replay_failure)[:300]}")
    return failures
