"""The client's error boundary: what Temporal raises, as :mod:`forge.errors` kinds.

``ForgeClient`` (and the ``forge`` commands, through it or through the bare service
client of :mod:`forge.client.probe`) raise only ``ForgeError`` kinds; this module is
where the SDK's exceptions become them, each with a message that says what to do:

- a connection that fails or times out: :class:`~forge.errors.Unavailable`, naming
  the address;
- an ``RPCError``: NOT_FOUND for the workflow is a cluster that is not running
  (:class:`~forge.errors.Unavailable`: start it), a deadline or UNAVAILABLE is
  Temporal or the worker not answering, an update refused while the run's workflow
  task keeps failing is the run stuck (``Unavailable``: what to look at), anything
  else a plain ``ForgeError``;
- an update the workflow refused: the kind its ``ApplicationError`` type names
  (:func:`forge.wire.errors.decode`: ``InvalidInput``, ``NotFound``, ``Busy`` ...);
- a payload this process cannot decrypt: a settings problem (the codec keys).

temporalio is imported lazily and its client module only looked up when loaded, so
the reader path (``forge status``) pays for the service client only.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from forge.errors import ForgeError, InvalidInput, Unavailable

if TYPE_CHECKING:
    from temporalio.service import RPCError

__all__ = [
    "TASK_FAILING",
    "Where",
    "connect_failure",
    "connect_problem",
    "one_line",
    "run_ended",
    "task_failing",
    "translate",
]

#: What Temporal says (FAILED_PRECONDITION) when it refuses an update or a query
#: because the run's workflow task keeps failing (its third attempt or later).
TASK_FAILING = "workflow task in failed state"


def task_failing(err: RPCError) -> bool:
    """Temporal refused the call because the run's workflow task keeps failing
    (FAILED_PRECONDITION, "Workflow Task in failed state"): the transport retries
    it, as the run may be reset or heal meanwhile; past that it is the run stuck."""
    from temporalio.service import RPCStatusCode  # lazily: the CLI's start-up stays light

    return err.status == RPCStatusCode.FAILED_PRECONDITION and TASK_FAILING in str(err).lower()


#: What Temporal says (NOT_FOUND) to an update in flight when the run it reached ends
#: under it: a watchdog's reset terminated it, or it continued as new. The second is
#: what an update gets that a stuck run never accepted when the run is reset.
RUN_ENDED = ("workflow execution already completed", "update was aborted by closing workflow")


def run_ended(err: RPCError) -> bool:
    """The run the call reached ended under it (a reset, a continue-as-new) while the
    workflow goes on in a new run: the transport retries it there. Every update of
    the cluster workflow may be applied twice (a submission, a scale or a stop sets
    a state; a failure report is keyed by its binding), so a retry of one the old run
    did take is harmless, and one it did not take is not lost."""
    from temporalio.service import RPCStatusCode

    text = str(err).lower()
    return err.status == RPCStatusCode.NOT_FOUND and any(mark in text for mark in RUN_ENDED)


@dataclass(frozen=True, slots=True)
class Where:
    """What a message names: the server and the cluster workflow."""

    address: str
    namespace: str
    cluster: str
    task_queue: str
    workflow_id: str


def one_line(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def connect_problem(err: BaseException) -> str:
    """The useful part of the SDK's connect error (a Rust debug dump)."""
    text = str(err)
    messages = re.findall(r'message: "([^"]+)"', text)
    if messages:
        return str(messages[-1]).lower()
    return one_line(text.removeprefix("Failed client connect: "))


def connect_failure(err: BaseException, address: str) -> Unavailable:
    return Unavailable(f"cannot connect to Temporal at {address}: {connect_problem(err)}")


def translate(err: BaseException, where: Where) -> ForgeError | None:
    """``err`` as a Forge kind, or None when it is not one of Temporal's failures
    (a bug, or a ForgeError already)."""
    if isinstance(err, ForgeError):
        return None
    from forge.wire.encryption import CodecKeyError, TamperedPayload

    if isinstance(err, CodecKeyError | TamperedPayload):  # FORGE_CODEC_* differ from the worker's
        return InvalidInput(f"cannot read the answer of {where.workflow_id}: {err}")
    service = sys.modules.get("temporalio.service")
    if service is not None and isinstance(err, service.RPCError):
        return _rpc_failure(err, where)
    client = sys.modules.get("temporalio.client")
    if client is None:
        return None
    if isinstance(err, client.WorkflowUpdateFailedError):
        return refused(err)
    if isinstance(err, client.WorkflowUpdateRPCTimeoutOrCancelledError):
        return Unavailable(
            f"no answer from {where.workflow_id} in time: is a worker polling task queue "
            f"{where.task_queue!r}?"
        )
    if isinstance(err, client.WorkflowQueryFailedError | client.WorkflowQueryRejectedError):
        from forge.wire.errors import decode_query

        said = decode_query(str(err))  # a kind the query handler named (NotFound, Busy)
        return said or ForgeError(f"query refused by {where.workflow_id}: {one_line(str(err))}")
    return None


def refused(err: BaseException) -> ForgeError:
    """An update the workflow refused (a ``WorkflowUpdateFailedError``), as the kind
    its failure's type names; a failure without a type Forge knows is bad input."""
    from temporalio.exceptions import ApplicationError

    from forge.wire import errors

    cause = getattr(err, "cause", None)
    if isinstance(cause, ApplicationError):
        return errors.decode(cause, default=InvalidInput)
    return InvalidInput(getattr(cause, "message", None) or str(cause or err))


def _rpc_failure(err: BaseException, where: Where) -> ForgeError:
    from temporalio.service import RPCError, RPCStatusCode

    assert isinstance(err, RPCError)
    msg = one_line(err.message or str(err))
    if err.status == RPCStatusCode.NOT_FOUND and "workflow" in msg.lower():
        return Unavailable(
            f"cluster {where.cluster!r} is not running (no workflow {where.workflow_id} in "
            f"namespace {where.namespace!r}); start it with `forge cluster start` or "
            "`forge job run`"
        )
    if err.status == RPCStatusCode.DEADLINE_EXCEEDED or "timeout expired" in msg.lower():
        return Unavailable(
            f"the cluster workflow {where.workflow_id} did not answer in time: is a worker "
            f"(`forge worker`) polling task queue {where.task_queue!r} at {where.address}?"
        )
    if task_failing(err):
        return Unavailable(
            f"the cluster workflow {where.workflow_id} is stuck: its workflow task keeps "
            f"failing and Temporal refuses requests until one completes ({msg}); a "
            "worker's watchdog resets a run stuck on nondeterminism: see `forge cluster "
            "status` and the workers' logs"
        )
    if err.status in (RPCStatusCode.UNAVAILABLE, RPCStatusCode.RESOURCE_EXHAUSTED):
        return Unavailable(f"Temporal at {where.address} is unavailable: {msg}")
    return ForgeError(f"Temporal at {where.address}: {err.status.name.lower()}: {msg}")
