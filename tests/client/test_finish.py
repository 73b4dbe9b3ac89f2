"""Waiting for batch jobs (``forge job run --wait-finished``, ``ForgeClient.wait_finished``):
the wait ends when every job ended and not before, a finished job is not read again,
the timeout returns what still runs, and the exit code puts a failure before a
timeout. The reads and the clock are the test's: no server, no sleeping on time."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from forge.client.finish import TIMED_OUT, exit_code, wait_finished
from forge.errors import Busy, ForgeError, InvalidInput, NotFound
from forge.wire.contract import JobState


def _state(job_id: str, state: str) -> JobState:
    return JobState.model_validate(
        {"job_id": job_id, "type": "batch", "state": state, "desired": 1, "complete": 0,
         "bound": 0, "what": state}
    )  # fmt: skip


class _Jobs:
    """Each job's states in order, one per read; the last one repeats."""

    def __init__(self, plans: dict[str, list[str]]) -> None:
        self.plans = plans
        self.reads: Counter[str] = Counter()

    async def read(self, job_id: str) -> JobState:
        plan = self.plans[job_id]
        state = plan[min(self.reads[job_id], len(plan) - 1)]
        self.reads[job_id] += 1
        return _state(job_id, state)


async def test_returns_once_every_job_ended_and_reads_an_ended_job_no_more() -> None:
    jobs = _Jobs({"a": ["running", "complete"], "b": ["running", "running", "running", "failed"]})
    got = await wait_finished(jobs.read, ["a", "b"], poll=0.0)
    assert {k: v.state for k, v in got.items()} == {"a": "complete", "b": "failed"}
    assert jobs.reads == Counter({"a": 2, "b": 4})  # a not read after it completed
    assert exit_code(list(got.values())) == 1


async def test_the_timeout_returns_what_still_runs() -> None:
    now = [0.0]

    def clock() -> float:
        now[0] += 1.0  # each look at the clock is a second later
        return now[0]

    jobs = _Jobs({"a": ["complete"], "slow": ["running"]})
    got = await wait_finished(jobs.read, ["a", "slow"], timeout=5.0, poll=0.0, clock=clock)
    assert got["slow"].state == "running" and got["a"].state == "complete"
    assert jobs.reads["slow"] == 5  # read until the deadline, then given up on
    assert exit_code(list(got.values())) == TIMED_OUT


async def test_a_service_job_returns_at_once_for_the_caller_to_refuse() -> None:
    jobs = _Jobs({"web": ["service"]})
    got = await wait_finished(jobs.read, ["web"], poll=0.0)
    assert got["web"].state == "service" and jobs.reads["web"] == 1


@given(st.lists(st.sampled_from(["complete", "failed", "running"]), min_size=1, max_size=6))
def test_exit_code_a_failure_outranks_a_timeout(states: list[str]) -> None:
    code = exit_code([_state(str(i), s) for i, s in enumerate(states)])
    if "failed" in states:
        assert code == 1
    elif "running" in states:
        assert code == TIMED_OUT
    else:
        assert code == 0


@pytest.mark.parametrize(
    ("desired", "complete", "failed", "want"),
    [
        (3, 3, None, "complete"),
        (3, 2, None, "running"),
        (3, 3, "x/main/0: exhausted", "failed"),  # failed first: stays failed
        (0, 0, None, "complete"),
    ],
)
def test_phase_is_one_rule(desired: int, complete: int, failed: str | None, want: str) -> None:
    from forge.core.kinds import phase

    state, what = phase(desired, complete, failed)
    assert state == want
    assert what.startswith(f"{complete}/{desired} runs complete")
    assert (failed or "") in what


async def test_an_unavailable_read_is_asked_again_and_another_error_ends_the_wait() -> None:
    calls: Counter[str] = Counter()

    async def loading_then_done(job_id: str) -> JobState:
        calls[job_id] += 1
        if calls[job_id] < 3:
            raise Busy("the run is loading its state from the store; ask again")
        return _state(job_id, "complete")

    got = await wait_finished(loading_then_done, ["a"], poll=0.0)
    assert got["a"].state == "complete" and calls["a"] == 3

    async def gone(job_id: str) -> JobState:
        raise NotFound(f"unknown job {job_id!r}")

    with pytest.raises(NotFound):
        await wait_finished(gone, ["a"], poll=0.0)

    async def never(job_id: str) -> JobState:
        raise Busy("still loading")

    ticks = iter(range(100))
    with pytest.raises(Busy, match="still loading"):  # no state to return at the deadline
        await wait_finished(never, ["a"], timeout=3.0, poll=0.0, clock=lambda: next(ticks))


@pytest.mark.parametrize("kind", [Busy, NotFound, InvalidInput])
def test_a_query_s_failure_carries_its_kind_in_its_message(kind: type[ForgeError]) -> None:
    """A failed query reaches the client as a message alone: the kind leads it, and the
    client's error boundary gives the caller that kind back."""
    from temporalio.client import WorkflowQueryFailedError

    from forge.client.failures import Where, translate
    from forge.wire.errors import decode_query, encode_query

    sent = encode_query(kind("unknown job 'x'"))
    back = decode_query(sent.message)
    assert type(back) is kind and str(back) == "unknown job 'x'"
    where = Where("localhost:7233", "default", "c", "q", "forge-cluster-c")
    translated = translate(WorkflowQueryFailedError(sent.message), where)
    assert type(translated) is kind
    plain = translate(WorkflowQueryFailedError("boom: a message of no kind"), where)
    assert type(plain) is ForgeError and "query refused by forge-cluster-c" in str(plain)
