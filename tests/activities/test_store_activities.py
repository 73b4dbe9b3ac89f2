"""Store activities, run in Temporal's activity test environment against the
memory store: what they hand the workflow stays far below the 2 MiB payload limit."""

from __future__ import annotations

import json
import random
import uuid
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from temporalio.testing import ActivityEnvironment

from activities.pages import PAGE_BYTES, compact_specs, within_bytes
from activities.store_activities import StoreActivities
from forge.core.models import GpuDevice, Job, Node
from forge.stores.base import Delta, Fence, TaskReport
from forge.stores.memory import MemoryStore
from forge.stores.sqlite import SqliteStore
from forge.wire.activity_contract import (
    JOB_EXTRAS,
    JobChangesIn,
    JobsPage,
    PageIn,
    ReportsIn,
    ReportsOut,
)
from tests.strategies import jobs


def _large(name: str, rnd: random.Random) -> Job:
    args = ["".join(rnd.choices("abcdefghijklmnopqrstuvwxyz", k=1000)) for _ in range(100)]
    task = {"name": "t", "args": args, "resources": {"cpu": 10, "memory": 16}}
    return Job.model_validate({"name": name, "groups": [{"name": "main", "tasks": [task]}]})


def test_within_bytes_keeps_at_least_one_and_stops_at_the_budget() -> None:
    assert within_bytes([5, 5, 5], lambda n: n, budget=10) == 2
    assert within_bytes([50, 5], lambda n: n, budget=10) == 1  # one item always goes
    assert within_bytes([], lambda n: n, budget=10) == 0
    assert within_bytes([1] * 7, lambda n: n, budget=10) == 7


def test_job_pages_are_cut_by_bytes_and_resume_where_they_stopped() -> None:
    store = MemoryStore()
    rnd = random.Random(3)
    jobs = [_large(f"large{i:02d}", rnd) for i in range(40)]  # ~4 MB of specs
    store.put_jobs("c", jobs)
    acts = StoreActivities(store)
    env = ActivityEnvironment()
    seen: list[str] = []
    since, pages = 0, 0
    while True:
        page = env.run(acts.job_changes, JobChangesIn(cluster="c", since=since, limit=500))
        pages += 1
        assert len(page.model_dump_json()) <= PAGE_BYTES + 128 * 1024
        seen.extend(job_id for job_id, _ in page.jobs())
        since = page.revision
        if not page.more:
            break
    assert pages >= 4
    assert seen == [j.id for j in jobs]  # each once, in revision order


def test_a_job_page_lists_each_group_once_and_rebuilds_the_jobs_it_held() -> None:
    store = MemoryStore()
    web = Job.model_validate(
        {"name": "web0", "groups": [{"name": "api", "tasks": [{"name": "t", "env": {"A": "1"},
         "resources": {"cpu": 500, "memory": 256}}]}]}
    )  # fmt: skip
    jobs = [web.model_copy(update={"id": f"web{i}", "name": f"web{i}"}) for i in range(5)]
    other = Job.model_validate(
        {"name": "db", "priority": 90, "groups": [{"name": "main", "tasks": [{"name": "t",
         "resources": {"cpu": 1000, "memory": 1024}}]}]}
    )  # fmt: skip
    store.put_jobs("c", [*jobs, other])
    store.delete_job("c", "web3")
    page = ActivityEnvironment().run(
        StoreActivities(store).job_changes, JobChangesIn(cluster="c", since=0, limit=500)
    )
    wire = type(page).model_validate_json(page.model_dump_json())  # as the workflow reads it
    assert len(wire.groups) == 2  # five jobs of one shape, one of another
    got = dict(wire.jobs())
    assert got.pop("web3") is None
    assert got == {j.id: j for j in [*jobs, other] if j.id != "web3"}
    web0, web4, db = got["web0"], got["web4"], got["db"]
    assert web0 is not None and web4 is not None and db is not None
    assert web0.groups[0] is web4.groups[0]  # one object: one version digest
    assert db.priority == 90


def test_node_pages_are_cut_by_bytes() -> None:
    store = MemoryStore()
    labels = {f"k{i}": "v" * 200 for i in range(60)}  # ~13 KiB per node
    nodes = [
        Node(
            id=f"n{i:03d}",
            cpu=1000,
            memory=1024,
            gpus=tuple(GpuDevice(id=f"g{d}", model="A100", memory=1) for d in range(8)),
            labels=labels,
        )
        for i in range(300)
    ]
    store.apply_delta("c", Fence(1, 1), Delta(nodes_upsert=nodes))
    acts = StoreActivities(store)
    env = ActivityEnvironment()
    got: list[str] = []
    after = ""
    while True:
        page = env.run(acts.snapshot_nodes, PageIn(cluster="c", after=after, limit=5000))
        assert len(page.model_dump_json()) <= PAGE_BYTES + 64 * 1024
        got.extend(n.id for n in page.nodes)
        if page.next_after is None:
            break
        after = page.next_after
    assert got == [n.id for n in nodes]


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(jobs(), min_size=1, max_size=6), st.data())
def test_a_page_read_from_stored_text_rebuilds_exactly_the_stored_jobs(
    tmp_path: Path, specs: list[Job], data: st.DataObject
) -> None:
    """The reload parses each distinct group once from the stored JSON, never a
    whole job: the jobs it rebuilds equal what validating every spec gives."""
    specs = [j.model_copy(update={"id": f"j{i}", "name": f"j{i}"}) for i, j in enumerate(specs)]
    specs += [specs[0].model_copy(update={"id": "twin", "name": "twin"})]  # a shared shape
    store = SqliteStore(tmp_path / f"{uuid.uuid4().hex}.db")
    try:
        store.put_jobs("c", specs)
        gone = data.draw(st.sampled_from([j.id for j in specs]))
        store.delete_job("c", gone)
        page = ActivityEnvironment().run(
            StoreActivities(store).job_changes, JobChangesIn(cluster="c", since=0, limit=500)
        )
    finally:
        store.close()
    wire = type(page).model_validate_json(page.model_dump_json())
    got = dict(wire.jobs())
    assert got.pop(gone) is None
    assert got == {j.id: j for j in specs if j.id != gone}
    kept = [j for j in specs if j.id != gone]
    assert len(wire.groups) == len({g.model_dump_json() for j in kept for g in j.groups})


