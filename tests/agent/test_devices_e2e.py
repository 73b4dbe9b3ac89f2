"""Each task is told its GPUs (issue 33), seen from the outside through real agents.

Three ``forge agent`` processes (a ``worker.py`` process, a SQLite store, the
session's dev server): ``a`` and ``b`` with three declared GPUs each (no NVIDIA
tooling here), ``c`` with two GPUs listed by a fake ``nvidia-smi`` on its PATH (the
CSV the real one prints, UUIDs included). Jobs of whole devices, a pair with a
CPU-only sidecar, shares of 300 milli and a CPU job run; each task process's
environment, read from /proc as an operator would, must match its binding in the
store: ``CUDA_VISIBLE_DEVICES`` the bound devices (UUIDs on ``c``, indexes
elsewhere), no whole device in two replicas on a node, shares with their milli and
memory, none for a task that asked none.
"""

from __future__ import annotations

import stat
import sys
from collections import defaultdict
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from forge.core.models import Assignment, Job
from tests.agent.cluster import AgentCluster, own_cluster
from tests.agent.helpers import task_environs
from tests.e2e.procs import eventually

pytestmark = pytest.mark.slow

CLUSTER = "devices-e2e"
SLEEP = "import time; time.sleep(3600)"
UUIDS = ["GPU-c0000000-0000-0000-0000-000000000000", "GPU-c1111111-1111-1111-1111-111111111111"]
#: How busy the fake says c's devices are when asked (a usage round).
BUSY = {"gpu0": 0.7, "gpu1": 0.2}
SMI = (
    "#!/bin/sh\ncase \"$*\" in *utilization.gpu*) printf '%s\\n' '1, 20' '0, 70'; exit 0;; esac\n"
    "printf '%s\\n' "
    + " ".join(f"'{i}, {u}, NVIDIA A100-SXM4-40GB, 40960'" for i, u in enumerate(UUIDS))
)


def _task(name: str, gpu: dict[str, int] | None = None) -> dict[str, Any]:
    resources: dict[str, Any] = {"cpu": 100, "memory": 64}
    if gpu:
        resources["gpu"] = gpu
    return {
        "name": name,
        "command": [sys.executable, "-c", SLEEP],
        "resources": resources,
        "stop_grace": 1.0,
    }


def _job(name: str, replicas: int, *tasks: dict[str, Any]) -> Job:
    scaling = {"min": 0, "max": 8, "desired": replicas}
    return Job.model_validate(
        {"id": name, "name": name, "groups": [{"name": "main", "scaling": scaling, "tasks": tasks}]}
    )


JOBS = [
    _job("whole", 4, _task("t", {"count": 1})),
    _job("pair", 1, _task("trainer", {"count": 2}), _task("sidecar")),
    _job("share", 3, _task("t", {"count": 1, "milli": 300, "memory": 10240})),
    _job("cpu", 1, _task("t")),
]
#: Task processes once every replica runs: one per task of each replica.
PROCESSES = 4 + 2 + 3 + 1


