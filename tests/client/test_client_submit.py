"""``ForgeClient.submit_jobs`` and ``forge job run``: every batch in flight at once
(within the in-flight budget), each answered once queued, one final wait, busy
refusals retried and nothing lost; against a fake cluster workflow that behaves
like Temporal's admission (at most ``limit`` updates in flight) and Forge's queue
(tickets, a pass that plans what is queued)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from temporalio.client import WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment

from forge import cli
from forge.cli import job as job_cli
from forge.client.client import ForgeClient
from forge.client.limits import MAX_UPDATES_IN_FLIGHT
from forge.core.models import Job
from forge.errors import InvalidInput
from forge.wire import contract as c
from forge.wire import errors
from forge.wire.codec import data_converter
from tests.workflow.harness import cluster, default_options, node
from tests.workflow.harness import job as harness_job


class _Call:
    def __init__(self, ids: list[str], wait: bool, with_start: bool, started: int) -> None:
        self.ids = ids
        self.wait = wait
        self.with_start = with_start
        self.started = started  # how many calls had been answered when this one began
        self.answered = False


class _Workflow:
    """A fake cluster workflow (and the client and handle that reach it)."""

    def __init__(
        self,
        *,
        limit: int = 10,
        busy: int = 0,
        refuse: str | None = None,
        round_trip: float = 0.02,
        pass_every: float = 0.05,
    ) -> None:
        self.limit = limit  # Temporal: updates in flight per workflow
        self.busy = busy  # refuse this many updates as "busy" (continue-as-new due)
        self.refuse = refuse  # a job id whose batch the validator refuses
        self.round_trip = round_trip
        self.pass_every = pass_every
        self.in_flight = 0
        self.max_in_flight = 0
        self.exhausted = 0  # RESOURCE_EXHAUSTED answers
        self.refused_busy = 0
        self.queue: list[str] = []  # job ids, in ticket order
        self.planned = 0  # tickets planned by the passes so far
        self.calls: list[_Call] = []
        self.answered = 0
        self._passes: asyncio.Task[None] | None = None
        self.passed = asyncio.Condition()

    # -- the Client and WorkflowHandle surface ForgeClient uses -------------------
    def get_workflow_handle(self, workflow_id: str, **kw: Any) -> _Workflow:
        return self

    async def execute_update(self, name: str, arg: Any, *, result_type: Any) -> Any:
        return await self._update(name, arg, with_start=False)

    async def execute_update_with_start_workflow(self, name: str, arg: Any, **kw: Any) -> Any:
        return await self._update(name, arg, with_start=True)

    async def describe(self) -> _Workflow:
        return self

    async def memo_value(self, key: str, default: Any) -> Any:
        assert key == c.MEMO_SUMMARY
        n = self.planned
        return c.Summary(
            desired=n, bound=n, pending=0, nodes=1, jobs=n, passes=1, generation=1,
            last_pass_at=None, last_pass="",
        ).model_dump(mode="json")  # fmt: skip

    # -- the workflow ---------------------------------------------------------------
    async def _update(self, name: str, arg: Any, *, with_start: bool) -> list[c.JobResult]:
        assert name == c.UPDATE_SUBMIT_JOBS
        req = c.SubmitJobs.model_validate(arg.model_dump())
        if self._passes is None:
            self._passes = asyncio.create_task(self._loop())
        if self.in_flight >= self.limit:
            self.exhausted += 1
            raise RPCError(
                "limit on number of concurrent in-flight updates has been reached (10)",
                RPCStatusCode.RESOURCE_EXHAUSTED,
                b"",
            )
        if self.busy > 0:
            self.busy -= 1
            self.refused_busy += 1
            busy = ApplicationError("continuing as new; retry shortly", type=errors.BUSY)
            raise WorkflowUpdateFailedError(busy)
        ids = [j.id for j in req.jobs]
        if self.refuse in ids:
            raise WorkflowUpdateFailedError(ApplicationError("bad job", type="InvalidInput"))
        call = _Call(ids, req.wait, with_start, self.answered)
        self.calls.append(call)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.round_trip)
            self.queue.extend(ids)  # queued: durable, answered now unless waiting
            ticket = len(self.queue)
            if req.wait:
                async with self.passed:
                    await self.passed.wait_for(lambda: self.planned >= ticket)
            bound = 1 if req.wait else 0
            return [
                c.JobResult(job_id=i, revision=ticket, desired=1, bound=bound, pending=1 - bound)
                for i in ids
            ]
        finally:
            self.in_flight -= 1
            self.answered += 1
            call.answered = True

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.pass_every)
            async with self.passed:
                self.planned = len(self.queue)
                self.passed.notify_all()

    def close(self) -> None:
        if self._passes is not None:
            self._passes.cancel()


@pytest.fixture(autouse=True)
def _batches_of_200(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests count batches and in-flight updates: they send batches of 200
    (the client reads the constant per call), so a few thousand jobs make many."""
    monkeypatch.setattr(c, "MAX_JOBS_PER_UPDATE", 200)


