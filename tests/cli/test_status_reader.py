"""``forge status`` reads the store and asks Temporal only whether the workflow runs,
on the bare gRPC service client: no ``temporalio.client`` import, the bindings read
once; a run that may be stuck still gets the watchdog's diagnosis."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from forge import cli
from forge.client import probe, watchdog
from forge.client.client import ForgeClient
from forge.core.models import Assignment, AssignmentStatus, Node
from forge.stores import SqliteStore
from forge.stores.base import Delta, Fence
from forge.wire import contract as c
from forge.wire.codec import data_converter

REPO = Path(__file__).resolve().parents[2]

_PROBE = """\
import sys
from forge import cli
code = cli.main(sys.argv[1:])
sys.stdout.flush()
print()
print(code, "temporalio.client" in sys.modules)
"""


@pytest.fixture(scope="module")
async def server(temporal_cli: str) -> AsyncIterator[str]:
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_cli,
        data_converter=data_converter(),
        dev_server_log_level="error",
    )
    try:
        # started, never run (no worker): describe() shows it running
        await ForgeClient(env.client, cluster="c1", search_attributes=False).start()
        yield env.client.service_client.config.target_host
    finally:
        await env.shutdown()


def _store(tmp_path: Path) -> str:
    db = tmp_path / "forge.db"
    store = SqliteStore(db)
    nodes = [Node.model_validate({"id": f"n{i}", "cpu": 4000, "memory": 8192}) for i in range(3)]
    bound = [
        Assignment(
            workload_id=f"web/api/{i}",
            job="web",
            group="api",
            ordinal=i,
            node=f"n{i}",
            cpu=1000,
            memory=1024,
            status=AssignmentStatus.RUNNING,
        )
        for i in range(2)
    ]
    status = c.LoopStatus(summary=c.Summary.empty()).model_dump_json()
    store.apply_delta("c1", Fence(1, 1), Delta(nodes_upsert=nodes, bind=bound, status=status))
    store.close()
    return f"sqlite:///{db}"


def _forge(*argv: str) -> tuple[int, bool, str, str]:
    """``forge ARGV`` in a fresh interpreter: (exit code, whether temporalio.client
    was imported, stdout, stderr)."""
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, *argv],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        check=False,
    )
    out, _, last = done.stdout.rstrip("\n").rpartition("\n")
    code, imported = last.split()
    return int(code), imported == "True", out, done.stderr


async def test_status_reads_the_store_without_the_sdk_client(server: str, tmp_path: Path) -> None:
    target = ["--address", server, "--cluster", "c1", "--store", _store(tmp_path)]
    code, imported, out, err = _forge("status", "--json", *target)
    assert code == 0, err
    assert not imported, "forge status imported temporalio.client"
    doc = json.loads(out)
    assert [n["id"] for n in doc["nodes"]] == ["n0", "n1", "n2"]
    assert [a["workload_id"] for a in doc["assignments"]] == ["web/api/0", "web/api/1"]
    assert doc["summary"]["notices"] == []
    code, imported, out, err = _forge("status", "-a", *target)
    assert code == 0 and not imported, err
    assert "web/api/1" in out and out.count(" ready ") == 3


_IMPORTS = """\
import sys
from forge import cli
code = cli.main(sys.argv[1:])
sys.stdout.flush()
print()
loaded = sorted(m for m in sys.modules if m.startswith(("forge", "temporalio.client")))
print(code, " ".join(loaded))
"""

#: What ``forge status`` on an SQLite store must not load: the models, the contract,
#: the store modules and the SDK's client (most of its time at 1,000 nodes).
HEAVY = {
    "forge.client.client",
    "forge.client.reads",
    "forge.core.models",
    "forge.core.placement",
    "forge.stores",
    "forge.wire.contract",
    "forge.wire.encryption",
    "temporalio.client",
}


def _modules_of(*argv: str) -> tuple[int, set[str], str]:
    """``forge ARGV`` in a fresh interpreter: (exit code, the forge modules and SDK
    client modules it loaded, stderr)."""
    done = subprocess.run(
        [sys.executable, "-c", _IMPORTS, *argv],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        check=False,
    )
    code, *modules = done.stdout.rstrip("\n").rpartition("\n")[2].split()
    return int(code), set(modules), done.stderr


@pytest.mark.parametrize("flags", [[], ["--json"], ["-a"]], ids=["text", "json", "listing"])
async def test_status_on_sqlite_loads_no_model_no_store_module_and_no_sdk_client(
    server: str, tmp_path: Path, flags: list[str]
) -> None:
    argv = ["status", *flags, "--address", server, "--cluster", "c1", "--store", _store(tmp_path)]
    code, modules, err = _modules_of(*argv)
    assert code == 0, err
    assert HEAVY.isdisjoint(modules), sorted(HEAVY.intersection(modules))
    assert "forge.client.status_rows" in modules  # (the guard guards the fast path)


async def test_status_of_a_cluster_not_running_exits_1_in_one_line(
    server: str, tmp_path: Path
) -> None:
    code, _, out, err = _forge(
        "status", "--address", server, "--cluster", "other", "--store", _store(tmp_path)
    )
    assert code == 1 and out == ""
    assert "not running" in err and err.count("\n") == 1


async def test_a_run_that_may_be_stuck_gets_the_watchdogs_diagnosis(
    server: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    async def failing(*args: object) -> probe.Probe:
        return probe.Probe(running=True, attempt=3)

    since = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)

    async def diagnose(client: object, workflow_id: str) -> watchdog.Stuck:
        assert workflow_id == "forge-cluster-c1"
        return watchdog.Stuck(workflow_id, "run", 3, "nondeterminism", since, 3, "boom")

    monkeypatch.setattr(probe, "probe", failing)
    monkeypatch.setattr(watchdog, "diagnose", diagnose)
    argv = ["status", "--address", server, "--cluster", "c1", "--store", _store(tmp_path)]
    assert await asyncio.to_thread(cli.main, argv) == 0  # (it runs its own event loop)
    out = capsys.readouterr().out
    assert "attention: stuck since 2026-01-02T03:04:05+00:00: nondeterminism" in out
