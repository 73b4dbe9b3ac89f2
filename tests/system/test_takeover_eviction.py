"""Which activations make a worker evict a run after a query (forge.takeover): the
stale case must, and a stream of queries to a run rebuilt only to answer them must
not (each eviction costs the run a replay). The end-to-end proof is
``tests/faults/test_upstream_query_takeover.py``: real workers, kill -9, a query."""

from __future__ import annotations

import pytest
from temporalio.bridge.proto.workflow_activation import WorkflowActivation

from forge import takeover
from forge.takeover import LEGACY_QUERY, wants_eviction

RUN = "run-1"


def _act(*jobs: str, replaying: bool, query_id: str = LEGACY_QUERY) -> WorkflowActivation:
    act = WorkflowActivation(run_id=RUN, is_replaying=replaying)
    for kind in jobs:
        job = act.jobs.add()
        if kind == "query":
            job.query_workflow.query_id = query_id
            job.query_workflow.query_type = "status"
        elif kind == "init":
            job.initialize_workflow.workflow_type = "W"
        elif kind == "timer":
            job.fire_timer.seq = 1
        elif kind == "evict":
            job.remove_from_cache.message = "evicted"
        else:  # pragma: no cover - a typo in a test
            raise AssertionError(kind)
    return act


def _run(*acts: WorkflowActivation) -> list[bool]:
    live: dict[str, bool] = {}
    return [wants_eviction(live, act) for act in acts]


def test_a_query_answered_after_a_live_activation_of_a_rebuilt_run_evicts_it() -> None:
    # the query-takeover shape: built from history, the trailing firing run live, the query
    assert _run(
        _act("init", replaying=True),
        _act("timer", replaying=False),
        _act("query", replaying=True),
    ) == [False, False, True]


def test_queries_to_a_run_rebuilt_only_to_answer_them_do_not_evict_it_again() -> None:
    got = _run(
        _act("init", replaying=True),
        _act("timer", replaying=True),
        _act("query", replaying=True),
        _act("query", replaying=True),
    )
    assert got == [False, False, False, False]


def test_once_evicted_the_next_live_work_arms_it_again() -> None:
    got = _run(
        _act("init", replaying=False),  # a new run, live from its first task
        _act("query", replaying=True),  # evicted: it ran live
        _act("evict", replaying=False),
        _act("init", replaying=True),  # the next task rebuilds it
        _act("timer", replaying=False),
        _act("query", replaying=True),
        _act("query", replaying=True),  # nothing live since the last eviction
    )
    assert got == [False, True, False, False, False, True, False]


def test_a_query_that_came_with_a_workflow_task_does_not_evict() -> None:
    # a buffered query rides a real task, after its activation: nothing stale
    got = _run(
        _act("init", replaying=True),
        _act("timer", replaying=False),
        _act("query", replaying=True, query_id="q-7"),
    )
    assert got == [False, False, False]


def test_install_wraps_the_sdk_s_handler_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from temporalio.worker import _workflow

    # put back whatever was there when the test ends: other tests' in-process
    # workers keep the plain SDK
    original = _workflow._WorkflowWorker._handle_activation
    monkeypatch.setattr(_workflow._WorkflowWorker, "_handle_activation", original)
    assert takeover.install()
    assert _workflow._WorkflowWorker._handle_activation is not original
    first = _workflow._WorkflowWorker._handle_activation
    assert takeover.install()
    assert _workflow._WorkflowWorker._handle_activation is first
