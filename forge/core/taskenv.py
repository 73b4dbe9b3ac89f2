"""The task contract: what a task is told about the place Forge gave it.

Placement binds a replica to exact GPU device ids (and, for a share, to a milli
share of one device); a process that is not told them sees every GPU of its node,
and two replicas bound to devices 0-1 and 2-3 would both train on device 0. So the
agent sets the variables below from the binding, and they are Forge's: a task that
sets one of them in its own ``env`` is refused at submission (:func:`reserved_env`),
never silently overridden.

Pure: the agent passes in how its registered device ids map to what CUDA reads
(``visible``), so the split is tested without a GPU.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Mapping
from dataclasses import dataclass

from forge.core.limits import GPU_MILLI
from forge.core.models import Job, TaskGroup

__all__ = [
    "MASTER_PORTS",
    "PEER_ENV",
    "RESERVED_ENV",
    "RESERVED_PREFIX",
    "TaskDevices",
    "device_env",
    "has_peers",
    "master_port",
    "peer_env",
    "reserved_env",
    "split_devices",
    "visible_id",
]

#: Variables Forge sets in every task's environment (see the README's table).
RESERVED_ENV = frozenset(
    {
        "FORGE_WORKLOAD_ID",
        "FORGE_TASK",
        "FORGE_NODE",
        "FORGE_GPU_IDS",
        "FORGE_GPU_MILLI",
        "FORGE_GPU_MEMORY_MIB",
        "CUDA_VISIBLE_DEVICES",
        "NVIDIA_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
    }
)
#: ``FORGE_PORT_<NAME>``: each of the replica's ports.
RESERVED_PREFIX = "FORGE_PORT_"
#: What a member of a gang (or of a ``rendezvous`` group) is told about its peers:
#: Forge's names and the ones torchrun, DeepSpeed and Horovod read. Reserved only
#: in such groups: elsewhere ``RANK`` is the task's own business.
PEER_ENV = frozenset(
    {
        "FORGE_RANK",
        "FORGE_WORLD_SIZE",
        "FORGE_PEERS",
        "MASTER_ADDR",
        "MASTER_PORT",
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
    }
)
#: Rank 0's ``MASTER_PORT`` is taken from this range by the group's name (torchrun's
#: default, 29500, is its first port), so every member derives the same one.
MASTER_PORTS = range(29500, 30500)

_INDEXED = re.compile(r"(?:gpu)?(\d+)")


def reserved_env(job: Job) -> list[tuple[str, str]]:
    """``(field path, message)`` for every task env variable that is Forge's to set.

    Checked where jobs come in (the job file loader, the workflow's update
    validators), not in the model: a job stored before the rule must still load."""
    problems = []
    for gi, group in enumerate(job.groups):
        peers = PEER_ENV if has_peers(group) else frozenset()
        for ti, task in enumerate(group.tasks):
            for name in sorted(task.env):
                if name in RESERVED_ENV or name in peers or name.startswith(RESERVED_PREFIX):
                    problems.append(
                        (
                            f"groups.{gi}.tasks.{ti}.env.{name}",
                            f"{name} is set by Forge from the replica's binding; "
                            "remove it from the task's env",
                        )
                    )
    return problems


@dataclass(frozen=True)
class TaskDevices:
    """The devices one task of a replica gets: whole devices, or a share of one."""

    ids: tuple[str, ...] = ()
    milli: int = 0  # 1..999 for a share of ids[0]; 0: the ids are whole devices
    memory: int = 0  # MiB of the device a share may use (the task's gpu.memory)


def split_devices(
    group: TaskGroup, gpu_ids: tuple[str, ...], gpu_milli: int
) -> dict[str, TaskDevices]:
    """Each task's devices out of its replica's binding, in task order.

    The replica's request (``TaskGroup.request``) sums its tasks: whole devices
    are dealt to the tasks that ask whole devices, in order; a replica bound a share
    (``gpu_milli``) has one device, which its sharing tasks split by their own
    shares; shares beside whole devices were rounded up to whole devices, which
    the sharing tasks fill first-fit (the least used device when none has room).
    A task without a GPU request gets none."""
    out = {t.name: TaskDevices() for t in group.tasks}
    ids = list(gpu_ids)
    sharing = [t for t in group.tasks if t.resources.gpu.shared]
    if gpu_milli:
        for t in sharing:
            out[t.name] = TaskDevices(
                tuple(ids[:1]), t.resources.gpu.shared, t.resources.gpu.memory
            )
        return out
    taken = 0
    for t in group.tasks:
        gpu = t.resources.gpu
        if gpu.count and not gpu.shared:
            out[t.name] = TaskDevices(tuple(ids[taken : taken + gpu.count]))
            taken += gpu.count
    rest = ids[taken:]
    used = dict.fromkeys(rest, 0)
    for t in sharing:
        if not rest:
            break
        share = t.resources.gpu.shared
        room = [d for d in rest if used[d] + share <= GPU_MILLI]
        device = room[0] if room else min(rest, key=lambda d: used[d])
        used[device] += share
        out[t.name] = TaskDevices((device,), share, t.resources.gpu.memory)
    return out


def visible_id(device: str, uuids: Mapping[str, str]) -> str:
    """What CUDA and the NVIDIA container runtime read for a registered device id:
    its UUID when the agent detected one, else its index (``gpu3`` and ``3`` are
    device 3 in PCI bus order), else the id as registered."""
    if device in uuids:
        return uuids[device]
    m = _INDEXED.fullmatch(device)
    return m.group(1) if m else device


def device_env(devices: TaskDevices, uuids: Mapping[str, str]) -> dict[str, str]:
    """The device variables of one task (empty ``CUDA_VISIBLE_DEVICES``: sees none).

    A share also gets the NVIDIA MPS limits that enforce it where an MPS daemon
    serves the device; without MPS they are advisory (the README says which)."""
    visible = ",".join(visible_id(d, uuids) for d in devices.ids)
    env = {
        "CUDA_VISIBLE_DEVICES": visible,
        "NVIDIA_VISIBLE_DEVICES": visible or "void",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "FORGE_GPU_IDS": ",".join(devices.ids),
    }
    if devices.milli:
        env["FORGE_GPU_MILLI"] = str(devices.milli)
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(max(1, -(-devices.milli // 10)))
        if devices.memory:
            env["FORGE_GPU_MEMORY_MIB"] = str(devices.memory)
            env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={devices.memory}M"
    return env


def has_peers(group: TaskGroup) -> bool:
    """Whether the group's replicas are told about each other (a gang always is)."""
    return group.gang or group.rendezvous


