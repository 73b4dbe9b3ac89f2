"""The one root of Forge's own exceptions, the few kinds a caller acts on, and the
one table between those kinds and the ``ApplicationError`` types that cross Temporal.

Why a hierarchy at all: a caller (the CLI, a script using the client, an activity)
needs to decide one thing about a failure, namely whose fault it is and so what to
do next: fix the input (exit 2, never retry), look up the right name (exit 1: the
job or node does not exist), wait for the environment (exit 1, retry later), or
re-read and try again (a conflict). Each module keeps its own specific class
(``StoreError``, ``InputError``, ``SettingsError`` ...) for ``except`` clauses that
want it, and subclasses one of these kinds so that a generic caller does not have
to know every module's classes.

**The wire.** Each kind names the ``ApplicationError`` type it travels as
(:attr:`ForgeError.wire_type`); :data:`WIRE_TYPES` maps those names back, with the
older names still accepted, and :func:`from_wire` rebuilds the kind on the other
side. Clients in other languages match on these strings, so a name here never
changes meaning; a new kind gets a new name.

Pure on purpose: no temporalio, no I/O, so :mod:`forge.core` may raise these too.
The exit code lives on the class so the CLI maps failures to exit codes in one
place (:func:`forge.cli.main`) and a new subclass cannot be forgotten there.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import ClassVar

__all__ = [
    "STORE_ERROR",
    "WIRE_TYPES",
    "Busy",
    "Conflict",
    "ForgeError",
    "InvalidInput",
    "NotFound",
    "Unavailable",
    "from_wire",
]


class ForgeError(Exception):
    """Root of every failure Forge reports on purpose (anything else is a bug)."""

    #: What the ``forge`` command exits with: 1, the environment failed.
    exit_code: ClassVar[int] = 1
    #: False when ``str(err)`` is already a complete message with its own prefix
    #: (a loader's ``FILE: where: what`` lines), so the CLI prints it as it is.
    prefixed: ClassVar[bool] = True
    #: The ``ApplicationError`` type this kind crosses Temporal as (:data:`WIRE_TYPES`).
    wire_type: ClassVar[str] = "ForgeError"
    #: The caller's fault: sending the same request again cannot succeed.
    caller_fault: ClassVar[bool] = False

    @property
    def bad_input(self) -> bool:
        """The caller's fault (bad input, or a name that does not exist): retrying
        the same request cannot succeed."""
        return self.caller_fault


class InvalidInput(ForgeError):
    """The request, a file, a flag or a setting is wrong; the message names the
    field. Nothing was changed."""

    exit_code = 2
    wire_type = "InvalidInput"
    caller_fault = True


class NotFound(ForgeError):
    """The request names something that does not exist (a job, a group, a node, a
    replica); the message names it. Nothing was changed, and asking again will not
    make it exist; exit 1, apart from malformed input's 2."""

    wire_type = "NotFound"
    caller_fault = True


class Unavailable(ForgeError):
    """Something Forge needs (Temporal, the store, a worker) did not answer or is
    busy; the same request may succeed later."""

    wire_type = "Unavailable"


class Busy(Unavailable):
    """The cluster workflow refused a request because its run is about to continue
    as new: nothing reached history, the same request succeeds shortly."""

    wire_type = "Busy"


class Conflict(ForgeError):
    """Someone else changed the thing first (a newer pass, a stale fence): re-read
    and decide again rather than retry blindly."""

    wire_type = "StaleFence"


#: The type a store's own failure crosses as (``forge.stores.StoreError``: the store
#: refused the data); it arrives as a plain :class:`ForgeError`.
STORE_ERROR = "StoreError"

#: ``ApplicationError`` type -> kind: every kind's own name, and the names of the
#: failures that cross as a plain kind (:data:`STORE_ERROR`).
WIRE_TYPES: Mapping[str, type[ForgeError]] = MappingProxyType(
    {
        **{
            kind.wire_type: kind
            for kind in (ForgeError, InvalidInput, NotFound, Unavailable, Busy, Conflict)
        },
        STORE_ERROR: ForgeError,
    }
)


def from_wire(
    wire_type: str | None, message: str, default: type[ForgeError] = ForgeError
) -> ForgeError:
    """The kind a failure of ``wire_type`` stands for, with ``message`` (``default``
    for a type this table does not know)."""
    return WIRE_TYPES.get(wire_type or "", default)(message)
