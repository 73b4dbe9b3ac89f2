"""Is the cluster workflow there, and is its workflow task failing? With the fewest
imports: the bare gRPC service client and one ``DescribeWorkflowExecution`` (no
``temporalio.client``, no data converter), for readers such as ``forge status`` that
take everything else from the store. A run whose workflow task is on a second
attempt may be stuck: :func:`forge.client.watchdog.diagnose` (the full client) says.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING

from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import WorkflowExecutionStatus
from temporalio.api.workflowservice.v1 import DescribeWorkflowExecutionRequest
from temporalio.service import ConnectConfig, ServiceClient

if TYPE_CHECKING:
    from forge.settings import Settings

__all__ = ["Probe", "connect", "probe"]


@dataclass(frozen=True, slots=True)
class Probe:
    """What describe() says of the workflow's current run."""

    running: bool
    attempt: int  # the pending workflow task's attempt (0: none pending)

    @property
    def maybe_stuck(self) -> bool:
        """The same test as the watchdog's first: a workflow task failed at least once."""
        return self.running and self.attempt >= 2


async def connect(s: Settings) -> ServiceClient:
    """A service client for the settings' connection (what ``Client.connect`` builds
    underneath: address, TLS, API key, gRPC metadata)."""
    config = dict(s.connect_config())
    config.pop("namespace", None)  # per request, not per connection
    return await ServiceClient.connect(
        ConnectConfig(**config, identity=f"{os.getpid()}@{socket.gethostname()}")  # type: ignore[arg-type]
    )


async def probe(service: ServiceClient, namespace: str, workflow_id: str) -> Probe:
    """Describe the workflow's latest run (``RPCError`` NOT_FOUND if there is none)."""
    request = DescribeWorkflowExecutionRequest(
        namespace=namespace, execution=WorkflowExecution(workflow_id=workflow_id)
    )
    desc = await service.workflow_service.describe_workflow_execution(request, retry=True)
    running = (
        desc.workflow_execution_info.status
        == WorkflowExecutionStatus.WORKFLOW_EXECUTION_STATUS_RUNNING
    )
    return Probe(running=running, attempt=desc.pending_workflow_task.attempt)
