"""Deterministic synthetic clusters for the placement benchmark.

``synthetic(nodes, replicas, seed)`` builds a heterogeneous cluster (CPU nodes of
six sizes, GPU nodes of three kinds) and jobs whose groups ask for varied shapes,
from one seeded ``random.Random``: the same arguments give the same workload on
any machine.

The workload is meant to be hard to pack, not trivially fitting:

* group sizes vary (1 .. 2 x mean), so some equivalence classes are big and many
  are small; about a third of the groups have an odd, one-off cpu/memory shape;
* about 12% of the groups want GPUs (1, 2, 4 or 8 devices, some with a minimum
  device memory that only some GPU models have);
* the requests are scaled so that total demand is ``CPU_TARGET`` of the cluster's
  cpu and ``MEM_TARGET`` of its memory, and the GPU nodes are chosen so that GPU
  demand is about ``GPU_TARGET`` of the devices: packing quality decides how many
  nodes stay empty and whether the big replicas still find a hole.

There are no label constraints and no GPU model constraints: the original
scheduler (``bench.original``) has no model constraints, and both sides of the
comparison must solve the same problem.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TypeVar

from forge.core.models import (
    GpuDevice,
    GpuRequest,
    Job,
    Node,
    Request,
    Resources,
    ScalingPolicy,
    Task,
    TaskGroup,
)

__all__ = [
    "CPU_TARGET",
    "GPU_TARGET",
    "MEM_TARGET",
    "Workload",
    "gpu_mix",
    "replicas_per_job",
    "requests_in_order",
    "synthetic",
]

CPU_TARGET = 0.80
MEM_TARGET = 0.75
GPU_TARGET = 0.85

_T = TypeVar("_T")
# Every table is (value, weight) rows, drawn with rng.choices.
# CPU nodes: (cpu millicores, memory MiB)
_CPU_NODES: tuple[tuple[tuple[int, int], float], ...] = (
    ((8_000, 32_768), 2),
    ((16_000, 65_536), 3),
    ((32_000, 131_072), 3),
    ((32_000, 262_144), 1),  # high-memory
    ((64_000, 262_144), 2),
    ((96_000, 393_216), 1),
)
# GPU nodes: (cpu, memory, gpu count, gpu model, device memory MiB)
_GPU_NODES: tuple[tuple[tuple[int, int, int, str, int], float], ...] = (
    ((32_000, 196_608, 4, "T4", 16_384), 3),
    ((48_000, 393_216, 8, "V100M32", 32_768), 2),
    ((96_000, 786_432, 8, "A100", 81_920), 1),
)
# replica cpu (millicores) and memory per core (MiB)
_CPU_SHAPES: tuple[tuple[int, float], ...] = (
    (250, 2),
    (500, 3),
    (1_000, 4),
    (2_000, 4),
    (4_000, 3),
    (8_000, 1),
)
_MEM_PER_CORE: tuple[tuple[int, float], ...] = ((1_024, 2), (2_048, 3), (4_096, 3), (8_192, 1))
# GPU replicas: devices, and device memory wanted (0 = any)
_GPU_COUNTS: tuple[tuple[int, float], ...] = ((1, 14), (2, 4), (4, 1.5), (8, 0.5))
_GPU_MEMORY: tuple[tuple[int, float], ...] = ((0, 6), (16_384, 2), (32_768, 1), (65_536, 0.3))
_GPU_SHARE = 0.12
_ODD_SHARE = 0.3
_PRIORITIES: tuple[tuple[int, float], ...] = ((50, 8), (80, 1), (20, 1))


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    nodes: list[Node]
    jobs: list[Job]
    demand: dict[str, float]  # fraction of capacity asked for: cpu, memory, gpu

    @property
    def replicas(self) -> int:
        return sum(g.scaling.desired for j in self.jobs for g in j.groups)


def replicas_per_job(replicas: int) -> int:
    """Mean group size: 10 up to 10,000 replicas (1,000 jobs x 10), then 25
    (50,000 replicas = 2,000 jobs x 25)."""
    return 10 if replicas <= 10_000 else 25


def _pick(rng: random.Random, table: tuple[tuple[_T, float], ...]) -> _T:
    return rng.choices(table, weights=[w for _, w in table], k=1)[0][0]


def _group_sizes(rng: random.Random, jobs: int, total: int) -> list[int]:
    mean = total / jobs
    sizes = [rng.randint(1, max(1, round(2 * mean) - 1)) for _ in range(jobs)]
    diff = total - sum(sizes)
    while diff:  # nudge random groups until the total is exact (sizes stay >= 1)
        i = rng.randrange(jobs)
        if diff > 0:
            sizes[i] += 1
            diff -= 1
        elif sizes[i] > 1:
            sizes[i] -= 1
            diff += 1
    return sizes


@dataclass(slots=True)
class _Shape:
    cpu: float
    memory: float
    gpu: int
    gpu_memory: int


def synthetic(nodes: int, replicas: int, *, seed: int = 0) -> Workload:
    """A cluster of ``nodes`` nodes and jobs asking for exactly ``replicas`` replicas."""
    if nodes < 2 or replicas < 1:
        raise ValueError("need at least 2 nodes and 1 replica")
    rng = random.Random(f"forge-bench/{nodes}x{replicas}/{seed}")
    njobs = max(1, replicas // replicas_per_job(replicas))
    sizes = _group_sizes(rng, njobs, replicas)

    # 1. shapes (unscaled)
    shapes: list[_Shape] = []
    for _ in range(njobs):
        if rng.random() < _GPU_SHARE:
            count = _pick(rng, _GPU_COUNTS)
            gmem = _pick(rng, _GPU_MEMORY)
            per_cpu, per_mem = (
                rng.choice((2_000, 4_000, 6_000)),
                rng.choice((8_192, 16_384, 32_768)),
            )
            shapes.append(_Shape(count * per_cpu, count * per_mem, count, gmem))
            continue
        cpu: int
        mem: float
        if rng.random() < _ODD_SHARE:
            cpu = rng.randint(1, 60) * 100
            mem = cpu * rng.uniform(0.5, 8.0)
        else:
            cpu = _pick(rng, _CPU_SHAPES)
            mem = cpu * _pick(rng, _MEM_PER_CORE) / 1_000
        shapes.append(_Shape(cpu, mem, 0, 0))

    # 2. GPU nodes enough for the GPU demand at GPU_TARGET, each kind able to host
    # at least some of the GPU groups; then CPU nodes for the rest
    gpu_demand = sum(s.gpu * n for s, n in zip(shapes, sizes, strict=True))
    built: list[tuple[int, int, int, str, int]] = []
    gpu_capacity = 0
    while gpu_capacity * GPU_TARGET < gpu_demand and len(built) < nodes * 3 // 5:
        kind = _pick(rng, _GPU_NODES)
        built.append(kind)
        gpu_capacity += kind[2]
    while len(built) < nodes:
        cpu, mem = _pick(rng, _CPU_NODES)
        built.append((cpu, mem, 0, "", 0))
    rng.shuffle(built)
    node_list = [
        Node(
            id=f"node-{i:05d}",
            cpu=cpu,
            memory=mem,
            gpus=tuple(GpuDevice(id=f"gpu{d}", model=model, memory=dmem) for d in range(count)),
            labels={"zone": f"z{i % 3}"},
        )
        for i, (cpu, mem, count, model, dmem) in enumerate(built)
    ]
    cpu_cap = sum(n.cpu for n in node_list)
    mem_cap = sum(n.memory for n in node_list)

    # 3. scale cpu and memory so that demand hits the targets; a replica never asks
    # for more than the largest node of its kind can give
    pairs = list(zip(shapes, sizes, strict=True))
    fixed_cpu = sum(s.cpu * n for s, n in pairs if s.gpu)
    fixed_mem = sum(s.memory * n for s, n in pairs if s.gpu)
    cpu_demand = sum(s.cpu * n for s, n in pairs if not s.gpu) or 1.0
    mem_demand = sum(s.memory * n for s, n in pairs if not s.gpu) or 1.0
    kc = max(0.1, (CPU_TARGET * cpu_cap - fixed_cpu) / cpu_demand)
    km = max(0.1, (MEM_TARGET * mem_cap - fixed_mem) / mem_demand)
    max_cpu = max(c for (c, _), _ in _CPU_NODES) // 2
    max_mem = max(m for (_, m), _ in _CPU_NODES) // 2
    jobs: list[Job] = []
    for i, (shape, size) in enumerate(pairs):
        if shape.gpu:  # GPU replicas keep their per-device shape (they must fit GPU nodes)
            cpu, mem = int(shape.cpu), int(shape.memory)
        else:
            cpu = min(max_cpu, max(50, round(shape.cpu * kc / 50) * 50))
            mem = min(max_mem, max(64, round(shape.memory * km / 64) * 64))
        task = Task(
            name="main",
            resources=Resources(
                cpu=cpu,
                memory=mem,
                gpu=GpuRequest(count=shape.gpu, memory=shape.gpu_memory),
            ),
        )
        group = TaskGroup(
            name="main",
            tasks=(task,),
            scaling=ScalingPolicy(min=0, max=max(size, 1), desired=size),
        )
        priority = _pick(rng, _PRIORITIES)
        jobs.append(Job(id=f"job-{i:05d}", name=f"job-{i:05d}", priority=priority, groups=(group,)))

    total = [0, 0, 0]
    for job in jobs:
        for g in job.groups:
            r = g.request()
            total[0] += r.cpu * g.scaling.desired
            total[1] += r.memory * g.scaling.desired
            total[2] += r.gpu * g.scaling.desired
    gpus = sum(len(n.gpus) for n in node_list)
    demand = {
        "cpu": total[0] / cpu_cap,
        "memory": total[1] / mem_cap,
        "gpu": total[2] / gpus if gpus else 0.0,
    }
    return Workload(f"{nodes}x{replicas}", node_list, jobs, demand)


def requests_in_order(jobs: list[Job]) -> list[tuple[str, Request]]:
    """Every replica as (workload id, request), in the order ``forge.core.reconcile``
    places them: priority (high first), job id, group order, ordinal."""
    out: list[tuple[str, Request]] = []
    for job in sorted(jobs, key=lambda j: (-j.priority, j.id)):
        for g in job.groups:
            req = g.request()
            for ordinal in range(g.scaling.desired):
                out.append((f"{job.id}/{g.name}/{ordinal}", req))
    return out


# GPU nodes of the mixed cluster: (cpu, memory MiB, gpu count, model, device memory)
_MIX_GPU_NODES: tuple[tuple[tuple[int, int, int, str, int], float], ...] = (
    ((16_000, 65_536, 1, "T4", 16_384), 1),
    ((16_000, 65_536, 2, "H100", 81_920), 2),
    ((32_000, 131_072, 4, "A100", 40_960), 2),
    ((64_000, 262_144, 4, "V100M32", 32_768), 1),
    ((64_000, 524_288, 8, "A100", 81_920), 4),
    ((96_000, 786_432, 8, "H100", 81_920), 3),
)
_MIX_GPU_COUNTS: tuple[tuple[int, float], ...] = ((1, 16), (2, 3), (4, 1))


def gpu_mix(nodes: int, pods: int, *, seed: int = 0) -> Workload:
    """The issue's mixed cluster: a quarter of the nodes with 1-8 GPUs, 30% of the
    pods wanting 1-4 GPUs (2-8 cores and 8-32 GiB per GPU; more GPUs asked than
    there are, so all GPUs can be used in the end), the rest CPU-only pods of
    0.25-8 cores. One pod is one job of one replica, priorities mixed, so the pass
    interleaves GPU and CPU work as a real queue would.
    """
    rng = random.Random(f"forge-gpu-mix/{nodes}x{pods}/{seed}")
    built: list[tuple[int, int, int, str, int]] = []
    for i in range(nodes):
        if i % 4 == 0:
            built.append(_pick(rng, _MIX_GPU_NODES))
        else:
            cpu, mem = _pick(rng, _CPU_NODES)
            built.append((cpu, mem, 0, "", 0))
    rng.shuffle(built)
    node_list = [
        Node(
            id=f"node-{i:05d}",
            cpu=cpu,
            memory=mem,
            gpus=tuple(GpuDevice(id=f"gpu{d}", model=model, memory=dmem) for d in range(count)),
        )
        for i, (cpu, mem, count, model, dmem) in enumerate(built)
    ]
    devices = sum(len(n.gpus) for n in node_list)
    n_gpu_pods = round(pods * 0.3)
    counts = [_pick(rng, _MIX_GPU_COUNTS) for _ in range(n_gpu_pods)]
    jobs: list[Job] = []
    kinds = [True] * n_gpu_pods + [False] * (pods - n_gpu_pods)
    rng.shuffle(kinds)
    gi = 0
    for i, is_gpu in enumerate(kinds):
        if is_gpu:
            count = counts[gi]
            gi += 1
            cpu = count * rng.choice((2_000, 4_000, 6_000, 8_000))
            mem = count * rng.choice((8_192, 16_384, 32_768))
        else:
            count = 0
            cpu = _pick(rng, _CPU_SHAPES)
            mem = cpu * _pick(rng, _MEM_PER_CORE) // 1_000
        task = Task(
            name="main",
            resources=Resources(cpu=cpu, memory=mem, gpu=GpuRequest(count=count)),
        )
        group = TaskGroup(
            name="main", tasks=(task,), scaling=ScalingPolicy(min=0, max=1, desired=1)
        )
        jobs.append(
            Job(
                id=f"pod-{i:05d}",
                name=f"pod-{i:05d}",
                priority=_pick(rng, _PRIORITIES),
                groups=(group,),
            )
        )
    total = [0, 0, 0]
    for job in jobs:
        r = job.groups[0].request()
        total[0] += r.cpu
        total[1] += r.memory
        total[2] += r.gpu
    demand = {
        "cpu": total[0] / sum(n.cpu for n in node_list),
        "memory": total[1] / sum(n.memory for n in node_list),
        "gpu": total[2] / devices if devices else 0.0,
    }
    return Workload(f"gpu-mix {nodes}x{pods}", node_list, jobs, demand)
