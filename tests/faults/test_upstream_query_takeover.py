"""Documents an upstream defect (Temporal Core, temporalio 1.35): a query that
reaches a worker which never saw the run makes the run's history fail its own
replay. No Forge code is involved: the workflow is :mod:`tests.faults.upstream.loop`.

The sequence (RELIABILITY.md, "Intakes"; sdk-rust #1146, sdk-python #1591):
worker A holds the run in its cache and is killed with SIGKILL while the loop waits
on a timer; a client queries the run while no workflow task is pending, so the
server sends the query to a worker directly (A's dead sticky queue first, then the
normal queue); the timer fires meanwhile. Worker B, which never saw the run, gets
the query as a legacy query task whose history already holds the firing: Core runs
that firing through the workflow code as a *live* activation, with the previous
task's clock, and holds the commands it made. The updates then arrive in a second
activation. A replay runs both together, updates first, so the loop plans
differently and the replay fails with a nondeterminism error.

The race needs the timer to fire while the dead worker's sticky queue still holds
the run, which a loaded machine does not always give: each attempt checks from the
history that it was staged (the firing's task timed out on A's sticky queue) and
the test tries again, up to :data:`ATTEMPTS` times, until one staged takeover
fails its replay. This test asserts that the defect still reproduces. When it fails, an SDK upgrade
fixed it: say so in RELIABILITY.md. Forge's workaround does not depend on it
either way: the cluster loop plans only from recorded intakes, never cancels a wait
timer and emits nothing in such a stale activation
(``tests/faults/test_query_takeover.py`` drives the same sequence through Forge's
loop and its history replays).
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle, WorkflowHistory
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer, UnsandboxedWorkflowRunner

from tests.e2e.procs import ROOT, eventually, start_process, stop_process
from tests.faults.upstream.loop import Loop

pytestmark = [pytest.mark.slow, pytest.mark.upstream]

#: The loop's wait: the timer fires about a second after the kill, while the query
#: waits for A's dead sticky queue to give it up (2 s); the query is sent just after
#: the kill (the timings of ``../shared/research/temporal-query-takeover/scenario6.py``).
WAIT_S = 1.5
QUERY_AFTER_KILL_S = 0.1
#: Takeovers tried before the test decides; one that reproduces ends it.
ATTEMPTS = 5


async def _count(handle: WorkflowHandle[Loop, None], kind: EventType.ValueType) -> int:
    return sum([ev.event_type == kind async for ev in handle.fetch_history_events()])


def _kill9(proc: subprocess.Popen[bytes]) -> None:
    """The crash: SIGKILL, no shutdown (the worker starts no process of its own)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)


def _read(log: Path) -> str:
    return log.read_text(errors="replace") if log.exists() else ""


async def _polling(log: Path) -> bool:
    return "polling" in await asyncio.to_thread(_read, log)


def _staged(history: WorkflowHistory) -> bool:
    """Whether the first timer's firing went to A's dead sticky queue and timed out
    there before another task completed: the shape in which B answers the query from
    a history holding the firing. When A still handled the firing, or the firing came
    after B had taken over, the takeover is ordinary and replays clean."""
    events = [ev.event_type for ev in history.events]
    if EventType.EVENT_TYPE_TIMER_FIRED not in events:
        return False
    after = events[events.index(EventType.EVENT_TYPE_TIMER_FIRED) :]
    timed_out = EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT
    completed = EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
    return timed_out in after and (
        completed not in after or after.index(timed_out) < after.index(completed)
    )


