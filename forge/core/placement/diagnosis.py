"""Why a node rejects a replica, and why no node took it, as data.

Nomad's AllocMetric and Kubernetes' ``InsufficientResource`` keep a scheduling
failure structured (which dimension, how much was asked, how much was free, how
many nodes each rule rejected) and leave the sentence to whoever shows it. Here a
filter returns a :class:`Rejection`, the selector counts them into a
:class:`Diagnosis`, and :mod:`forge.core.placement.reasons` is the one place
either becomes text.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from forge.core.models import Constraint, Taint

__all__ = ["Diagnosis", "Rejection", "Rule"]


class Rule(StrEnum):
    """The rule that rejected a node; capacity rules name their dimension."""

    STATE = "state"  # the node is not ready (draining, lost)
    CONSTRAINT = "constraint"
    TAINT = "taint"
    GPU_MODEL = "gpu-model"
    GPU_MEMORY = "gpu-memory"
    GPU = "gpu"  # too few free devices
    GPU_SHARE = "gpu-share"  # no device with room for the share
    CPU = "cpu"
    MEMORY = "memory"
    CPU_RESERVED = "cpu-reserved"  # free, but held for the node's free GPUs
    MEMORY_RESERVED = "memory-reserved"
    RESERVED = "reserved"  # cpu or memory held for free GPUs (the selector's tally)
    DISTINCT_HOSTS = "distinct-hosts"  # the node holds a replica of the group
    SPREAD = "spread"  # one more replica there would skew the group past max_skew
    SPREAD_LABEL = "spread-label"  # the node lacks a label the group spreads on


@dataclass(frozen=True, slots=True)
class Rejection:
    """One node's verdict for one request. ``state`` and ``constraint`` say which
    state or constraint (part of what a diagnosis counts by); the rest is per-node
    detail (``asked`` / ``free`` / ``reserved`` in the dimension's unit: millicores,
    MiB, milli-GPU; ``devices``: the matching devices with the most room, as
    ``(id, free milli-GPU)``, and ``more`` of them not listed). ``label``: the
    label of a spread rule (part of the cause)."""

    rule: Rule
    state: str = ""
    constraint: Constraint | None = None
    taint: Taint | None = None
    asked: int = 0
    free: int = 0
    reserved: int = 0
    devices: tuple[tuple[str, int], ...] = ()
    more: int = 0
    label: str = ""  # the label a spread rule names

    @property
    def cause(self) -> Rejection:
        """The rejection without its per-node detail: what nodes are counted by."""
        if not (self.taint or self.asked or self.free or self.reserved or self.devices):
            return self
        return Rejection(self.rule, self.state, self.constraint, label=self.label)


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """Why no node took a replica (Nomad's AllocMetric, Kubernetes' "0/N nodes
    available"): every node counted once, under the cause of the first rule that
    rejected it. ``rejected`` is in the order the causes were first met; the
    formatter orders them for a reader."""

    total: int
    fit: int
    rejected: tuple[tuple[Rejection, int], ...]

    @classmethod
    def of(cls, total: int, fit: int, counts: Mapping[Rejection, int]) -> Diagnosis:
        return cls(total, fit, tuple((r, n) for r, n in counts.items() if n))

    @classmethod
    def count(cls, total: int, verdicts: Iterable[Rejection | None]) -> Diagnosis:
        """Tally per-node verdicts (None: the node fits) by cause."""
        fit = 0
        counts: dict[Rejection, int] = {}
        for v in verdicts:
            if v is None:
                fit += 1
            else:
                cause = v.cause
                counts[cause] = counts.get(cause, 0) + 1
        return cls.of(total, fit, counts)

    def nodes(self, rule: Rule) -> int:
        """How many nodes the rule rejected (over all its causes)."""
        return sum(n for r, n in self.rejected if r.rule is rule)
