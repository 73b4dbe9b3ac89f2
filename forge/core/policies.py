"""A group's policies besides placement: how many replicas (scaling), what to do
when one fails (reschedule) and when to change how many (autoscale)."""

from __future__ import annotations

import math
import re
from enum import StrEnum
from typing import Annotated, Literal, Self

from pydantic import Field, Strict, field_validator, model_validator

from forge.core.fields import Bool, Evolving, Float, Int, Model, Seconds
from forge.core.limits import MAX_REPLICAS

__all__ = [
    "AutoscalePolicy",
    "DelayFunction",
    "DisruptionBudget",
    "ExitCode",
    "ReschedulePolicy",
    "ScalingPolicy",
]


class ScalingPolicy(Evolving):
    _new_fields = ("parallelism", "max_failed")

    min: Int = Field(default=0, ge=0, le=MAX_REPLICAS)
    max: Int = Field(default=1, ge=0, le=MAX_REPLICAS)
    desired: Int = Field(default=1, ge=0, le=MAX_REPLICAS)
    #: batch groups only (forge.core.kinds): how many runs may be bound at once, as a
    #: Kubernetes Job's ``parallelism`` (None: as many as fit); ``desired`` is the runs
    parallelism: Int | None = Field(default=None, ge=1, le=MAX_REPLICAS)
    #: batch groups only: runs that may fail for good (attempts exhausted) without
    #: failing the job; the job completes with the rest (forge.core.kinds.phase)
    max_failed: Int = Field(default=0, ge=0, le=MAX_REPLICAS)

    @model_validator(mode="after")
    def _bounds(self) -> Self:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) must be <= max ({self.max})")
        if not self.min <= self.desired <= self.max:
            raise ValueError(
                f"desired ({self.desired}) must be within [min, max] = [{self.min}, {self.max}]"
            )
        return self


class DisruptionBudget(Model):
    """How many of a group's replicas voluntary disruptions (node drains, rolling
    update waves and preemption, together: forge.core.disruption) may take below
    ``desired`` at once (a Kubernetes PodDisruptionBudget's
    ``maxUnavailable``): a count, or a percentage of ``desired`` rounded up."""

    max_unavailable: Annotated[int, Strict(), Field(ge=0, le=MAX_REPLICAS)] | str

    @field_validator("max_unavailable")
    @classmethod
    def _count_or_percent(cls, value: int | str) -> int | str:
        if isinstance(value, str) and not (
            re.fullmatch(r"\d{1,3}%", value) and int(value[:-1]) <= 100
        ):
            raise ValueError(
                f"max_unavailable must be a count or a percentage 0%..100%, got {value!r}"
            )
        return value

    def allowed(self, desired: int) -> int:
        """Replicas that may be unavailable for a group of ``desired``."""
        value = self.max_unavailable
        if isinstance(value, int):
            return value
        return math.ceil(desired * int(value[:-1]) / 100)


class DelayFunction(StrEnum):
    CONSTANT = "constant"
    EXPONENTIAL = "exponential"
    FIBONACCI = "fibonacci"


#: A process's exit status that can mean failure (0 is success).
ExitCode = Annotated[int, Strict(), Field(ge=1, le=255)]


class ReschedulePolicy(Evolving):
    """What happens to a replica that failed (Nomad's ``reschedule`` block).

    At most ``attempts`` reschedules within ``interval`` seconds (``unlimited``
    lifts the cap); each waits ``delay`` grown by ``delay_function`` up to
    ``max_delay``. A batch group's ``fail_on_exit`` lists the exit statuses that
    no retry can fix (a bad argument, a corrupt input): such an end fails the job
    at once, as a Kubernetes Job's ``podFailurePolicy`` ``FailJob`` rule does.
    """

    _new_fields = ("fail_on_exit",)

    attempts: Int = Field(default=3, ge=0, le=1000)
    interval: Seconds = 3600.0
    delay: Seconds = 15.0
    delay_function: DelayFunction = DelayFunction.EXPONENTIAL
    max_delay: Seconds = 300.0
    unlimited: Bool = False
    fail_on_exit: tuple[ExitCode, ...] = Field(default=(), max_length=64)

    @model_validator(mode="after")
    def _delays(self) -> Self:
        if self.max_delay < self.delay:
            raise ValueError(f"max_delay ({self.max_delay}) must be >= delay ({self.delay})")
        return self


class AutoscalePolicy(Model):
    """How a group scales from utilisation (see ``forge.core.autoscale``).

    ``threshold``: the original's policy (>= ``scale_up`` adds ``step``, <=
    ``scale_down`` removes ``step``, then ``cooldown`` seconds of quiet).
    ``target``: Kubernetes HPA (``ceil(current * util / target)`` with a tolerance
    and a scale-down stabilisation window).
    """

    policy: Literal["threshold", "target"] = "threshold"
    scale_up: Float = Field(default=0.8, gt=0, le=1)
    scale_down: Float = Field(default=0.3, ge=0, lt=1)
    step: Int = Field(default=1, ge=1, le=MAX_REPLICAS)
    cooldown: Seconds = 300.0
    target: Float = Field(default=0.6, gt=0, le=1)
    tolerance: Float = Field(default=0.1, ge=0, lt=1)
    stabilization_window: Seconds = 300.0
    # not ``Seconds = Field(ge=1)``: the annotation's own ``ge=0`` wins over a ``ge``
    # given again, and an interval of 0 would evaluate metrics on every pass
    interval: Annotated[float, Strict(), Field(ge=1, le=365 * 24 * 3600)] = 60.0

    @model_validator(mode="after")
    def _thresholds(self) -> Self:
        if self.scale_down >= self.scale_up:
            raise ValueError(f"scale_down ({self.scale_down}) must be < scale_up ({self.scale_up})")
        return self