async def _takeover_with_a_query(
    address: str, tmp: Path, *, evict: bool = False
) -> tuple[bool, str | None]:
    """One takeover as the module describes; returns whether the race was staged and
    the replay's failure, if any. ``evict``: the workers run :mod:`forge.takeover`."""
    client = await Client.connect(address)  # the SDK's plain converter: no Forge code
    queue = f"upstream-{uuid.uuid4().hex[:8]}"
    argv = [sys.executable, "-m", "tests.faults.upstream.worker", address, queue]
    argv += ["evict"] if evict else []
    a = start_process(argv, tmp / "a.log", cwd=ROOT)
    b = None
    try:
        await eventually(lambda: _polling(tmp / "a.log"), bool, timeout=30, what="worker A")
        handle = await client.start_workflow(
            Loop.run, WAIT_S, id=f"upstream-{uuid.uuid4().hex[:8]}", task_queue=queue
        )
        await eventually(
            lambda: _count(handle, EventType.EVENT_TYPE_TIMER_STARTED),
            bool,
            timeout=30,
            what="A's first task (the loop waits on its timer)",
        )
        b = start_process(argv, tmp / "b.log", cwd=ROOT)  # polls the normal queue
        _kill9(a)  # SIGKILL: A dies holding the run in its cache
        # Not synchronisation: the query must leave before the timer fires (no task is
        # pending then, so the server sends it to A's dead sticky queue first).
        await asyncio.sleep(QUERY_AFTER_KILL_S)
        answered = await asyncio.wait_for(handle.query(Loop.status), 60)
        assert answered == 1, f"the query saw {answered} passes, not the first timer's one"
        updates = [handle.execute_update(Loop.poke, 1) for _ in range(2)]
        # the defect runs the firing as a pass of its own before the updates' pass (2);
        # a replay, and a worker that evicted the run, take both in one pass (1)
        expected = [1, 1] if evict else [2, 2]
        assert await asyncio.wait_for(asyncio.gather(*updates), 60) == expected
        # the defect surfaces when the timer after the updates' pass fires
        await eventually(
            lambda: _count(handle, EventType.EVENT_TYPE_TIMER_FIRED),
            lambda n: n >= 2,
            timeout=30,
            what="the timer after the updates' pass firing on B",
        )
        history = await handle.fetch_history()
        await handle.terminate("test finished")
    finally:
        _kill9(a)
        if b is not None:
            stop_process(b)
    replayer = Replayer(workflows=[Loop], workflow_runner=UnsandboxedWorkflowRunner())
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    failure = None if result.replay_failure is None else str(result.replay_failure)
    return _staged(history), failure


async def test_a_query_during_a_takeover_makes_a_history_that_fails_its_own_replay(
    dev_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    address = dev_env.client.service_client.config.target_host
    staged = 0
    for attempt in range(ATTEMPTS):
        logs = tmp_path / f"attempt-{attempt}"
        logs.mkdir()
        was_staged, failure = await _takeover_with_a_query(address, logs)
        if failure is not None:
            assert "nondetermin" in failure.lower(), failure
            return
        staged += was_staged
    assert staged, f"none of {ATTEMPTS} takeovers staged the race (the timings need a look)"
    pytest.fail(
        f"the upstream query-takeover defect no longer reproduces ({staged} of {ATTEMPTS} "
        "takeovers staged it and replayed clean): an SDK upgrade fixed it; update "
        "RELIABILITY.md ('Intakes') and this test"
    )


async def test_with_forge_s_eviction_after_a_query_the_same_takeover_replays(
    dev_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """The workaround (:mod:`forge.takeover`) on the same 40-line loop: B evicts the
    run after answering the query, so the next task replays the firing and the
    updates together and the history replays. Without it the test above fails at its
    first staged takeover; here every staged one must replay."""
    address = dev_env.client.service_client.config.target_host
    staged = 0
    for attempt in range(ATTEMPTS):
        logs = tmp_path / f"attempt-{attempt}"
        logs.mkdir()
        was_staged, failure = await _takeover_with_a_query(address, logs, evict=True)
        assert failure is None, f"attempt {attempt} (staged: {was_staged}): {failure}"
        staged += was_staged
        if staged >= 2:
            return
    assert staged, f"none of {ATTEMPTS} takeovers staged the race (the timings need a look)"
