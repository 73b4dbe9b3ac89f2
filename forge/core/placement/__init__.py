"""Placement: where does a replica go, and if nowhere, why not.

Pure and deterministic: filters say why a node is rejected, scorers say how good
a feasible node is, the selector bounds the work per replica without losing
completeness. The reconcile pass decides *what* to place; this package decides
*where*.
"""

from forge.core.placement.filters import (
    DEFAULT_FILTERS,
    Filter,
    diagnose,
    explain_node,
    format_reasons,
    reason_category,
)
from forge.core.placement.fragmentation import Fgd, TypicalTask, fragmentation, typical_tasks
from forge.core.placement.scorers import (
    ALGORITHMS,
    BinPack,
    GpuPreserve,
    PackUsed,
    Scorer,
    Spread,
    Weighted,
    combined,
    scorers_for,
    utilisation_after,
)
from forge.core.placement.select import DEFAULT_CANDIDATES, Choice, Placer
from forge.core.placement.state import Binding, Cluster, NodeAlloc

__all__ = [
    "ALGORITHMS",
    "DEFAULT_CANDIDATES",
    "DEFAULT_FILTERS",
    "BinPack",
    "Binding",
    "Choice",
    "Cluster",
    "Fgd",
    "Filter",
    "GpuPreserve",
    "NodeAlloc",
    "PackUsed",
    "Placer",
    "Scorer",
    "Spread",
    "TypicalTask",
    "Weighted",
    "combined",
    "diagnose",
    "explain_node",
    "format_reasons",
    "fragmentation",
    "reason_category",
    "scorers_for",
    "typical_tasks",
    "utilisation_after",
]
