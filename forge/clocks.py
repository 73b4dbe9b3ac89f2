"""The one wall clock the loop reads: how long a pass's planning ran.

Workflow code reads no clock for decisions. This one measures (a metric, and the
figure the persist activity records in history for forge.core.budget); it lives in
a module the workflow sandbox passes through, so a test can stand in a slower
worker's clock without touching the SDK's own.
"""

from __future__ import annotations

import time

__all__ = ["plan_clock"]


def plan_clock() -> float:
    return time.perf_counter()
