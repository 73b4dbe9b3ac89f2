"""What a request may be and when to try it again: the rules ``ForgeClient`` applies
before and after it talks to Temporal, kept apart so they can be tested without it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from pydantic import BaseModel
from temporalio.client import WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from forge.client.failures import run_ended, task_failing
from forge.core.models import MAX_BATCH_BYTES
from forge.errors import ForgeError, InvalidInput
from forge.wire import errors

__all__ = [
    "BUSY_DELAYS",
    "MAX_REQUEST_BYTES",
    "MAX_UPDATES_IN_FLIGHT",
    "RETRY_DELAYS",
    "TASK_FAILING_DELAYS",
    "ForgeError",
    "batches",
    "busy",
    "busy_refusal",
    "check_size",
    "lost_with_worker",
    "run_ended",
    "task_failing",
]

_M = TypeVar("_M", bound=BaseModel)

#: Temporal admits few updates in flight per workflow (10 by default). The client
#: keeps below that and retries, with backoff, the rare refusal that still comes
#: when other clients share the workflow.
MAX_UPDATES_IN_FLIGHT = 8
RETRY_DELAYS = (0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 5.0, 5.0, 5.0, 5.0)
#: After a "busy" refusal (the run is about to continue as new, which takes about a
#: second): retry briskly, for up to a minute. A refusal leaves nothing in history.
BUSY_DELAYS = (0.05, 0.1, 0.2, 0.3, *(0.5,) * 118)
#: After a refusal because the run's workflow task keeps failing (Temporal refuses
#: updates from its third attempt until one completes: "Workflow Task in failed
#: state"): a worker's watchdog resets a run stuck on nondeterminism within its
#: period (10 s by default), and the update then goes through. Retried for about a
#: minute; nothing entered history.
TASK_FAILING_DELAYS = (0.25, 0.5, 1.0, 2.0, *(4.0,) * 15)
#: The largest request (as JSON) the client sends: a batch of MAX_BATCH_BYTES plus
#: its envelope. Temporal refuses payloads over 2 MiB, and one that gets through
#: near that size makes the workflow's own commands too big; so a bigger request
#: is refused here, as bad input, before anything is sent.
MAX_REQUEST_BYTES = MAX_BATCH_BYTES + 64 * 1024


def busy(err: RPCError) -> bool:
    if "exceeds maximum size" in str(err) or "larger than max" in str(err):
        return False  # a gRPC message too big: retrying cannot help
    return err.status == RPCStatusCode.RESOURCE_EXHAUSTED or "in-flight" in str(err)


def busy_refusal(err: WorkflowUpdateFailedError) -> bool:
    """The workflow refused the update because its run is about to continue as new:
    retried, not reported."""
    cause = err.cause
    return isinstance(cause, ApplicationError) and cause.type == errors.BUSY


#: What Temporal answers when the workflow task that carried an update was lost (its
#: worker was killed before it answered): the update was never accepted.
LOST_WITH_WORKER = "wasn't processed by worker"


def lost_with_worker(err: WorkflowUpdateFailedError) -> bool:
    """The update never reached workflow code (the worker holding the task died):
    nothing was applied, so it is sent again rather than reported as refused."""
    cause = err.cause
    message = str(getattr(cause, "message", None) or cause or err)
    return LOST_WITH_WORKER in message


def batches(items: Sequence[_M], count: int) -> list[list[_M]]:
    """Consecutive batches of at most ``count`` items and MAX_BATCH_BYTES of JSON
    (an item bigger than that alone is a batch of its own, refused by the size check)."""
    out: list[list[_M]] = []
    batch: list[_M] = []
    size = 0
    for item in items:
        n = len(item.model_dump_json())
        if batch and (len(batch) >= count or size + n > MAX_BATCH_BYTES):
            out.append(batch)
            batch, size = [], 0
        batch.append(item)
        size += n
    if batch:
        out.append(batch)
    return out


def check_size(what: str, arg: object) -> None:
    """Refuse, before sending, a request too big for Temporal (InvalidInput)."""
    if not isinstance(arg, BaseModel):
        return
    size = len(arg.model_dump_json())
    if size > MAX_REQUEST_BYTES:
        raise InvalidInput(
            f"{what}: the request is {size / 1024:,.0f} KiB as JSON; one request may carry "
            f"at most {MAX_REQUEST_BYTES // 1024:,} KiB (Temporal refuses payloads over 2 MiB)"
        )
