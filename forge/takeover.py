"""Evict a run from a worker's cache after a legacy query it answered from a history
that had moved on, so the worker's next workflow task for it replays from scratch.

Why (the query-takeover defect, temporalio 1.35 / Core; RELIABILITY.md, "Intakes"):
when a worker dies and a query reaches a worker that answers it from the run's
history, Core runs the events that trail the last completed workflow task (a
timer's firing, an activity's result, a signal) through the workflow code as a
*live* activation, and keeps the commands it made. The updates of the next real
task then come in an activation of their own, after those commands. A replay runs
the trailing events and the updates as one activation, updates first, so the
recorded history fails its own replay: the watchdog resets the run and a user's
change is sent again. Forge's loop avoids emitting commands in such an activation
where it can tell (``ClusterWorkflow._past``), but it cannot tell every time (a
persist's result, a wake by mail, a worker that died inside a task).

What this does: when an activation holds a legacy query (Core's id
``legacy_query``) and the run ran any live activation since this worker last built
it from history, the worker asks Core to evict it, before it answers: Core replies
to the query, then evicts, then takes any task that came meanwhile. The commands a stale activation
made are dropped with the cached run; the next task replays the history and takes
the trailing events and the updates together, as every later replay will. A worker
that only answers queries (rebuilt by one, no live activation since) is not evicted
again, so a stream of queries to an idle run costs one rebuild, not one per query.
The cost: the first legacy query after live work costs the run one replay on its
next task (bounded, as every takeover is, by continue-as-new on replay cost).

The hook wraps a private SDK method (``_WorkflowWorker._handle_activation``);
``install`` says whether it could, and ``tests/faults/test_upstream_query_takeover``
fails if an SDK upgrade moves it or fixes the defect.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import structlog

__all__ = ["LEGACY_QUERY", "evictions", "install", "wants_eviction"]

log = structlog.get_logger("forge.takeover")

#: Core's query id for a query sent as its own task (not with a workflow task).
LEGACY_QUERY = "legacy_query"

_MARK = "_forge_evicts_after_query"
_counts = {"evictions": 0}


def evictions() -> int:
    """Runs this process evicted after a query (a figure for tests and logs)."""
    return _counts["evictions"]


def wants_eviction(live: dict[str, bool], act: Any) -> bool:
    """Note what ``act`` (a Core workflow activation) did to its run and say whether
    the run should leave the cache once it has been handled. ``live`` maps a run to
    whether it ran a live activation since it was last built from history."""
    run = act.run_id
    kinds = [job.WhichOneof("variant") for job in act.jobs]
    if "remove_from_cache" in kinds:
        live.pop(run, None)
        return False
    legacy = any(
        job.WhichOneof("variant") == "query_workflow"
        and job.query_workflow.query_id == LEGACY_QUERY
        for job in act.jobs
    )
    if any(kind != "query_workflow" for kind in kinds):
        # a replaying activation is the run being built from recorded history
        live[run] = not act.is_replaying
    if legacy and live.get(run, False):
        live[run] = False
        return True
    return False


def install() -> bool:
    """Wrap the SDK's activation handler once per process. False when this SDK has
    no such handler (then nothing is changed, and the caller logs it)."""
    try:
        from temporalio.worker import _workflow
    except ImportError:  # pragma: no cover - an SDK without the private module
        return False
    cls = getattr(_workflow, "_WorkflowWorker", None)
    original: Callable[..., Awaitable[None]] | None = getattr(cls, "_handle_activation", None)
    if cls is None or original is None:
        return False
    if getattr(original, _MARK, False):
        return True

    async def handle(self: Any, act: Any) -> None:
        live: dict[str, bool] = self.__dict__.setdefault(_MARK, {})
        if wants_eviction(live, act) and act.run_id in self._running_workflows:
            # Asked while the query's activation is outstanding, so Core answers the
            # query, then evicts, then takes a task that arrived meanwhile on a fresh
            # replay. Asked after the answer, the eviction raced such a task:
            # measured at 5k/50k, it invalidated the task in flight (a 20 s timeout)
            # and the retry failed with a nondeterminism error.
            _counts["evictions"] += 1
            log.debug("run evicted after a query", run_id=act.run_id)
            self._bridge_worker().request_workflow_eviction(act.run_id)
        await original(self, act)

    setattr(handle, _MARK, True)
    cls._handle_activation = handle
    return True
