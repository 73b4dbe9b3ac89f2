"""Placement: where does a replica go, and if nowhere, why not.

Pure and deterministic: one fit kernel and one score kernel (``kernel``), filters
that say why a node is rejected as data (``diagnosis``; text only in ``reasons``),
scorers that say how good a feasible node is, and a selector that bounds the work
per replica without losing completeness. The reconcile pass decides *what* to
place; this package decides *where*.
"""

from forge.core.placement.diagnosis import Diagnosis, Rejection, Rule
from forge.core.placement.filters import DEFAULT_FILTERS, Filter, diagnose, explain_node
from forge.core.placement.fragmentation import Fgd, TypicalTask, fragmentation, typical_tasks
from forge.core.placement.kernel import default_score, fits
from forge.core.placement.reasons import (
    cause_text,
    diagnosis_text,
    read_diagnosis,
    rejection_text,
)
from forge.core.placement.scorers import (
    ALGORITHMS,
    BinPack,
    Scorer,
    Spread,
    Weighted,
    combined,
    scorers_for,
    utilisation_after,
)
from forge.core.placement.select import DEFAULT_CANDIDATES, Choice, Placer
from forge.core.placement.state import Binding, Cluster, NodeAlloc
from forge.core.placement.topology import DistinctHostsFilter, SpreadFilter, Topology

__all__ = [
    "ALGORITHMS",
    "DEFAULT_CANDIDATES",
    "DEFAULT_FILTERS",
    "BinPack",
    "Binding",
    "Choice",
    "Cluster",
    "Diagnosis",
    "DistinctHostsFilter",
    "Fgd",
    "Filter",
    "NodeAlloc",
    "Placer",
    "Rejection",
    "Rule",
    "Scorer",
    "Spread",
    "SpreadFilter",
    "Topology",
    "TypicalTask",
    "Weighted",
    "cause_text",
    "combined",
    "default_score",
    "diagnose",
    "diagnosis_text",
    "explain_node",
    "fits",
    "fragmentation",
    "read_diagnosis",
    "rejection_text",
    "scorers_for",
    "typical_tasks",
    "utilisation_after",
]
