"""``forge queue`` as a user runs it: bad files refused before anything is sent (exit
2, the field named), and one live run against a dev server: apply, a job in the
queue held to its quota, ``forge explain`` naming the queue's reason, ``forge queue
list`` and ``show``, a raised quota admitting the rest, and the refusals (an unknown queue, a
delete of a queue in use)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from forge.stores import SqliteStore
from forge.wire.codec import data_converter
from tests.cli.test_cli import forge, run, write
from tests.workflow.harness import cluster

NODES = "- {id: n1, cpu: 8000, memory: 16384}\n"
QUEUES = """\
queues:
  - name: ml
    quota: {cpu: {nominal: CPU}}
"""
JOBS = """\
name: train
queue: ml
groups:
  - name: w
    scaling: {min: 0, max: 4, desired: 4}
    tasks: [{name: t, resources: {cpu: 1000, memory: 256}}]
"""


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("queues: [{name: ml, quota: {cpu: {nominal: -1}}}]", "quota.cpu.nominal"),
        ("queues: [{name: ml, quota: {cpu: {nominal: 1, lending_limit: 2}}}]", "lending_limit"),
        ("queues: [{name: default}]", "'default' is the queue without a quota"),
        ("queues: [{name: ml}, {name: ml}]", "ml"),
        ("queues: [{name: ml, quotas: {}}]", "quotas"),
        ("queues: {name: ml}", "queues: expected a list"),
        ("queues: []", "contains no queues"),
        ("queues: [{name: ml, preemption: {within_queue: always}}]", "preemption.within_queue"),
    ],
)
def test_a_bad_queue_file_exits_2_naming_the_field(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str, named: str
) -> None:
    # no server is listening on this address: the file is refused before a connection
    path = write(tmp_path, "queues.yaml", text)
    code, out, err = run(capsys, "queue", "apply", path, "--address", "127.0.0.1:1")
    assert (code, out) == (2, "")
    assert named in err and "queues.yaml" in err and "Traceback" not in err


@pytest.mark.slow
async def test_forge_queue_drives_a_live_cluster(
    temporal_cli: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_cli,
        data_converter=data_converter(),
        dev_server_log_level="error",
    )
    try:
        db = tmp_path / "forge.db"
        monkeypatch.setenv("FORGE_STORE", f"sqlite:///{db}")  # explain reads the store
        async with cluster(env.client, store=SqliteStore(db)) as (fc, _):
            await fc.start()
            target = ["--address", env.client.service_client.config.target_host]
            target += ["--task-queue", fc.task_queue, "--cluster", fc.cluster]

            async def cli(*argv: str) -> tuple[int, str, str]:
                return await forge(capsys, *argv, *target)

            code, _, err = await cli("node", "add", "--file", write(tmp_path, "n.yaml", NODES))
            assert code == 0, err
            jobs = write(tmp_path, "train.yaml", JOBS)
            code, out, err = await cli("job", "run", jobs)  # no queue 'ml' yet
            assert (code, out) == (2, ""), err
            assert "queue: no queue 'ml'" in err

            code, out, err = await cli("queue", "apply", _queues(tmp_path, 2000))
            assert code == 0, err
            assert "applied 1 queue(s)" in out and "ml" in out
            code, out, err = await cli("job", "run", jobs)
            assert code == 0, err
            assert "train: 4 desired, 2 bound, 2 pending" in out  # 8 cpus free: the quota
            code, out, err = await cli("explain", "train/w/3")
            assert code == 0, err
            assert "queue ml: cpu quota 2000/2000 in use" in out

            code, out, err = await cli("queue", "list", "--json")
            assert code == 0, err
            (ml,) = json.loads(out)["queues"]
            assert (ml["usage"]["cpu"], ml["bound"], ml["queued"]) == (2000, 2, 2)
            code, out, err = await cli("queue", "delete", "ml")  # train names it
            assert (code, out) == (2, ""), err
            assert "queue 'ml' has work admitted or waiting (2 replica(s) bound, 2 queued)" in err

            code, out, err = await cli("queue", "apply", _queues(tmp_path, 4000), "--json")
            assert code == 0, err
            (ml,) = json.loads(out)["queues"]  # answered after the pass that admits
            assert (ml["usage"]["cpu"], ml["queued"]) == (4000, 0)
            code, out, err = await cli("queue", "list")
            assert code == 0, err
            assert "4000" in out and "ml" in out
            code, out, err = await cli("queue", "show", "ml")
            assert code == 0, err
            assert "4 replica(s) bound, 0 queued" in out
            assert re.search(r"^cpu +4000 +4000 +0 ", out, re.M), out
            code, out, err = await cli("queue", "show", "nope")
            assert (code, out) == (1, "") and "no queue 'nope'" in err
    finally:
        await env.shutdown()


def _queues(tmp_path: Path, cpu: int) -> str:
    return write(tmp_path, f"queues-{cpu}.yaml", QUEUES.replace("CPU", str(cpu)))
