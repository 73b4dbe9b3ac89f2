"""ForgeClient waits out a run whose workflow task keeps failing.

From a failing workflow task's third attempt until one completes, Temporal refuses
every update with FAILED_PRECONDITION "Workflow Task in failed state" (nothing
enters history). A worker's watchdog resets a run stuck on nondeterminism within its
period, so the refusal is transient: the client retries it with backoff, as it does
a busy server, and only then reports the run as stuck (``Unavailable``, saying what
to look at). Seen in the kill test: ``submit_jobs`` refused while the watchdog had
yet to reset the run."""

from __future__ import annotations

from typing import Any

import pytest
from temporalio.service import RPCError, RPCStatusCode

from forge.client import transport
from forge.client.client import ForgeClient
from forge.errors import ForgeError, Unavailable
from forge.wire import contract as c
from tests.workflow.harness import job as harness_job

REFUSAL = "Unable to perform workflow execution update due to Workflow Task in failed state."


class _Refusing:
    """A client whose updates are refused ``times`` times with ``status``/``message``."""

    def __init__(
        self,
        times: int,
        status: RPCStatusCode = RPCStatusCode.FAILED_PRECONDITION,
        message: str = REFUSAL,
    ) -> None:
        self.times = times
        self.status = status
        self.message = message
        self.calls = 0

    def _answer(self, req: Any) -> Any:
        self.calls += 1
        if self.calls <= self.times:
            raise RPCError(self.message, self.status, b"")
        return [
            c.JobResult(job_id=j.id, revision=1, desired=1, bound=0, pending=1) for j in req.jobs
        ]

    def get_workflow_handle(self, workflow_id: str) -> Any:
        client = self

        class Handle:
            async def execute_update(self, name: str, arg: Any, result_type: Any = None) -> Any:
                assert name == c.UPDATE_SUBMIT_JOBS
                return client._answer(arg)

        return Handle()

    async def execute_update_with_start_workflow(self, name: str, req: Any, **kw: Any) -> Any:
        return self._answer(req)


@pytest.fixture(autouse=True)
def _no_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    """The backoff's length is not what is tested here: every pause is instant."""
    monkeypatch.setattr(transport, "TASK_FAILING_DELAYS", (0.0,) * 6, raising=False)


def _client(fake: _Refusing, *, running: bool) -> ForgeClient:
    fc = ForgeClient(fake, search_attributes=False)  # type: ignore[arg-type]
    fc._running = running  # seen running: plain updates (else update-with-start)
    return fc


@pytest.mark.parametrize("running", [True, False], ids=["update", "update-with-start"])
async def test_a_refusal_while_the_task_keeps_failing_is_waited_out(running: bool) -> None:
    fake = _Refusing(times=3)
    results = await _client(fake, running=running).submit_jobs([harness_job("web")])
    assert [r.job_id for r in results] == ["web"]
    assert fake.calls == 4


async def test_a_run_that_stays_stuck_is_reported_as_stuck_after_the_retries() -> None:
    fake = _Refusing(times=100)
    with pytest.raises(Unavailable, match="keeps failing") as info:
        await _client(fake, running=True).submit_jobs([harness_job("web")])
    assert "forge cluster status" in str(info.value)
    assert isinstance(info.value.__cause__, RPCError)  # the SDK's error stays the cause
    assert fake.calls == 7  # the first call and one per pause


async def test_another_failed_precondition_is_not_retried() -> None:
    fake = _Refusing(times=1, message="Workflow is closing.")
    with pytest.raises(ForgeError, match="closing"):
        await _client(fake, running=True).submit_jobs([harness_job("web")])
    assert fake.calls == 1


@pytest.mark.parametrize(
    "message",
    [
        # an update the run had accepted, or not yet received, when it ended
        "workflow execution already completed",
        # one a stuck run never accepted, when the watchdog reset it (seen in
        # tests/faults/test_watchdog.py: the user's scale was lost)
        "workflow update was aborted by closing workflow",
    ],
    ids=["completed", "aborted"],
)
async def test_an_update_whose_run_ended_under_it_is_sent_to_the_new_run(message: str) -> None:
    """A watchdog's reset (or a continue-as-new) ended the run the update reached:
    the CLI said "cluster is not running" and the user's change was never made (seen
    in bench/takeover.py). Every update may be applied twice, so it is sent again."""
    fake = _Refusing(times=2, status=RPCStatusCode.NOT_FOUND, message=message)
    results = await _client(fake, running=True).submit_jobs([harness_job("web")])
    assert [r.job_id for r in results] == ["web"] and fake.calls == 3


async def test_a_cluster_never_started_is_not_waited_for() -> None:
    fake = _Refusing(times=1, status=RPCStatusCode.NOT_FOUND, message="workflow not found")
    with pytest.raises(Unavailable, match="is not running"):
        await _client(fake, running=True).submit_jobs([harness_job("web")])
    assert fake.calls == 1


class _LostOnce(_Refusing):
    """The first update's workflow task is lost with its worker (never accepted)."""

    def _answer(self, req: Any) -> Any:
        from temporalio.client import WorkflowUpdateFailedError
        from temporalio.exceptions import ApplicationError

        if self.calls == 0:
            self.calls += 1
            lost = "Workflow Update is rejected because it wasn't processed by worker."
            raise WorkflowUpdateFailedError(ApplicationError(lost))
        return super()._answer(req)


@pytest.mark.parametrize("running", [True, False], ids=["update", "update-with-start"])
async def test_an_update_lost_with_its_worker_is_sent_again(
    running: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seen in bench/takeover.py: kill -9 of the worker holding the update's task made
    `forge job run` exit 2 as if the job were bad input. Nothing was applied."""
    monkeypatch.setattr(transport, "BUSY_DELAYS", (0.0,) * 3)
    fake = _LostOnce(times=0)
    results = await _client(fake, running=running).submit_jobs([harness_job("web")])
    assert [r.job_id for r in results] == ["web"] and fake.calls == 2
