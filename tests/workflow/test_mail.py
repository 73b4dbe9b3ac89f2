"""The mail handlers post to and intakes take from (workflows.mail): an intake takes
exactly the items up to the number it recorded, in order, so a replay that ran a
handler earlier than the live run did still plans each pass from the same items."""

from __future__ import annotations

from forge.wire import contract as c
from tests.workflow.harness import job
from workflows.mail import Budget, JobWrite, Mail, NodeOps


def _write(name: str, size: int = 10) -> JobWrite:
    return JobWrite(name, job(name), size)


def test_an_intake_takes_the_items_it_recorded_and_leaves_later_ones() -> None:
    mail = Mail()
    first = [mail.post(_write("a")), mail.post(NodeOps((c.LostOp(node_id="n1"),)))]
    recorded = mail.total  # what the live intake saw
    mail.post(_write("b"))  # posted after it (live), or before it (a replay)
    taken = mail.take(recorded, room=1_000)
    assert [type(i).__name__ for i in taken] == ["JobWrite", "NodeOps"]
    assert first == [1, 2] and mail.taken == 2 and mail.total == 3
    assert [i.job_id for i in mail.take(mail.total, room=1_000) if isinstance(i, JobWrite)] == ["b"]


def test_a_recorded_number_below_what_was_taken_takes_nothing() -> None:
    mail = Mail()
    mail.post(Budget(5))
    mail.take(1, room=0)
    assert mail.take(0, room=1_000) == [] and mail.taken == 1


def test_job_writes_stop_at_the_room_of_one_store_write_but_never_before_the_first() -> None:
    mail = Mail()
    for name in ("a", "b", "c"):
        mail.post(_write(name, size=600))
    assert mail.bytes == 1_800
    first = mail.take(mail.total, room=1_000)
    assert [i.job_id for i in first if isinstance(i, JobWrite)] == ["a"]
    assert [i.job_id for i in mail.take(mail.total, room=100) if isinstance(i, JobWrite)] == ["b"]
    assert mail.bytes == 600 and mail.pending()


def test_the_newest_posted_write_of_a_job_is_what_handlers_see() -> None:
    mail = Mail()
    assert mail.current("a") == (False, None)
    mail.post(_write("a"))
    mail.post(JobWrite("a", None, 0))
    assert mail.current("a") == (True, None)
    mail.take(mail.total, room=1_000)
    assert mail.current("a") == (False, None)
