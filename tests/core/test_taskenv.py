"""The task contract (forge.core.taskenv): each task of a replica is told exactly the
devices its binding holds for it, a share its milli and memory, and a task may not
set those variables itself."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from forge.core.models import GpuRequest, Job, Resources, Task, TaskGroup
from forge.core.taskenv import (
    MASTER_PORTS,
    TaskDevices,
    device_env,
    has_peers,
    master_port,
    peer_env,
    reserved_env,
    split_devices,
    visible_id,
)
from tests.builders import group, job


def _task(name: str, count: int = 0, milli: int = 0, memory: int = 0) -> Task:
    gpu = GpuRequest(count=count, milli=milli, memory=memory)
    return Task(name=name, resources=Resources(cpu=100, memory=64, gpu=gpu))


def _group(*tasks: Task) -> TaskGroup:
    return TaskGroup(name="g", tasks=tasks)


def _bound(g: TaskGroup) -> tuple[tuple[str, ...], int]:
    """The ids and share a placement binds for one replica of ``g``."""
    req = g.request()
    return tuple(f"gpu{i}" for i in range(req.gpu)), req.gpu_milli


def test_whole_devices_are_dealt_in_task_order_and_a_cpu_task_gets_none() -> None:
    g = _group(_task("a", count=2), _task("cpu"), _task("b", count=1))
    got = split_devices(g, ("gpu4", "gpu5", "gpu7"), 0)
    assert got == {
        "a": TaskDevices(("gpu4", "gpu5")),
        "cpu": TaskDevices(),
        "b": TaskDevices(("gpu7",)),
    }


def test_a_shared_replica_gives_each_sharing_task_its_own_share_of_the_one_device() -> None:
    g = _group(_task("a", count=1, milli=300, memory=8192), _task("b", count=1, milli=200))
    assert _bound(g) == (("gpu0",), 500)
    got = split_devices(g, ("gpu3",), 500)
    assert got == {"a": TaskDevices(("gpu3",), 300, 8192), "b": TaskDevices(("gpu3",), 200)}


def test_shares_beside_whole_devices_fill_the_rounded_up_devices_first_fit() -> None:
    g = _group(
        _task("w", count=1), _task("s1", count=1, milli=600), _task("s2", count=1, milli=300)
    )
    assert _bound(g) == (("gpu0", "gpu1"), 0)
    got = split_devices(g, ("gpu0", "gpu1"), 0)
    assert got["w"] == TaskDevices(("gpu0",))
    assert got["s1"] == TaskDevices(("gpu1",), 600)
    assert got["s2"] == TaskDevices(("gpu1",), 300)


def test_shares_that_overflow_one_device_go_to_the_next_not_over_a_whole_one() -> None:
    g = _group(_task("s1", count=1, milli=600), _task("s2", count=1, milli=600))
    assert _bound(g) == (("gpu0", "gpu1"), 0)
    got = split_devices(g, ("gpu0", "gpu1"), 0)
    assert (got["s1"].ids, got["s2"].ids) == (("gpu0",), ("gpu1",))


@st.composite
def groups(draw: st.DrawFn) -> TaskGroup:
    tasks = []
    for i in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from(["cpu", "whole", "share"]))
        if kind == "whole":
            tasks.append(_task(f"t{i}", count=draw(st.integers(1, 4))))
        elif kind == "share":
            milli = draw(st.integers(1, 999))
            tasks.append(_task(f"t{i}", count=1, milli=milli, memory=draw(st.integers(0, 4096))))
        else:
            tasks.append(_task(f"t{i}"))
    return _group(*tasks)


@given(groups())
def test_every_task_gets_what_it_asked_within_the_binding_and_no_whole_device_twice(
    g: TaskGroup,
) -> None:
    ids, milli = _bound(g)
    got = split_devices(g, ids, milli)
    whole: list[str] = []
    for t in g.tasks:
        d = got[t.name]
        assert set(d.ids) <= set(ids)
        gpu = t.resources.gpu
        if gpu.shared:
            assert len(d.ids) == 1 and d.milli == gpu.shared and d.memory == gpu.memory
        elif gpu.count:
            assert len(d.ids) == gpu.count and d.milli == 0
            whole.extend(d.ids)
        else:
            assert d == TaskDevices()
    assert len(whole) == len(set(whole)), "a whole device given to two tasks"
    shared = {i for t in g.tasks if t.resources.gpu.shared for i in got[t.name].ids}
    assert not shared & set(whole), "a whole device also given as a share"


def test_cuda_reads_the_uuid_when_detected_else_the_index() -> None:
    uuids = {"gpu1": "GPU-1111"}
    assert visible_id("gpu1", uuids) == "GPU-1111"
    assert visible_id("gpu12", uuids) == "12"
    assert visible_id("7", uuids) == "7"
    assert visible_id("MIG-abc", uuids) == "MIG-abc"


def test_the_variables_of_whole_devices_a_share_and_none() -> None:
    env = device_env(TaskDevices(("gpu0", "gpu2")), {"gpu2": "GPU-2222"})
    assert env == {
        "CUDA_VISIBLE_DEVICES": "0,GPU-2222",
        "NVIDIA_VISIBLE_DEVICES": "0,GPU-2222",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "FORGE_GPU_IDS": "gpu0,gpu2",
    }
    share = device_env(TaskDevices(("gpu3",), 305, 10240), {})
    assert share["FORGE_GPU_MILLI"] == "305"
    assert share["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "31"  # rounded up, never 0
    assert share["FORGE_GPU_MEMORY_MIB"] == "10240"
    assert share["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=10240M"  # index as the task sees it
    assert device_env(TaskDevices(("gpu3",), 1), {})["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "1"
    none = device_env(TaskDevices(), {})
    assert none["CUDA_VISIBLE_DEVICES"] == ""  # sees no GPU, not every GPU
    assert none["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert "FORGE_GPU_MILLI" not in none and "FORGE_GPU_MEMORY_MIB" not in none


@pytest.mark.parametrize(
    "name", ["CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "FORGE_GPU_IDS", "FORGE_PORT_HTTP"]
)
def test_a_task_may_not_set_what_forge_sets(name: str) -> None:
    data: dict[str, Any] = job("j", group(), group("h")).model_dump(mode="json")
    data["groups"][1]["tasks"][0]["env"] = {"OK": "1", name: "0"}
    problems = reserved_env(Job.model_validate(data))
    assert [where for where, _ in problems] == [f"groups.1.tasks.0.env.{name}"]
    assert "set by Forge" in problems[0][1]


def test_other_variables_are_the_tasks_own() -> None:
    data: dict[str, Any] = job("j").model_dump(mode="json")
    data["groups"][0]["tasks"][0]["env"] = {"CUDA_LAUNCH_BLOCKING": "1", "FORGE_X": "y"}
    assert reserved_env(Job.model_validate(data)) == []


def test_peers_are_ranked_by_ordinal_with_rank_zeros_node_as_master() -> None:
    nodes = {0: "a", 1: "b", 2: "a"}
    addresses = {"a": "10.0.0.1", "b": "10.0.0.2"}
    envs = [peer_env("train", "w", r, 3, nodes, addresses) for r in range(3)]
    assert all(isinstance(e, dict) for e in envs)
    first, second, third = (e for e in envs if isinstance(e, dict))
    assert [e["RANK"] for e in (first, second, third)] == ["0", "1", "2"]
    assert {e["MASTER_ADDR"] for e in (first, second, third)} == {"10.0.0.1"}
    assert {e["MASTER_PORT"] for e in (first, second, third)} == {str(master_port("train", "w"))}
    assert first["FORGE_PEERS"] == "10.0.0.1,10.0.0.2,10.0.0.1"
    assert (first["LOCAL_RANK"], third["LOCAL_RANK"], second["LOCAL_RANK"]) == ("0", "1", "0")
    assert (first["LOCAL_WORLD_SIZE"], second["LOCAL_WORLD_SIZE"]) == ("2", "1")
    assert first["WORLD_SIZE"] == first["FORGE_WORLD_SIZE"] == "3"


def test_peers_are_not_told_until_every_member_is_bound_with_an_address() -> None:
    assert peer_env("j", "g", 0, 2, {0: "a"}, {"a": "h"}) == (
        "1 of 2 members not bound (rank 1 first)"
    )
    assert "node b advertises no address" in str(
        peer_env("j", "g", 0, 2, {0: "a", 1: "b"}, {"a": "h"})
    )
    assert "outside" in str(peer_env("j", "g", 2, 2, {0: "a", 1: "a"}, {"a": "h"}))


def test_the_master_port_is_the_groups_own_within_its_range() -> None:
    ports = {master_port(f"job{i}", "g") for i in range(200)}
    assert ports <= set(MASTER_PORTS) and len(ports) > 150  # spread, not one port
    assert master_port("a", "b") == master_port("a", "b")


def test_peer_names_are_reserved_only_where_peers_are_told() -> None:
    data: dict[str, Any] = job("j", group(), group("h")).model_dump(mode="json")
    for g in data["groups"]:
        g["tasks"][0]["env"] = {"RANK": "0"}
    data["groups"][1]["gang"] = True
    parsed = Job.model_validate(data)
    assert not has_peers(parsed.groups[0]) and has_peers(parsed.groups[1])
    assert [w for w, _ in reserved_env(parsed)] == ["groups.1.tasks.0.env.RANK"]
    data["groups"][1]["gang"] = False
    data["groups"][0]["rendezvous"] = True
    assert [w for w, _ in reserved_env(Job.model_validate(data))] == ["groups.0.tasks.0.env.RANK"]


def test_rendezvous_left_at_its_default_is_not_dumped() -> None:
    g = group()
    assert "rendezvous" not in g.model_dump(mode="json")
    assert g.model_copy(update={"rendezvous": True}).model_dump(mode="json")["rendezvous"]