@pytest_asyncio.fixture
async def cluster(
    dev_env: Any, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[AgentCluster]:
    async with own_cluster(dev_env, tmp_path, request, CLUSTER, make=AgentCluster) as cl:
        yield cl


def _visible(a: Assignment) -> str:
    """What CUDA must read for ``a``'s devices: c's UUIDs, the others' indexes."""
    if a.node == "c":
        return ",".join(UUIDS[int(d.removeprefix("gpu"))] for d in a.gpu_ids)
    return ",".join(d.removeprefix("gpu") for d in a.gpu_ids)


async def test_every_task_sees_exactly_the_gpus_of_its_binding(
    cluster: AgentCluster, tmp_path: Path
) -> None:
    cl = cluster
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text(SMI + "\n")
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    for name in ("a", "b"):
        cl.start_agent(name, *("--gpu", "A100:40960") * 3, "--usage-every", "0.5")
    cl.start_agent("c", "--usage-every", "0.5", env={"PATH": f"{smi.parent}:/usr/bin:/bin"})
    await eventually(cl.fc.status, lambda s: len(s.nodes) == 3, what="three agents registered")
    for job in JOBS:
        await cl.fc.submit_job(job)

    async def environs() -> dict[int, dict[str, str]]:
        return task_environs({"FORGE_CLUSTER": CLUSTER})

    procs = await eventually(
        environs, lambda e: len(e) == PROCESSES, timeout=60, what="every task running"
    )
    bindings = {a.workload_id: a for a in cl.store.assignments(CLUSTER, limit=1000)}
    whole_on: dict[str, list[str]] = defaultdict(list)  # node -> whole devices in use
    on_c = 0
    for env in procs.values():
        a = bindings[env["FORGE_WORKLOAD_ID"]]
        where = f"{a.workload_id} task {env['FORGE_TASK']}: {env['CUDA_VISIBLE_DEVICES']!r}"
        assert env["FORGE_NODE"] == a.node, where
        if a.job == "cpu" or env["FORGE_TASK"] == "sidecar":
            assert env["CUDA_VISIBLE_DEVICES"] == "" and env["FORGE_GPU_IDS"] == "", where
            continue
        assert env["CUDA_VISIBLE_DEVICES"] == _visible(a), where
        assert env["FORGE_GPU_IDS"] == ",".join(a.gpu_ids), where
        assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID", where
        on_c += a.node == "c"
        if a.job == "share":
            assert a.gpu_milli == 300 and len(a.gpu_ids) == 1, a
            assert env["FORGE_GPU_MILLI"] == "300", where
            assert env["FORGE_GPU_MEMORY_MIB"] == "10240", where
            assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30", where
        else:
            assert "FORGE_GPU_MILLI" not in env, where
            assert len(a.gpu_ids) == {"whole": 1, "pair": 2}[a.job], a
            whole_on[a.node].extend(a.gpu_ids)
    for node, devices in whole_on.items():
        assert len(devices) == len(set(devices)), f"{node}: a whole GPU in two replicas"
    # six whole devices and 900 milli do not fit a's and b's six: c runs GPU work
    assert on_c, "no GPU task on the agent whose GPUs nvidia-smi listed"
    await _gpu_usage_is_measured_where_it_can_be(cl, bindings)
    logs = {n: (tmp_path / f"agent-{n}.log").read_text() for n in "abc"}
    assert "3 GPU as declared (no nvidia-smi on PATH)" in logs["a"], logs["a"]
    assert "2 GPU detected by nvidia-smi" in logs["c"], logs["c"]


def _expected_gpu(a: Assignment, bindings: dict[str, Assignment]) -> float | None:
    """c's replicas: their devices' busy time (a share: over the shares on its
    device); a's and b's devices are declared, not measured: None, never 0."""
    if a.node != "c" or not a.gpu_ids:
        return None
    if a.gpu_milli:
        on = sum(b.gpu_milli for b in bindings.values() if b.node == "c" and b.gpu_ids == a.gpu_ids)
        return round(BUSY[a.gpu_ids[0]] * 1000 / on, 4)
    return round(sum(BUSY[d] for d in a.gpu_ids) / len(a.gpu_ids), 4)


async def _gpu_usage_is_measured_where_it_can_be(
    cl: AgentCluster, bindings: dict[str, Assignment]
) -> None:
    """Issue 33: every replica's usage sample carries the GPU utilisation its agent
    measured (the autoscaler's ``gpu``), read from the store as the loop reads it."""
    want = {w: _expected_gpu(a, bindings) for w, a in bindings.items()}
    assert any(v is not None for v in want.values()), "no GPU replica on c"

    async def latest() -> dict[str, float | None]:
        return {r.workload_id: r.gpu for r in cl.store.latest_usage(CLUSTER)}

    await eventually(latest, lambda got: got == want, timeout=30, what="gpu usage as measured")
    groups = cl.store.group_usage(CLUSTER, 0)
    assert groups["cpu/main"].gpu is None
