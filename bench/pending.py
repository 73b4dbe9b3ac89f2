"""Clusters that leave work pending: the shape that deadlocked the loop.

``pending_heavy(nodes, pods, shapes=30, unplaceable=0.1)`` builds what a new user
loads from the Alibaba CSV format: nodes of a few kinds (a fifth with 2-8 GPUs),
single-replica jobs drawn from ``shapes`` request shapes, and about
``unplaceable`` of the pods asking for more GPUs than any node has, so they stay
pending for good and every pass must say why. ``write_csv`` writes the pair as
Alibaba node and pod lists for ``forge node add --file`` / ``forge job run``.
Seeded: the same arguments give the same cluster on any machine.
"""

from __future__ import annotations

import csv
import random
from dataclasses import dataclass
from pathlib import Path

from forge.core.models import (
    GpuDevice,
    GpuRequest,
    Job,
    Node,
    Resources,
    ScalingPolicy,
    Task,
    TaskGroup,
)

__all__ = ["PendingWorkload", "gpu_exhausted", "pending_heavy", "write_csv"]

_NODE_KINDS = (  # (cpu, memory MiB, gpus, model), weight
    ((32_000, 131_072, 0, ""), 4),
    ((64_000, 262_144, 0, ""), 4),
    ((96_000, 393_216, 0, ""), 2),
    ((64_000, 262_144, 2, "T4"), 1),
    ((96_000, 786_432, 8, "A100"), 1),
)
MAX_NODE_GPUS = 8


@dataclass(frozen=True, slots=True)
class PendingWorkload:
    nodes: list[Node]
    jobs: list[Job]
    shapes: int
    unplaceable: int  # jobs that no node can ever take