def _jobs(n: int) -> list[Job]:
    one = harness_job("j0")
    return [one.model_copy(update={"id": f"j{i}"}) for i in range(n)]


async def _submit(
    wf: _Workflow, jobs: list[Job], **kw: Any
) -> tuple[list[c.JobResult], list[int], ForgeClient]:
    fc = ForgeClient(wf, search_attributes=False)  # type: ignore[arg-type]
    seen: list[int] = []
    try:
        results = await fc.submit_jobs(jobs, progress=seen.append, **kw)
    finally:
        wf.close()
    return results, seen, fc


def _stored_once(wf: _Workflow, jobs: list[Job]) -> None:
    counts = Counter(wf.queue)
    assert set(counts) == {j.id for j in jobs}, "a batch was lost"
    assert max(counts.values()) == 1, "a batch was queued twice"


async def test_batches_are_in_flight_together_within_the_budget() -> None:
    wf = _Workflow()
    jobs = _jobs(4000)  # 20 batches of MAX_JOBS_PER_UPDATE
    results, seen, _ = await _submit(wf, jobs)
    assert [r.job_id for r in results] == [j.id for j in jobs]
    _stored_once(wf, jobs)
    assert len(wf.calls) == 4000 // c.MAX_JOBS_PER_UPDATE
    # the first batch starts the workflow, alone; the others go together
    first, *rest = wf.calls
    assert first.with_start and not any(call.with_start for call in rest)
    assert all(call.started >= 1 for call in rest)
    # sequential batches would never have more than one in flight
    assert wf.max_in_flight == MAX_UPDATES_IN_FLIGHT
    assert wf.exhausted == 0  # the client kept below the server's limit
    assert not any(call.wait for call in wf.calls)  # answered once queued
    assert seen == sorted(seen) and seen[-1] == 4000  # progress as batches are answered


async def test_waiting_is_one_final_update_after_every_other_batch_is_queued() -> None:
    wf = _Workflow()
    jobs = _jobs(2000)
    results, _, _ = await _submit(wf, jobs, wait=True)
    _stored_once(wf, jobs)
    waited = [call for call in wf.calls if call.wait]
    assert len(waited) == 1 and waited[0] is wf.calls[-1]
    # sent once all the others were answered: its pass plans them all
    assert waited[0].started == len(wf.calls) - 1
    assert wf.planned == len(jobs)
    assert wf.max_in_flight > 1
    assert all(r.bound == 1 for r in results if r.job_id in waited[0].ids)


async def test_a_single_batch_that_waits_is_one_update_with_start() -> None:
    wf = _Workflow()
    jobs = _jobs(5)
    results, _, _ = await _submit(wf, jobs, wait=True)
    assert len(wf.calls) == 1 and wf.calls[0].with_start and wf.calls[0].wait
    assert [r.bound for r in results] == [1] * 5


async def test_busy_refusals_and_a_full_server_are_retried_and_nothing_is_lost() -> None:
    # a server admitting 3 in flight (other clients share it) and a run due to
    # continue as new refusing 25 updates as busy, spread over concurrent batches
    wf = _Workflow(limit=3, busy=25)
    jobs = _jobs(3000)
    results, _, _ = await _submit(wf, jobs, wait=True)
    assert wf.refused_busy == 25 and wf.exhausted > 0
    _stored_once(wf, jobs)
    assert [r.job_id for r in results] == [j.id for j in jobs]
    assert wf.planned == len(jobs)


async def test_a_refused_batch_fails_the_submission_with_its_kind() -> None:
    wf = _Workflow(refuse="j1500")
    with pytest.raises(InvalidInput, match="bad job"):  # not an ExceptionGroup
        await _submit(wf, _jobs(3000))
    assert "j1500" not in wf.queue