def test_a_stored_spec_of_another_shape_is_read_whole() -> None:
    """A spec with a key a compact row cannot carry is validated as a job, so its
    page still holds the job the store holds."""
    job = Job.model_validate(
        {"name": "a", "groups": [{"name": "g", "tasks": [{"name": "t",
         "resources": {"cpu": 100, "memory": 64}}]}]}
    )  # fmt: skip
    spec = json.loads(job.model_dump_json())
    spec["priority"] = 7
    odd = json.dumps({"groups": spec["groups"], "priority": 7, "name": "a", "id": "a"})
    page = compact_specs([(1, "a", odd), (2, "b", None)], 2, False)
    assert dict(page.jobs()) == {"a": job.model_copy(update={"priority": 7}), "b": None}


def test_a_reload_keeps_a_jobs_preemption_and_type() -> None:
    """``preemption: never`` and ``type: batch`` are job fields beside the groups: a
    page that dropped them made a reloaded job preemptible and a batch job a service
    (the runs it had completed then ran again)."""
    base = {"name": "a", "groups": [{"name": "g", "tasks": [{"name": "t",
            "resources": {"cpu": 100, "memory": 64}}]}]}  # fmt: skip
    job = Job.model_validate({**base, "preemption": "never", "type": "batch"})
    plain = Job.model_validate({**base, "id": "p", "name": "p"})
    page = compact_specs(
        [(1, "a", job.model_dump_json()), (2, "p", plain.model_dump_json())], 2, False
    )
    assert dict(page.jobs()) == {"a": job, "p": plain}
    assert len(page.rows[1]) == 5  # a plain row keeps the shape it had
    again = JobsPage.model_validate_json(page.model_dump_json())  # through history
    assert dict(again.jobs()) == {"a": job, "p": plain}


def test_a_reload_keeps_every_job_field_beside_the_groups() -> None:
    """Every field of ``Job`` but the row's own comes back from a page: one page
    carried only ``preemption`` and ``type``, so a batch job's ``active_deadline``
    (and ``ttl_after_finished``) was lost at the first continue-as-new or resync."""
    assert set(Job.model_fields) - {"id", "name", "priority", "groups"} == set(JOB_EXTRAS)
    base = {"name": "a", "type": "batch", "groups": [{"name": "g", "tasks": [{"name": "t",
            "resources": {"cpu": 100, "memory": 64}}]}]}  # fmt: skip
    job = Job.model_validate(
        {**base, "schedule": {"cron": "0 3 * * *", "timezone": "Europe/Berlin"},
         "active_deadline": 60, "ttl_after_finished": 30.5, "preemption": "never"}
    )  # fmt: skip
    page = compact_specs([(1, "a", job.model_dump_json())], 1, False)
    again = JobsPage.model_validate_json(page.model_dump_json())  # through history
    for loaded in (page, again):
        ((_, got),) = loaded.jobs()
        assert got == job and got is not None and got.schedule == job.schedule


def test_a_report_page_keeps_each_failed_runs_last_message_and_only_while_it_stands() -> None:
    """A batch job failed for good says why its run failed (its exit status): the page
    carries the message of each run whose latest report is a failure, no other."""
    store = MemoryStore()
    at = 1.0

    def rep(wid: str, status: str, message: str = "", code: int | None = None) -> TaskReport:
        return TaskReport(
            workload_id=wid, status=status, at=at, node="n", message=message, exit_code=code
        )

    store.report(
        "c",
        [
            rep("j/g/0", "running"),
            rep("j/g/0", "failed", "task t exited with status 3", 3),
            rep("j/g/1", "failed", "task t exited with status 1", 1),
            rep("j/g/1", "running", "started"),
            rep("j/g/2", "exited", "task t exited with status 0", 0),
            rep("j/g/3", "failed", "task t: cannot start 'x'"),
        ],
    )
    out = ActivityEnvironment().run(
        StoreActivities(store).read_reports, ReportsIn(cluster="c", seq=0, limit=100)
    )
    assert out.failures == {
        "j/g/0": "task t exited with status 3",
        "j/g/3": "task t: cannot start 'x'",
    }
    assert out.exit_codes == {"j/g/0": 3}  # the latest failure's, when it gives one
    assert dict(out.statuses) == {
        "j/g/0": "failed",
        "j/g/1": "running",
        "j/g/2": "exited",
        "j/g/3": "failed",
    }
    quiet = ReportsOut(statuses=[("j/g/1", "running")], last_seq=1)
    dumped = quiet.model_dump_json()  # histories without them keep their shape
    assert "failures" not in dumped and "exit_codes" not in dumped
