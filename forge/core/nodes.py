"""Nodes: capacity, GPU devices, labels, taints and state, and the tolerations
that let a group's replicas past a taint."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal, Self

from pydantic import Field, model_validator

from forge.core.fields import Cpu, Evolving, Id, Memory, Model, Name, ShortStr, no_control
from forge.core.limits import MAX_GPUS, MAX_LABELS, MAX_TAINTS

__all__ = ["GpuDevice", "Node", "NodeState", "Taint", "Toleration", "tolerated"]


class Taint(Model):
    """A Kubernetes-style ``NoSchedule`` taint: only replicas whose group tolerates
    it are placed on the node (a hard pool, e.g. ``{key: gpu, value: "true"}``).
    Replicas already bound stay (``NoSchedule`` does not evict)."""

    key: Annotated[str, Field(min_length=1, max_length=253)]
    value: Annotated[str, Field(max_length=253)] = ""
    effect: Literal["NoSchedule"] = "NoSchedule"


class Toleration(Model):
    """Lets a group's replicas onto nodes with a matching taint (``Equal``: same key
    and value; ``Exists``: any value of the key, or every taint when key is empty)."""

    key: Annotated[str, Field(max_length=253)] = ""
    operator: Literal["Equal", "Exists"] = "Equal"
    value: Annotated[str, Field(max_length=253)] = ""

    @model_validator(mode="after")
    def _shape(self) -> Self:
        if self.operator == "Equal" and not self.key:
            raise ValueError("operator Equal needs a key")
        if self.operator == "Exists" and self.value:
            raise ValueError("operator Exists takes no value")
        return self

    def tolerates(self, taint: Taint) -> bool:
        if self.operator == "Exists":
            return not self.key or self.key == taint.key
        return self.key == taint.key and self.value == taint.value


def tolerated(taints: tuple[Taint, ...], tolerations: tuple[Toleration, ...]) -> Taint | None:
    """The first taint no toleration matches, None when all are tolerated."""
    for t in taints:
        if not any(tol.tolerates(t) for tol in tolerations):
            return t
    return None


class GpuDevice(Model):
    id: Id  # an integer (nvidia-smi's index) is read as its decimal string
    model: Name
    memory: Memory


class NodeState(StrEnum):
    READY = "ready"
    DRAINING = "draining"
    LOST = "lost"


class Node(Evolving):
    _new_fields = ("taints",)

    id: Id
    cpu: Cpu
    memory: Memory
    gpus: tuple[GpuDevice, ...] = Field(default=(), max_length=MAX_GPUS)
    labels: dict[Annotated[str, Field(min_length=1, max_length=253)], ShortStr] = Field(
        default_factory=dict, max_length=MAX_LABELS
    )
    taints: tuple[Taint, ...] = Field(default=(), max_length=MAX_TAINTS)
    state: NodeState = NodeState.READY

    @model_validator(mode="after")
    def _unique_gpu_ids(self) -> Self:
        ids = [g.id for g in self.gpus]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise ValueError(f"duplicate gpu ids: {', '.join(dupes)}")
        for k, v in self.labels.items():
            no_control(k, "label name")
            no_control(v, "label value")
        return self