def master_port(job: str, group: str) -> int:
    """The port rank 0 listens on, the same for every member without asking."""
    return MASTER_PORTS[zlib.crc32(f"{job}/{group}".encode()) % len(MASTER_PORTS)]


def peer_env(
    job: str,
    group: str,
    ordinal: int,
    world: int,
    nodes: Mapping[int, str],
    addresses: Mapping[str, str],
) -> dict[str, str] | str:
    """The peer variables of replica ``ordinal`` of a group of ``world`` replicas,
    or why they cannot be told yet (a member not bound, a node without an address).

    ``nodes`` maps each bound ordinal to its node, ``addresses`` each node to the
    address its agent advertises. Ranks are ordinals; ``LOCAL_RANK`` counts the
    members on the same node in rank order."""
    if not 0 <= ordinal < world:
        return f"ordinal {ordinal} is outside the group's {world} replicas"
    missing = [r for r in range(world) if r not in nodes]
    if missing:
        return f"{len(missing)} of {world} members not bound (rank {missing[0]} first)"
    unknown = sorted({nodes[r] for r in range(world)} - set(addresses))
    if unknown:
        return f"node {unknown[0]} advertises no address (an agent older than peers)"
    here = nodes[ordinal]
    local = [r for r in range(world) if nodes[r] == here]
    peers = ",".join(addresses[nodes[r]] for r in range(world))
    port = str(master_port(job, group))
    return {
        "FORGE_RANK": str(ordinal),
        "FORGE_WORLD_SIZE": str(world),
        "FORGE_PEERS": peers,
        "MASTER_ADDR": addresses[nodes[0]],
        "MASTER_PORT": port,
        "RANK": str(ordinal),
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": str(local.index(ordinal)),
        "LOCAL_WORLD_SIZE": str(len(local)),
    }
