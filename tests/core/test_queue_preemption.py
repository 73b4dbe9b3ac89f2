"""A queue's ``preemption`` rules (issue 34, Kueue's ``withinClusterQueue`` and
``reclaimWithinCohort``): ``within_queue: lower_priority`` lets a replica its queue's
quota refused evict the queue's own replicas of lower priority (never its equals:
nothing churns); ``reclaim_within_cohort`` says whether a reclaim or a fair-share claim
may evict other queues' replicas at ``any`` priority (the default), only
``lower_priority`` ones, or ``never``. A queue with the defaults dumps as before."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from forge.core.models import Job
from forge.core.quota import QueueSpec
from tests.core.test_fair_share import _held, _prio
from tests.core.test_quota import _job
from tests.core.test_reclaim import _passes, _victims


def _queue(name: str, cpu: int, cohort: str | None = "research", **rules: str) -> QueueSpec:
    spec: dict[str, Any] = {"name": name, "cohort": cohort, "quota": {"cpu": {"nominal": cpu}}}
    if rules:
        spec["preemption"] = rules
    return QueueSpec.model_validate(spec)


def _lo_hi(queue: str) -> tuple[Job, Job]:
    return _prio(_job("lo", 4, queue), 10), _prio(_job("hi", 4, queue), 90)


def test_within_its_queue_a_higher_priority_replica_evicts_a_lower_one() -> None:
    lo, hi = _lo_hi("q")
    queues = [_queue("q", 4000, None, within_queue="lower_priority")]
    one, two = _passes([lo], [hi], queues)
    assert one == {"lo": 4}
    assert (_held(two, "hi"), _held(two, "lo")) == (4, 0)
    assert _victims(two) == [f"lo/w/{i}" for i in range(4)]
    assert two.pending["lo/w/0"].reasons[0].startswith("preempted by hi/w/")


def test_within_its_queue_by_default_nothing_is_evicted() -> None:
    lo, hi = _lo_hi("q")
    _, two = _passes([lo], [hi], [_queue("q", 4000, None)])
    assert (_held(two, "hi"), _held(two, "lo")) == (0, 4) and not two.preemptions
    assert two.pending["hi/w/0"].kind == "queued"


def test_within_its_queue_equals_never_evict_each_other() -> None:
    queues = [_queue("q", 4000, None, within_queue="lower_priority")]
    _, two = _passes([_job("a", 4, "q")], [_job("b", 4, "q")], queues)
    assert (_held(two, "a"), _held(two, "b")) == (4, 0) and not two.preemptions


@pytest.mark.parametrize(
    ("rule", "held"),
    [("any", (4, 4)), ("lower_priority", (4, 4)), ("never", (0, 8))],
)
def test_reclaim_within_cohort_says_at_what_priority(rule: str, held: tuple[int, int]) -> None:
    """b borrowed a's 4 at priority 10; a (priority 90) takes them back unless never."""
    queues = [_queue("a", 4000, reclaim_within_cohort=rule), _queue("b", 4000)]
    _, two = _passes([_prio(_job("bb", 8, "b"), 10)], [_prio(_job("aa", 4, "a"), 90)], queues)
    assert (_held(two, "aa"), _held(two, "bb")) == held


def test_reclaim_of_lower_priority_only_leaves_a_higher_borrower_alone() -> None:
    queues = [_queue("a", 4000, reclaim_within_cohort="lower_priority"), _queue("b", 4000)]
    _, two = _passes([_prio(_job("bb", 8, "b"), 90)], [_prio(_job("aa", 4, "a"), 10)], queues)
    assert (_held(two, "aa"), _held(two, "bb")) == (0, 8) and not two.preemptions
    queues[0] = _queue("a", 4000)  # the default, any: the same trade is made
    _, two = _passes([_prio(_job("bb", 8, "b"), 90)], [_prio(_job("aa", 4, "a"), 10)], queues)
    assert (_held(two, "aa"), _held(two, "bb")) == (4, 4)


def test_a_queue_with_the_default_rules_dumps_as_before_and_a_bad_rule_is_named() -> None:
    assert "preemption" not in _queue("q", 1000).model_dump(mode="json")
    dumped = _queue("q", 1000, within_queue="lower_priority").model_dump(mode="json")
    assert dumped["preemption"]["within_queue"] == "lower_priority"
    with pytest.raises(ValidationError) as err:
        _queue("q", 1000, within_queue="sometimes")
    assert "preemption.within_queue" in str(err.value)
