"""Fixtures of the agent tests: the fault suite's dev server and worker processes,
and the guard that no task process outlives the tests that started it.

Agents start their tasks in sessions of their own and, by design, leave them
running when they exit (a restarted agent adopts them), so nothing reaps them for
us: a failed test once left a dozen busy loops spinning. Every process a test
starts inherits ``FORGE_TEST_SESSION`` (set here, at import) and ``FORGE_TEST_CASE``
(set per test); a task process is one with ``FORGE_WORKLOAD_ID`` in its
environment. After each test the task processes it started are killed (whole
process groups), and the test fails if it left any behind; at the end of the
session any task process of this run still alive is killed and fails the run.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from tests.agent.helpers import kill_tasks, task_processes
from tests.faults.conftest import dev_env, pytest_runtest_makereport, spawn_worker

__all__ = ["dev_env", "pytest_runtest_makereport", "spawn_worker"]

SESSION_MARK = "FORGE_TEST_SESSION"
CASE_MARK = "FORGE_TEST_CASE"
os.environ.setdefault(SESSION_MARK, uuid.uuid4().hex)


@pytest.fixture(autouse=True)
def _reap_the_tests_tasks(
    monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> Iterator[None]:
    mark = uuid.uuid4().hex
    monkeypatch.setenv(CASE_MARK, mark)
    yield
    left = task_processes({CASE_MARK: mark})
    kill_tasks(left)
    rep = getattr(request.node, "rep_call", None)
    if left and rep is not None and rep.passed:
        pytest.fail(f"the test left {len(left)} task processes running: {sorted(left)}")


@pytest.fixture(scope="session", autouse=True)
def _no_task_survives_the_session() -> Iterator[None]:
    yield
    left = task_processes({SESSION_MARK: os.environ[SESSION_MARK]})
    kill_tasks(left)
    assert not left, f"task processes survived the agent tests (killed now): {sorted(left)}"
