"""``ForgeClient``: the typed way to talk to a cluster workflow.

It speaks only :mod:`forge.wire.contract` (names and models), so it never imports the
workflow's code. Starting a job uses update-with-start: if the cluster workflow
is not running yet, the same call starts it. How every verb travels (size checks,
the in-flight budget, busy retries, update-with-start) is :mod:`forge.client.transport`,
request limits are :mod:`forge.client.limits`, store reads :mod:`forge.client.reads`.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, Concatenate, ParamSpec, TypeVar

from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.service import RPCError, RPCStatusCode

from forge.client import failures, finish, periodic, reads, watchdog
from forge.client.limits import (
    MAX_REQUEST_BYTES,
    ForgeError,
)
from forge.client.limits import batches as _batches
from forge.client.limits import check_size as _check_size
from forge.client.search_attributes import SEARCH_ATTRIBUTES, ensure_search_attributes
from forge.client.transport import Transport, all_or_first_failure
from forge.core.models import Job, Node, TaskGroup
from forge.core.versions import with_tasks_of
from forge.errors import InvalidInput, NotFound
from forge.settings import Settings
from forge.stores.base import Store
from forge.wire import contract as c
from forge.wire.views import NodeUsage

__all__ = [
    "MAX_REQUEST_BYTES",
    "SEARCH_ATTRIBUTES",
    "ForgeClient",
    "ForgeError",
    "ensure_search_attributes",
]

_RESULTS = list[c.JobResult]
_P = ParamSpec("_P")
_T = TypeVar("_T")


def _forge_errors(
    method: Callable[Concatenate[ForgeClient, _P], Coroutine[Any, Any, _T]],
) -> Callable[Concatenate[ForgeClient, _P], Coroutine[Any, Any, _T]]:
    """The error boundary of a public method: what Temporal raises leaves as a
    :mod:`forge.errors` kind (:mod:`forge.client.failures`), caused by the original."""

    @functools.wraps(method)
    async def wrapper(self: ForgeClient, /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        try:
            return await method(self, *args, **kwargs)
        except Exception as err:
            kind = failures.translate(err, self._where())
            if kind is None:
                raise
            raise kind from err

    return wrapper


class ForgeClient(Transport):
    """Verbs on one cluster. Build it with :meth:`connect` or from a ``Client``.

    Every method raises only :mod:`forge.errors` kinds (the SDK's error is the
    ``__cause__``): ``InvalidInput`` for a request the workflow refused,
    ``NotFound`` for a job, group or node that does not exist, ``Unavailable`` when
    Temporal, the worker or the cluster workflow is not there."""

    def __init__(
        self,
        client: Client,
        *,
        cluster: str = "default",
        task_queue: str = c.TASK_QUEUE,
        options: c.ClusterOptions | None = None,
        search_attributes: bool = True,
        store: Store | None = None,
    ) -> None:
        super().__init__(
            client,
            cluster=cluster,
            task_queue=task_queue,
            options=options or c.ClusterOptions(),
            search_attributes=search_attributes,
        )
        #: Where the worker persists (the same URL): status, assignments and
        #: explanations are read from it, never asked of the workflow.
        self.store = store

    @classmethod
    async def connect(cls, settings: Settings | None = None, **kw: Any) -> ForgeClient:
        """Connect with ``settings`` (default: the ``FORGE_*`` environment).
        :class:`~forge.errors.Unavailable` naming the address if Temporal does not
        answer; an unreadable TLS or key file is :class:`~forge.errors.InvalidInput`."""
        s = settings or Settings.from_env()
        try:
            client = await s.connect()
        except (RuntimeError, OSError) as err:
            raise failures.connect_failure(err, s.address) from err
        return cls(client, cluster=s.cluster, task_queue=s.task_queue, **kw)

    # -- the cluster --------------------------------------------------------------------
    @_forge_errors
    async def start(self) -> str:
        """Start the cluster workflow if it is not running; returns its run id."""
        for with_attrs in (True, False)[0 if self.search_attributes else 1 :]:
            try:
                handle = await self.client.start_workflow(
                    c.WORKFLOW_TYPE,
                    self._input(),
                    id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
                    **self._start_kwargs(with_attrs),
                )
                return handle.result_run_id or ""
            except RPCError as err:
                if with_attrs and "search attribute" in str(err).lower():
                    continue  # not registered on this server: start without them
                raise
        raise AssertionError("unreachable")

    # -- nodes --------------------------------------------------------------------------
    @_forge_errors
    async def register_nodes(self, nodes: Sequence[Node]) -> int:
        """Signal nodes in batches (one history event per batch, not per node)."""
        batches = _batches(nodes, c.MAX_NODES_PER_SIGNAL)
        signals = [c.RegisterNodes(nodes=b) for b in batches]
        for sig in signals:
            _check_size(c.SIGNAL_REGISTER_NODE, sig)
        await self.start()
        handle = self.handle()
        for sig in signals:
            await handle.signal(c.SIGNAL_REGISTER_NODE, sig)
        return len(nodes)

    @_forge_errors
    async def remove_node(self, node_id: str) -> None:
        await self._signal(c.SIGNAL_REMOVE_NODE, c.NodeRef(node_id=node_id))

    @_forge_errors
    async def node_lost(self, node_id: str) -> None:
        await self._signal(c.SIGNAL_NODE_LOST, c.NodeRef(node_id=node_id))

    @_forge_errors
    async def drain_node(self, node_id: str) -> int:
        """Returns how many replicas were moved off the node."""
        result: int = await self._update(c.UPDATE_DRAIN_NODE, c.DrainNode(node_id=node_id), int)
        return result

    # -- jobs ---------------------------------------------------------------------------
    @_forge_errors
    async def submit_job(self, job: Job, *, wait: bool = True) -> c.JobResult:
        """Store the job and plan it; starts the cluster workflow if needed."""
        req = c.SubmitJob(job=job, wait=wait)
        _check_size(c.UPDATE_SUBMIT_JOB, req)
        if not self._running:
            # one caller starts the workflow; concurrent callers wait and then update
            if self._starting is None:
                self._starting = asyncio.Lock()
            async with self._starting:
                if not self._running:
                    return await self._submit_with_start(req)
        if self._running:
            try:
                result: c.JobResult = await self._update(c.UPDATE_SUBMIT_JOB, req, c.JobResult)
                return result
            except RPCError as err:
                if err.status != RPCStatusCode.NOT_FOUND:
                    raise
                self._running = False  # the workflow ended: start it again
        return await self._submit_with_start(req)

    async def _submit_with_start(self, req: c.SubmitJob) -> c.JobResult:
        result: c.JobResult = await self._update_with_start(c.UPDATE_SUBMIT_JOB, req, c.JobResult)
        return result

    @_forge_errors
    async def submit_jobs(
        self,
        jobs: Sequence[Job],
        *,
        wait: bool = False,
        progress: Callable[[int], None] | None = None,
    ) -> list[c.JobResult]:
        """Submit many jobs in batches of ``MAX_JOBS_PER_UPDATE`` jobs and at most
        ``MAX_BATCH_BYTES`` of JSON (few round trips, every payload far below 2 MiB).

        Every batch is sent at once; the in-flight budget (``MAX_UPDATES_IN_FLIGHT``,
        below Temporal's per-workflow limit) admits them a few at a time, so
        submission goes at the rate the workflow queues them for the store, not one
        pass per batch. Each batch is answered once queued (durable: its acceptance
        is in history). The first batch goes alone, by update-with-start, when the
        workflow has not been seen running. A batch refused as busy (the run is due
        to continue as new) is retried with backoff; any other failure cancels the
        batches not yet answered and is raised (a rerun resubmits, harmlessly).

        ``wait``: the last batch is sent once every other one is queued and returns
        after the pass that planned it, hence all of them: its jobs' results are as
        of that pass, the others' as queued (see :meth:`summary` for the totals).
        ``progress`` is called with the number of jobs queued so far after each batch.
        """
        if not jobs:
            return []
        reqs = [c.SubmitJobs(jobs=b, wait=False) for b in _batches(jobs, c.MAX_JOBS_PER_UPDATE)]
        for req in reqs:  # refuse a request too big before sending any
            _check_size(c.UPDATE_SUBMIT_JOBS, req)
        results: list[list[c.JobResult] | None] = [None] * len(reqs)
        done = 0

        async def send(i: int, *, with_start: bool = False, wait: bool = False) -> None:
            nonlocal done
            req = reqs[i].model_copy(update={"wait": True}) if wait else reqs[i]
            if with_start:
                got = await self._update_with_start(c.UPDATE_SUBMIT_JOBS, req, _RESULTS)
            else:
                got = await self._update(c.UPDATE_SUBMIT_JOBS, req, _RESULTS)
            results[i] = got
            done += len(got)
            if progress is not None:
                progress(done)

        if not self._running:
            # the first batch may start the workflow: it goes alone (one caller
            # starts it; concurrent callers wait, then update)
            if self._starting is None:
                self._starting = asyncio.Lock()
            async with self._starting:
                if not self._running:
                    await send(0, with_start=True, wait=wait and len(reqs) == 1)
        rest = [i for i in range(len(reqs)) if results[i] is None]
        final = rest.pop() if wait and rest else None
        await all_or_first_failure([send(i) for i in rest])
        if final is not None:  # every other batch is queued: this one's pass plans all
            await send(final, wait=True)
        return [r for part in results if part is not None for r in part]

    @_forge_errors
    async def scale(self, job_id: str, group: str, count: int) -> c.JobResult:
        req = c.ScaleGroup(job_id=job_id, group=group, count=count)
        result: c.JobResult = await self._update(c.UPDATE_SCALE, req, c.JobResult)
        return result

    @_forge_errors
    async def stop_job(self, job_id: str) -> c.JobResult:
        result: c.JobResult = await self._update(
            c.UPDATE_STOP_JOB, c.StopJob(job_id=job_id), c.JobResult
        )
        return result

    @_forge_errors
    async def apply_schedule(self, job: Job) -> periodic.Applied:
        """Create or update periodic job ``job``'s Temporal Schedule (its ``schedule``
        set): each firing submits an instance ``NAME-YYYYMMDDHHMMSS`` (forge.core.periodic)."""
        return await periodic.apply_schedule(self.client, self.cluster, self.task_queue, job)

    @_forge_errors
    async def remove_schedule(self, job_id: str) -> bool:
        """Delete periodic job ``job_id``'s schedule (False: it has none)."""
        return await periodic.remove_schedule(self.client, self.cluster, job_id)

    @_forge_errors
    async def promote(self, job_id: str, group: str | None = None) -> list[str]:
        """Release the canary hold of the job's rollouts (one group's, with ``group``);
        returns the groups promoted (``job/group``). Refused, naming it, when no
        rollout of the job (or group) waits for a promotion."""
        res: c.PromoteResult = await self._update(
            c.UPDATE_PROMOTE, c.Promote(job_id=job_id, group=group), c.PromoteResult
        )
        return res.promoted

    @_forge_errors
    async def revert(self, job_id: str, version: str, group: str | None = None) -> c.JobResult:
        """Submit the job with its groups' tasks as they were at ``version`` (a number
        as ``forge job history`` shows it, ``3`` or ``v3``, or a version digest), as
        a new version that rolls out like any change. Every group that has such a
        version, or only ``group``. ``InvalidInput`` if none has it."""
        store = self._need_store("revert")
        versions = await asyncio.to_thread(store.group_versions, self.cluster, job_id)
        job = await asyncio.to_thread(store.get_job, self.cluster, job_id)
        if job is None:
            raise NotFound(f"unknown job {job_id!r}")
        if group is not None and job.group(group) is None:
            raise NotFound(f"job {job_id!r} has no group {group!r}")
        number = version.removeprefix("v")
        chosen: dict[str, TaskGroup] = {}
        for v in versions:
            if group is not None and v.group != group:
                continue
            if v.version == version or (number.isdigit() and v.number == int(number)):
                chosen[v.group] = v.spec
        chosen = {g: spec for g, spec in chosen.items() if job.group(g) is not None}
        if not chosen:
            where = f"{job_id}/{group}" if group is not None else f"job {job_id!r}"
            raise NotFound(f"{where} has no version {version!r} (see forge job history)")
        for g, spec in sorted(chosen.items()):
            job = with_tasks_of(job, g, spec)
        return await self.submit_job(job)

    @_forge_errors
    async def report_failed(
        self, workload_ids: Sequence[str], *, on: Mapping[str, str] | None = None
    ) -> int:
        """Report replicas failed; ``on`` (workload id -> node) keys each report by
        its binding, so a repeat after the replica moved restarts nothing."""
        total = 0
        for i in range(0, len(workload_ids), c.MAX_WORKLOADS_PER_UPDATE):
            part = list(workload_ids[i : i + c.MAX_WORKLOADS_PER_UPDATE])
            where = {w: on[w] for w in part if on and w in on}
            res: c.ReportFailedResult = await self._update(
                c.UPDATE_REPORT_FAILED,
                c.ReportFailed(workload_ids=part, on=where),
                c.ReportFailedResult,
            )
            total += res.accepted
        return total

    # -- reads: what the loop published, never a query (see forge.client.reads) ---------
    @_forge_errors
    async def summary(self) -> c.Summary:
        """The loop's summary, from the workflow's memo (describe(); no store needed)."""
        desc = await self.handle().describe()
        raw = await desc.memo_value(c.MEMO_SUMMARY, None)
        return c.Summary.model_validate(raw) if raw is not None else c.Summary.empty()

    @_forge_errors
    async def published(self) -> c.LoopStatus | None:
        """The status the last pass published with its delta (None before the first)."""
        store = self._need_store("the published status")
        return await asyncio.to_thread(reads.published, store, self.cluster)

    @_forge_errors
    async def status(self) -> c.StatusView:
        """Nodes, bindings and pending replicas as the last pass published them, and
        whether the run is stuck (describe(): a workflow task failing again and again)."""
        stuck = await watchdog.diagnose(self.client, self.workflow_id)  # raises if not running
        notices = [stuck.line] if stuck is not None else []
        if self.store is None:
            view = c.StatusView(summary=await self.summary(), nodes=[], pending=[])
        else:
            view = await asyncio.to_thread(reads.status, self.store, self.cluster)
        return view.model_copy(update={"notices": [*notices, *view.notices]})

    @_forge_errors
    async def node_usage(self) -> dict[str, NodeUsage]:
        """Per node, what its replicas use and their ports, as the agents last
        reported them (from the store; empty without agents)."""
        store = self._need_store("node usage")
        return await asyncio.to_thread(reads.node_usage, store, self.cluster)

    @_forge_errors
    async def assignments(
        self, *, node: str | None = None, page: int = 5000
    ) -> list[c.AssignmentView]:
        """Every binding, as persisted (page by page from the store)."""
        store = self._need_store("assignments")
        found = await asyncio.to_thread(reads.all_assignments, store, self.cluster, page)
        return reads.assignment_views([a for a in found if node is None or a.node == node])

    @_forge_errors
    async def explain(self, workload_id: str) -> c.Explanation:
        """Why a replica is bound where it is, or why it waits, and every node's verdict."""
        store = self._need_store("explain")
        return await asyncio.to_thread(reads.explanation, store, self.cluster, workload_id)

    @_forge_errors
    async def job_state(self, job_id: str) -> c.JobState:
        """Where a job stands: the store's record when given a store, else the
        ``job_state`` query (best-effort while a worker takes the run over)."""
        if self.store is None:
            got: c.JobState = await self.handle().query(
                c.QUERY_JOB_STATE, job_id, result_type=c.JobState, rpc_timeout=finish.QUERY_TIMEOUT
            )
            return got
        found = await asyncio.to_thread(reads.job_state, self.store, self.cluster, job_id)
        if found is None:
            raise NotFound(f"no job {job_id!r} in cluster {self.cluster}")
        return found

    async def wait_finished(
        self, job_ids: Sequence[str], *, timeout: float | None = None
    ) -> dict[str, c.JobState]:
        """Each batch job's state once all are complete or failed, or ``timeout``
        seconds passed (:mod:`forge.client.finish`; a query, each a workflow task, slower)."""
        poll = finish.POLL if self.store is not None else 4 * finish.POLL
        return await finish.wait_finished(self.job_state, job_ids, timeout=timeout, poll=poll)

    def _need_store(self, what: str) -> Store:
        if self.store is None:
            raise InvalidInput(
                f"{what} reads the store the worker persists to: pass store= (FORGE_STORE)"
            )
        return self.store