def _fake_remote(wf: _Workflow) -> Callable[..., int]:
    def remote(
        s: Any,
        timeout: float,
        action: Callable[[ForgeClient], Awaitable[int]],
        *,
        reads_store: bool = False,
    ) -> int:
        assert not reads_store  # no --wait-finished here: nothing reads the store

        async def go() -> int:
            try:
                return await action(ForgeClient(wf, search_attributes=False))  # type: ignore[arg-type]
            finally:
                wf.close()

        return asyncio.run(go())

    return remote


def _job_file(tmp_path: Any, n: int) -> str:
    path = tmp_path / "jobs.yaml"
    path.write_text(
        "".join(
            f"- name: j{i}\n  groups:\n    - name: main\n"
            "      tasks: [{name: t, resources: {cpu: 10, memory: 16}}]\n"
            for i in range(n)
        )
    )
    return str(path)


def test_job_run_submits_concurrently_and_prints_one_summary_line(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    wf = _Workflow()
    monkeypatch.setattr(job_cli, "remote", _fake_remote(wf))
    assert cli.main(["job", "run", _job_file(tmp_path, 1200)]) == 0
    out, err = capsys.readouterr()
    assert len(wf.queue) == 1200 and wf.max_in_flight > 1
    assert [call.wait for call in wf.calls].count(True) == 1  # waits by default
    (line,) = out.splitlines()
    assert line.startswith("submitted 1,200 jobs, stored, in ")
    assert "planned: cluster default 1,200 desired" in line
    assert err == ""  # not a terminal: no progress bar


def test_job_run_no_wait_lists_a_few_jobs_and_the_summary(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    wf = _Workflow()
    monkeypatch.setattr(job_cli, "remote", _fake_remote(wf))
    assert cli.main(["job", "run", "--no-wait", _job_file(tmp_path, 3)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("j0: submitted (revision")
    assert lines[-1].startswith("submitted 3 jobs, stored, in ")
    assert not any(call.wait for call in wf.calls)


def test_job_run_says_how_many_went_in_when_a_batch_is_refused(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    wf = _Workflow(refuse="j900")
    monkeypatch.setattr(job_cli, "remote", _fake_remote(wf))
    assert cli.main(["job", "run", _job_file(tmp_path, 1000)]) == 2  # refused: bad input
    err = capsys.readouterr().err
    assert "bad job" in err
    assert "of 1,000 jobs were submitted" in err


class _Terminal:
    def __init__(self) -> None:
        self.text = ""

    def isatty(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self.text += text
        return len(text)

    def flush(self) -> None:
        pass


def test_job_run_draws_a_progress_bar_on_a_terminal_only(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    wf = _Workflow()
    monkeypatch.setattr(job_cli, "remote", _fake_remote(wf))
    terminal = _Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    assert cli.main(["job", "run", "--no-wait", _job_file(tmp_path, 1000)]) == 0
    frames = terminal.text.split("\r")[1:]
    assert len(frames) == 1000 // c.MAX_JOBS_PER_UPDATE  # one per batch answered
    assert frames[0].startswith("submitting jobs [")
    assert frames[-1] == f"submitting jobs [{'#' * 30}] 1,000/1,000\n"  # the line ended
    assert capsys.readouterr().out.startswith("submitted 1,000 jobs, stored, in ")


# ------------------------------------------------------------ a real cluster workflow


async def test_a_real_cluster_stores_every_batch_through_continues_as_new(
    temporal_cli: str,
) -> None:
    """2,000 jobs (10 batches, all in flight together) into a workflow that continues
    as new after every 3 updates, so batches meet "busy" refusals and land in several
    runs: with wait, every job is stored and planned when submit_jobs returns."""
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_cli,
        data_converter=data_converter(),
        dev_server_log_level="error",
    )
    try:
        async with cluster(env.client, options=default_options(max_updates_per_run=3)) as (
            fc,
            store,
        ):
            await fc.register_nodes([node("n1", cpu=64000, memory=1 << 20)])
            jobs = _jobs(2000)
            results = await fc.submit_jobs(jobs, wait=True)
            assert [r.job_id for r in results] == [j.id for j in jobs]
            assert {j.id for j in store.list_jobs(fc.cluster)} == {j.id for j in jobs}
            summary = await fc.summary()  # published by the pass the last batch waited for
            assert summary.jobs == len(jobs) and summary.desired == len(jobs)
            assert summary.generation > 1  # the batches met continues as new
    finally:
        await env.shutdown()
