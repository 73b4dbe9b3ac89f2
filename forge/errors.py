"""The one root of Forge's own exceptions, and the few kinds a caller acts on.

Why a hierarchy at all: a caller (the CLI, a script using the client, an activity)
needs to decide one thing about a failure, namely whose fault it is and so what to
do next: fix the input (exit 2, never retry), wait for the environment (exit 1,
retry later), or re-read and try again (a conflict). Each module keeps its own
specific class (``StoreError``, ``InputError``, ``SettingsError`` ...) for
``except`` clauses that want it, and subclasses one of these kinds so that a
generic caller does not have to know every module's classes.

Pure on purpose: no temporalio, no I/O, so :mod:`forge.core` may raise these too.
The exit code lives on the class so the CLI maps failures to exit codes in one
place (:func:`forge.cli.main`) and a new subclass cannot be forgotten there.
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "Conflict",
    "ForgeError",
    "InvalidInput",
    "NotFound",
    "Unavailable",
]


class ForgeError(Exception):
    """Root of every failure Forge reports on purpose (anything else is a bug)."""

    #: What the ``forge`` command exits with: 1, the environment failed.
    exit_code: ClassVar[int] = 1
    #: False when ``str(err)`` is already a complete message with its own prefix
    #: (a loader's ``FILE: where: what`` lines), so the CLI prints it as it is.
    prefixed: ClassVar[bool] = True

    @property
    def bad_input(self) -> bool:
        """The caller's fault: retrying the same request cannot succeed."""
        return self.exit_code == 2


class InvalidInput(ForgeError):
    """The request, a file, a flag or a setting is wrong; the message names the
    field. Nothing was changed."""

    exit_code = 2


class NotFound(InvalidInput):
    """The request names something that does not exist (a job, a group, a node).
    Bad input too: asking again will not make it exist."""


class Unavailable(ForgeError):
    """Something Forge needs (Temporal, the store, a worker) did not answer or is
    busy; the same request may succeed later."""


class Conflict(ForgeError):
    """Someone else changed the thing first (a newer pass, a stale fence): re-read
    and decide again rather than retry blindly."""
