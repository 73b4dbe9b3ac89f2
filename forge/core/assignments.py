"""Bindings as the store and the wire hold them: a replica on a node (with its
exact GPU devices), and a replica still waiting, with why."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Self

from pydantic import Field, model_validator

from forge.core.fields import Evolving, Float, Int, IntAsStr, Model
from forge.core.limits import GPU_MILLI

__all__ = ["Assignment", "AssignmentStatus", "Pending", "workload_id"]


class AssignmentStatus(StrEnum):
    PENDING = "pending"  # bound to a node, not yet reported running
    RUNNING = "running"
    FAILED = "failed"


def workload_id(job: str, group: str, ordinal: int) -> str:
    return f"{job}/{group}/{ordinal}"


class Assignment(Evolving):
    """One replica bound to one node (and, for GPU work, to exact device ids)."""

    _new_fields = ("gpu_milli", "version")

    workload_id: str
    job: str
    group: str
    ordinal: Int = Field(ge=0)
    node: str
    gpu_ids: tuple[Annotated[str, IntAsStr], ...] = ()  # a store row's 0 is "0"
    cpu: Int
    memory: Int
    status: AssignmentStatus = AssignmentStatus.PENDING
    #: The share of its one device a shared replica holds (1..999); 0 = whole devices.
    gpu_milli: Int = Field(default=0, ge=0, lt=GPU_MILLI)
    #: The group version (TaskGroup.version) the replica runs; "" = bound before
    #: versions existed.
    version: Annotated[str, Field(max_length=64)] = ""

    @model_validator(mode="after")
    def _id_matches(self) -> Self:
        if self.workload_id != workload_id(self.job, self.group, self.ordinal):
            raise ValueError(f"workload_id {self.workload_id!r} does not match job/group/ordinal")
        return self


class Pending(Model):
    """A desired replica that is not bound, and why."""

    workload_id: str
    reasons: tuple[str, ...]
    attempts: Int = 0
    not_before: Float = 0.0