def pending_heavy(
    nodes: int,
    pods: int,
    *,
    shapes: int = 30,
    unplaceable: float = 0.1,
    replicas: int = 1,
    seed: int = 0,
) -> PendingWorkload:
    """``pods`` jobs of ``replicas`` replicas each (the Alibaba format has 1)."""
    rng = random.Random(f"forge-pending/{nodes}x{pods}/{shapes}/{unplaceable}/{seed}")
    kinds = [k for k, _ in _NODE_KINDS]
    weights = [w for _, w in _NODE_KINDS]
    node_list = []
    for i in range(nodes):
        cpu, mem, count, model = rng.choices(kinds, weights)[0]
        node_list.append(
            Node(
                id=f"node-{i:05d}",
                cpu=cpu,
                memory=mem,
                gpus=tuple(
                    GpuDevice(id=f"gpu{d}", model=model, memory=16_384) for d in range(count)
                ),
            )
        )
    # request shapes: a few impossible (more GPUs than any node), a quarter of the
    # rest wanting 1, 2 or 4 GPUs, the others CPU-only
    impossible = max(1, shapes // 10) if unplaceable > 0 else 0
    gpu_shapes = max(1, (shapes - impossible) // 4)
    groups: list[TaskGroup] = []
    for s in range(shapes):
        if s < impossible:
            gpu = MAX_NODE_GPUS * 2 + s
        elif s < impossible + gpu_shapes:
            gpu = (1, 2, 4)[s % 3]
        else:
            gpu = 0
        cpu = rng.choice((250, 500, 1_000, 2_000, 4_000)) + 10 * (s % 37)
        mem = cpu * rng.choice((1, 2, 4)) + s  # distinct shapes
        task = Task(
            name="main",
            resources=Resources(cpu=cpu, memory=mem, gpu=GpuRequest(count=gpu)),
        )
        groups.append(
            TaskGroup(
                name="main",
                tasks=(task,),
                scaling=ScalingPolicy(min=0, max=replicas, desired=replicas),
            )
        )
    # GPU pods sized to ~85% of the devices, so what can fit mostly does
    devices = sum(len(n.gpus) for n in node_list)
    asked = sum(groups[s].request().gpu for s in range(impossible, impossible + gpu_shapes))
    mean_gpu = asked / gpu_shapes
    gpu_share = min(0.3, 0.85 * devices / max(1.0, pods * replicas * (1 - unplaceable) * mean_gpu))
    jobs = []
    bad = 0
    for i in range(pods):
        if impossible and rng.random() < unplaceable:
            g = groups[rng.randrange(impossible)]
            bad += 1
        elif rng.random() < gpu_share:
            g = groups[rng.randrange(impossible, impossible + gpu_shapes)]
        else:
            g = groups[rng.randrange(impossible + gpu_shapes, shapes)]
        jobs.append(Job(id=f"pod-{i:06d}", name=f"pod-{i:06d}", priority=50, groups=(g,)))
    return PendingWorkload(node_list, jobs, shapes, bad)


_GPU_MODELS = ("T4", "V100M32", "A100")


def gpu_exhausted(nodes: int, pods: int, *, shapes: int = 30, seed: int = 0) -> PendingWorkload:
    """The shape a user reported the loop stuck on: a quarter of the nodes with 1-8
    GPUs of three models, ~15% of the single-replica pods asking 1-4 GPUs (a third
    of those pinned to one model, as the trace's ``gpu_spec``), so GPU capacity runs
    out and thousands of pods stay pending with per-model reasons; the rest are
    CPU-only shapes that mostly fit. ``unplaceable`` counts the pods that ask more
    GPUs than any node of an allowed model has (few: most pending ones could fit an
    empty node, which is what makes them expensive to diagnose)."""
    rng = random.Random(f"forge-gpu-exhausted/{nodes}x{pods}/{shapes}/{seed}")
    node_list = []
    most: dict[str, int] = {}
    for i in range(nodes):
        cpu = rng.choice((32_000, 64_000, 96_000))
        mem = cpu * rng.choice((2, 4))
        count, model = 0, ""
        if rng.random() < 0.25:
            count, model = rng.randint(1, 8), rng.choice(_GPU_MODELS)
            most[model] = max(most.get(model, 0), count)
        node_list.append(
            Node(
                id=f"node-{i:05d}",
                cpu=cpu,
                memory=mem,
                gpus=tuple(
                    GpuDevice(id=f"gpu{d}", model=model, memory=16_384) for d in range(count)
                ),
                labels={"gpu-model": model} if count else {},
            )
        )
    gpu_shapes = max(3, shapes // 5)
    groups: list[TaskGroup] = []
    for s in range(shapes):
        gpu = (1, 2, 4, 1, 2)[s % 5] if s < gpu_shapes else 0
        models: tuple[str, ...] = ()
        if gpu and s % 3 == 0:
            models = (_GPU_MODELS[(s // 3) % len(_GPU_MODELS)],)
        cpu = rng.choice((250, 500, 1_000, 2_000, 4_000)) + 10 * (s % 37)
        mem = cpu * rng.choice((1, 2, 4)) + s
        task = Task(
            name="main",
            resources=Resources(cpu=cpu, memory=mem, gpu=GpuRequest(count=gpu, models=models)),
        )
        groups.append(
            TaskGroup(name="main", tasks=(task,), scaling=ScalingPolicy(min=0, max=1, desired=1))
        )
    jobs = []
    bad = 0
    for i in range(pods):
        if rng.random() < 0.15:
            g = groups[rng.randrange(gpu_shapes)]
            r = g.request()
            bad += all(most.get(m, 0) < r.gpu for m in (r.gpu_models or _GPU_MODELS))
        else:
            g = groups[rng.randrange(gpu_shapes, shapes)]
        jobs.append(Job(id=f"pod-{i:06d}", name=f"pod-{i:06d}", priority=50, groups=(g,)))
    return PendingWorkload(node_list, jobs, shapes, bad)


def write_csv(w: PendingWorkload, directory: Path) -> tuple[Path, Path]:
    """The workload as Alibaba node and pod lists (``forge node add --file``)."""
    directory.mkdir(parents=True, exist_ok=True)
    nodes_csv, pods_csv = directory / "nodes.csv", directory / "pods.csv"
    with nodes_csv.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["sn", "cpu_milli", "memory_mib", "gpu", "model"])
        for n in w.nodes:
            out.writerow([n.id, n.cpu, n.memory, len(n.gpus), n.gpus[0].model if n.gpus else ""])
    with pods_csv.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec"])
        for j in w.jobs:
            r = j.groups[0].request()
            spec = "|".join(r.gpu_models)
            out.writerow([j.id, r.cpu, r.memory, r.gpu, 1000 if r.gpu else 0, spec])
    return nodes_csv, pods_csv
