"""The shapes tests build their inputs from: nodes, task groups and jobs.

One definition each, so that suites agree on what "a node" is (4 cpu cores, 4 GiB,
ready, A100s of 40 GiB when it has GPUs) and a change to a model's required fields
is made once. Defaults are the small cluster the reconcile scenarios use; every
field a test cares about is a parameter. Suites with a deliberately different
shape (the workflow harness's JSON specs, the GPU traces' H100 nodes, the original
scheduler's nodes) keep their own.
"""

from __future__ import annotations

from forge.core.models import (
    Constraint,
    GpuDevice,
    GpuRequest,
    Job,
    Node,
    NodeState,
    ReschedulePolicy,
    Resources,
    ScalingPolicy,
    Task,
    TaskGroup,
)

__all__ = ["group", "job", "job_with_env", "node"]


def node(
    nid: str,
    cpu: int = 4000,
    memory: int = 4096,
    *,
    gpus: int = 0,
    model: str = "A100",
    gpu_memory: int = 40960,
    labels: dict[str, str] | None = None,
    state: NodeState = NodeState.READY,
) -> Node:
    """A node (GPU devices ``gpu0`` ... of one model and memory)."""
    return Node(
        id=nid,
        cpu=cpu,
        memory=memory,
        gpus=tuple(GpuDevice(id=f"gpu{i}", model=model, memory=gpu_memory) for i in range(gpus)),
        labels=labels or {},
        state=state,
    )


def group(
    name: str = "g",
    desired: int = 1,
    cpu: int = 1000,
    memory: int = 1024,
    *,
    gpu: int = 0,
    gpu_memory: int = 0,
    models: tuple[str, ...] = (),
    constraints: tuple[Constraint, ...] = (),
    reschedule: ReschedulePolicy | None = None,
) -> TaskGroup:
    """A group of one task ``t`` (scaling 0..max(desired, 1))."""
    res = Resources(
        cpu=cpu, memory=memory, gpu=GpuRequest(count=gpu, memory=gpu_memory, models=models)
    )
    return TaskGroup(
        name=name,
        tasks=(Task(name="t", resources=res),),
        scaling=ScalingPolicy(min=0, max=max(desired, 1), desired=desired),
        constraints=constraints,
        reschedule=reschedule or ReschedulePolicy(),
    )


def job(jid: str, *groups: TaskGroup, priority: int = 50) -> Job:
    """A job of ``groups`` (one default group when none is given)."""
    return Job(id=jid, name=jid, priority=priority, groups=groups or (group(),))


def job_with_env(name: str, env: dict[str, str], cpu: int = 500) -> Job:
    """A job (no id: the client gives one) of one group ``main`` whose task ``app``
    runs with ``env``: what a test looks for in history, logs or the store."""
    return Job.model_validate(
        {
            "name": name,
            "groups": [
                {
                    "name": "main",
                    "tasks": [
                        {
                            "name": "app",
                            "command": ["run"],
                            "env": env,
                            "resources": {"cpu": cpu, "memory": 256},
                        }
                    ],
                }
            ],
        }
    )
