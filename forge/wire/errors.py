"""The ``ApplicationError`` types that cross Temporal, and the two translations
between them and :mod:`forge.errors` kinds.

The workflow raises some, the activities others, and the client and the workflow's
retry policy match on them by string: a name spelt differently on one side is a
refusal retried for ever, or a retry that never comes. So each is written once, on
its kind (:attr:`forge.errors.ForgeError.wire_type`, mapped back by
:data:`forge.errors.WIRE_TYPES`), named here, and every side imports it.
Plain-JSON clients see these strings too: a name never changes meaning.

temporalio is imported only inside the two functions, so naming a type costs nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from forge import errors as forge_errors
from forge.errors import Busy, Conflict, ForgeError, InvalidInput, NotFound, from_wire

if TYPE_CHECKING:
    from temporalio.exceptions import ApplicationError

__all__ = [
    "BUSY",
    "INVALID_INPUT",
    "LOOP_ACTIVITY_FAILED",
    "NON_RETRYABLE_STORE",
    "NOT_FOUND",
    "STALE_FENCE",
    "STORE_ERROR",
    "decode",
    "decode_query",
    "encode",
    "encode_query",
]

#: A persist fenced by an older (generation, pass) than the store holds: another run
#: wrote since. The workflow reloads its state from the store and plans again.
STALE_FENCE: Final = Conflict.wire_type
#: The store refused the data itself (a constraint, a conflict): retrying cannot help.
STORE_ERROR: Final = forge_errors.STORE_ERROR
#: An update refused for its input: the caller's fault, never retried.
INVALID_INPUT: Final = InvalidInput.wire_type
#: An update naming a job, group or node that does not exist: never retried.
NOT_FOUND: Final = NotFound.wire_type
#: An update refused while the run is due to continue as new: nothing reached
#: history, and the client retries it against the next run.
BUSY: Final = Busy.wire_type

#: The failure type of a workflow task failed by an activity error the loop does not
#: handle (``workflows.activities.LoopActivityFailed``): the watchdog and ``forge
#: status`` show it with its message (activity, cause type, cause message).
LOOP_ACTIVITY_FAILED: Final = "LoopActivityFailed"

#: The store activities' failures that no retry can fix.
NON_RETRYABLE_STORE: Final = (STALE_FENCE, STORE_ERROR, INVALID_INPUT)

#: The longest message an ApplicationError carries (it is in history).
MESSAGE_LIMIT: Final = 1000


def encode(err: ForgeError, kind: type[ForgeError] | None = None) -> ApplicationError:
    """``err`` as the ``ApplicationError`` of its kind (or of ``kind``): non-retryable,
    except a kind whose request may succeed later (:class:`~forge.errors.Busy`)."""
    from temporalio.exceptions import ApplicationError

    wire_type = (kind or type(err)).wire_type
    return ApplicationError(
        str(err)[:MESSAGE_LIMIT], type=wire_type, non_retryable=wire_type != BUSY
    )


def decode(failure: ApplicationError, default: type[ForgeError] = ForgeError) -> ForgeError:
    """The kind an ``ApplicationError`` stands for (:data:`forge.errors.WIRE_TYPES`;
    ``default`` for a type it does not know), with the failure's message and, when
    the SDK wrapped one (a request it could not decode), the inner failure's."""
    from temporalio.exceptions import ApplicationError

    message = failure.message or str(failure)
    if isinstance(failure.cause, ApplicationError):
        message = f"{message}: {failure.cause.message}"
    return from_wire(failure.type, message, default)


def encode_query(err: ForgeError) -> ApplicationError:
    """``err`` as a query handler raises it. A failed query reaches the client as its
    message alone (no type, no details), so the kind leads the message
    (``NotFound: unknown job 'x'``) for :func:`decode_query`."""
    return encode(type(err)(f"{err.wire_type}: {err}"))


def decode_query(message: str) -> ForgeError | None:
    """The kind a failed query's message names first (:func:`encode_query`), with
    the rest of the message; None: not one Forge sent."""
    wire_type, sep, rest = message.partition(": ")
    if not sep or wire_type not in forge_errors.WIRE_TYPES:
        return None
    return from_wire(wire_type, rest)
