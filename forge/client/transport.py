"""How a request reaches the cluster workflow: the transport under ``ForgeClient``.

:class:`~forge.client.client.ForgeClient` holds the verbs (submit, scale, drain ...)
and what each means; this base class holds the one way they all travel, so every
verb gets the same rules: a size check before sending (:mod:`forge.client.limits`),
at most ``MAX_UPDATES_IN_FLIGHT`` updates at once, a busy server, a run about to
continue as new or a run whose workflow task keeps failing (until the watchdog
resets it) retried with backoff, and update-with-start, which starts the
cluster workflow in the same call when it is not running (with its search
attribute, or without one on a server where it is not registered).

Not public: users build a ``ForgeClient``; the methods here are its internals.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from typing import Any

from pydantic import BaseModel
from temporalio.client import (
    Client,
    WithStartWorkflowOperation,
    WorkflowHandle,
    WorkflowUpdateFailedError,
)
from temporalio.common import (
    SearchAttributeKey,
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDConflictPolicy,
)
from temporalio.service import RPCError

from forge.client import failures
from forge.client.failures import refused
from forge.client.limits import (
    BUSY_DELAYS,
    MAX_UPDATES_IN_FLIGHT,
    RETRY_DELAYS,
    TASK_FAILING_DELAYS,
    busy,
    busy_refusal,
    lost_with_worker,
    run_ended,
    task_failing,
)
from forge.client.limits import check_size as _check_size
from forge.wire import contract as c

__all__ = ["WORKFLOW_TASK_TIMEOUT", "Transport", "all_or_first_failure"]

WORKFLOW_TASK_TIMEOUT = timedelta(seconds=20)


class Transport:
    """One cluster workflow's address and the state of the conversation with it:
    whether it was seen running (plain updates then, no update-with-start), the
    lock one starting caller holds, and the in-flight budget."""

    def __init__(
        self,
        client: Client,
        *,
        cluster: str,
        task_queue: str,
        options: c.ClusterOptions,
        search_attributes: bool,
    ) -> None:
        self.client = client
        self.search_attributes = search_attributes
        self._in_flight: asyncio.Semaphore | None = None
        self._running = False  # seen running: plain updates, no update-with-start
        self._starting: asyncio.Lock | None = None
        self.cluster = cluster
        self.task_queue = task_queue
        self.options = options

    def _where(self) -> failures.Where:
        """What an error message names (read off the SDK's client when it has them)."""
        service = getattr(self.client, "service_client", None)
        config = getattr(service, "config", None)
        return failures.Where(
            address=str(getattr(config, "target_host", "?")),
            namespace=str(getattr(self.client, "namespace", "?")),
            cluster=self.cluster,
            task_queue=self.task_queue,
            workflow_id=self.workflow_id,
        )

    @property
    def workflow_id(self) -> str:
        return c.workflow_id(self.cluster)

    def handle(self) -> WorkflowHandle[Any, Any]:
        return self.client.get_workflow_handle(self.workflow_id)

    def _start_kwargs(self, with_attributes: bool) -> dict[str, Any]:
        kw: dict[str, Any] = {
            "id": self.workflow_id,
            "task_queue": self.task_queue,
            "task_timeout": WORKFLOW_TASK_TIMEOUT,
            "static_summary": f"Forge cluster `{self.cluster}`",
            "static_details": (
                f"Reconciles cluster **{self.cluster}**: places replicas, persists bindings, "
                "reschedules off lost nodes, backs off what cannot be placed."
            ),
        }
        if with_attributes:
            kw["search_attributes"] = TypedSearchAttributes(
                [SearchAttributePair(SearchAttributeKey.for_keyword(c.SA_CLUSTER), self.cluster)]
            )
        return kw

    def _input(self) -> c.ClusterInput:
        return c.ClusterInput(cluster=self.cluster, options=self.options)

    async def _update_with_start(self, name: str, req: BaseModel, result_type: Any) -> Any:
        """Update ``name`` by update-with-start: the same call starts the cluster
        workflow when it is not running."""
        _check_size(name, req)
        for with_attrs in (True, False)[0 if self.search_attributes else 1 :]:
            # an operation serves one attempt only: _admitted retries a busy server
            # with a new one (reusing it raises "cannot be reused")
            ops: list[WithStartWorkflowOperation[Any, Any]] = []

            def attempt(with_attrs: bool = with_attrs, ops: list[Any] = ops) -> Any:
                op: WithStartWorkflowOperation[Any, Any] = WithStartWorkflowOperation(
                    c.WORKFLOW_TYPE,
                    self._input(),
                    id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
                    **self._start_kwargs(with_attrs),
                )
                ops.append(op)
                return self.client.execute_update_with_start_workflow(
                    name, req, start_workflow_operation=op, result_type=result_type
                )

            try:
                result = await self._admitted(attempt)
                self._running = True
                await _retrieve(ops[:-1])
                return result
            except (WorkflowUpdateFailedError, RPCError) as err:
                # the start half of a failed update-with-start holds an exception
                # too: retrieve it, or asyncio reports it at exit
                await _retrieve(ops)
                if isinstance(err, WorkflowUpdateFailedError):
                    if busy_refusal(err) or lost_with_worker(err):
                        # running, about to continue as new; or its task was lost
                        self._running = True
                        return await self._update(name, req, result_type)
                    raise refused(err) from err
                if with_attrs and "search attribute" in str(err).lower():
                    continue
                raise
        raise AssertionError("unreachable")

    async def _signal(self, name: str, arg: BaseModel) -> None:
        _check_size(name, arg)
        await self.handle().signal(name, arg)

    async def _update(self, name: str, arg: Any, result_type: Any) -> Any:
        _check_size(name, arg)
        for delay in (*BUSY_DELAYS, None):
            try:
                return await self._admitted(
                    lambda: self.handle().execute_update(name, arg, result_type=result_type)
                )
            except WorkflowUpdateFailedError as err:
                if delay is None or not (busy_refusal(err) or lost_with_worker(err)):
                    raise refused(err) from err
            await asyncio.sleep(delay)  # outside the in-flight budget
        raise AssertionError("unreachable")

    async def _admitted(self, call: Callable[[], Awaitable[Any]]) -> Any:
        """Run an update call within the in-flight budget, retrying when busy or
        while the run's workflow task keeps failing (each with its own backoff)."""
        if self._in_flight is None:
            self._in_flight = asyncio.Semaphore(MAX_UPDATES_IN_FLIGHT)
        async with self._in_flight:
            busy_delays, failing_delays = iter(RETRY_DELAYS), iter(TASK_FAILING_DELAYS)
            while True:
                try:
                    return await call()
                except RPCError as err:
                    if busy(err):
                        delays = busy_delays
                    elif task_failing(err) or run_ended(err):
                        delays = failing_delays
                    else:
                        delays = None
                    delay = None if delays is None else next(delays, None)
                    if delay is None:
                        raise
                    await asyncio.sleep(delay)


async def all_or_first_failure(calls: Sequence[Awaitable[None]]) -> None:
    """Await every call concurrently; on the first failure cancel the rest and raise
    that failure as it is (no ExceptionGroup: the CLI maps error kinds to exit codes)."""
    tasks = [asyncio.ensure_future(call) for call in calls]
    if not tasks:
        return
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for t in tasks:
        failure = None if t.cancelled() else t.exception()
        if failure is not None:
            raise failure


async def _retrieve(ops: Sequence[WithStartWorkflowOperation[Any, Any]]) -> None:
    """Take the outcome of each failed attempt's start half (else asyncio reports an
    exception never retrieved when the process exits)."""
    for op in ops:
        with contextlib.suppress(Exception):  # (bounded: an attempt refused as busy
            await asyncio.wait_for(op.workflow_handle(), 1.0)  # may never set it)
