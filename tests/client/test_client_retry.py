"""ForgeClient's update-with-start retried on a busy server: each attempt gets a new
start operation (the SDK refuses one used before: "cannot be reused"), seen when
more than ten updates were in flight during a worker kill."""

from __future__ import annotations

from typing import Any

from temporalio.service import RPCError, RPCStatusCode

from forge.client.client import ForgeClient
from forge.wire import contract as c
from tests.workflow.harness import job as harness_job


class _BusyOnce:
    """A client whose first update-with-start finds the server busy."""

    def __init__(self) -> None:
        self.ops: list[Any] = []

    async def execute_update_with_start_workflow(self, *args: Any, **kw: Any) -> Any:
        op = kw["start_workflow_operation"]
        assert all(op is not seen for seen in self.ops), "a start operation was reused"
        self.ops.append(op)
        if len(self.ops) == 1:
            raise RPCError(
                "limit on number of concurrent in-flight updates has been reached (10)",
                RPCStatusCode.RESOURCE_EXHAUSTED,
                b"",
            )
        return c.JobResult(job_id="web", revision=1, desired=1, bound=0, pending=1)


async def test_a_busy_update_with_start_is_retried_with_a_new_start_operation() -> None:
    fake = _BusyOnce()
    fc = ForgeClient(fake, search_attributes=False)  # type: ignore[arg-type]
    job = harness_job("web")
    result = await fc._submit_with_start(c.SubmitJob(job=job))
    assert result.job_id == "web"
    assert len(fake.ops) == 2
