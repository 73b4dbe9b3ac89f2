"""A worker process for :mod:`tests.faults.upstream.loop`, killed with SIGKILL by the
test: ``python -m tests.faults.upstream.worker ADDRESS TASK_QUEUE [evict]``; with
``evict`` it runs Forge's workaround (:mod:`forge.takeover`) and nothing else of
Forge. Its sticky queue times out after 2 s (the default is 10 s) so the takeover
happens quickly."""

from __future__ import annotations

import asyncio
import sys
from datetime import timedelta

from temporalio.client import Client
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from tests.faults.upstream.loop import Loop, write


async def main(address: str, queue: str, evict: bool) -> None:
    if evict:
        from forge import takeover

        assert takeover.install(), "this SDK has no activation hook"
    client = await Client.connect(address)
    async with Worker(
        client,
        task_queue=queue,
        workflows=[Loop],
        activities=[write],
        workflow_runner=UnsandboxedWorkflowRunner(),
        sticky_queue_schedule_to_start_timeout=timedelta(seconds=2),
    ):
        print("polling", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3:] == ["evict"]))
