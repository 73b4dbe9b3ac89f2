"""The ``ApplicationError`` type names that cross Temporal.

The workflow raises some, the activities others, and the client and the workflow's
retry policy match on them by string: a name spelt differently on one side is a
refusal retried for ever, or a retry that never comes. So each is written here,
once, and every side imports it.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "BUSY",
    "INVALID_INPUT",
    "LOOP_ACTIVITY_FAILED",
    "NON_RETRYABLE_STORE",
    "STALE_FENCE",
    "STORE_ERROR",
]

#: A persist fenced by an older (generation, pass) than the store holds: another run
#: wrote since. The workflow reloads its state from the store and plans again.
STALE_FENCE: Final = "StaleFence"
#: The store refused the data itself (a constraint, a conflict): retrying cannot help.
STORE_ERROR: Final = "StoreError"
#: An update refused for its input: the caller's fault, never retried.
INVALID_INPUT: Final = "InvalidInput"
#: An update refused while the run is due to continue as new: nothing reached
#: history, and the client retries it against the next run.
BUSY: Final = "Busy"

#: The failure type of a workflow task failed by an activity error the loop does not
#: handle (``workflows.activities.LoopActivityFailed``): the watchdog and ``forge
#: status`` show it with its message (activity, cause type, cause message).
LOOP_ACTIVITY_FAILED: Final = "LoopActivityFailed"

#: The store activities' failures that no retry can fix.
NON_RETRYABLE_STORE: Final = (STALE_FENCE, STORE_ERROR, INVALID_INPUT)
