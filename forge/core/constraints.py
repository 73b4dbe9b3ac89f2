"""Where a group may go: label constraints and spread rules.

The two placement rules a task group states about nodes, apart from the jobs they
belong to: :class:`Constraint` filters nodes by label (Nomad's ``constraint``),
:class:`SpreadRule` spreads replicas over a label's values (Kubernetes'
``topologySpreadConstraints``). Leaves of the model: :mod:`forge.core.placement`
reads them per node, :mod:`forge.core.models` uses them in ``TaskGroup`` and
re-exports them.
"""

from __future__ import annotations

from typing import Annotated, Literal, Self

from pydantic import Field, model_validator

from forge.core.fields import Int, Model, ShortStr
from forge.core.limits import MAX_REPLICAS

__all__ = ["Constraint", "SpreadRule"]


class Constraint(Model):
    """A filter on node labels, e.g. ``{label: zone, op: in, values: [a, b]}``."""

    label: Annotated[str, Field(min_length=1, max_length=253)]
    op: Literal["=", "!=", "in", "not_in", "exists", "not_exists"] = "="
    values: tuple[ShortStr, ...] = Field(default=(), max_length=64)

    @model_validator(mode="after")
    def _arity(self) -> Self:
        if self.op in ("=", "!=") and len(self.values) != 1:
            raise ValueError(f"op {self.op!r} takes exactly one value")
        if self.op in ("in", "not_in") and not self.values:
            raise ValueError(f"op {self.op!r} takes at least one value")
        if self.op in ("exists", "not_exists") and self.values:
            raise ValueError(f"op {self.op!r} takes no values")
        return self

    def matches(self, labels: dict[str, str]) -> bool:
        value = labels.get(self.label)
        if self.op == "exists":
            return value is not None
        if self.op == "not_exists":
            return value is None
        if self.op in ("=", "in"):
            return value is not None and value in self.values
        return value is None or value not in self.values


class SpreadRule(Model):
    """Spread a group's replicas over the values of a node label (Kubernetes'
    topologySpreadConstraints): the group's replica count per value differs by at
    most ``max_skew`` among the values the group's eligible nodes carry.
    ``do_not_schedule``: a replica waits rather than break it, and a node without
    the label cannot hold one; ``schedule_anyway``: a preference, not a rule."""

    label: Annotated[str, Field(min_length=1, max_length=253)]
    max_skew: Int = Field(default=1, ge=1, le=MAX_REPLICAS)
    when_unsatisfiable: Literal["do_not_schedule", "schedule_anyway"] = "do_not_schedule"

    @property
    def hard(self) -> bool:
        return self.when_unsatisfiable == "do_not_schedule"
