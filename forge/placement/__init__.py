"""Placement: where does a replica go, and if nowhere, why not.

Pure and deterministic: filters say why a node is rejected, scorers say how good
a feasible node is, the selector bounds the work per replica without losing
completeness. The reconcile pass decides *what* to place; this package decides
*where*.
"""

from forge.placement.filters import (
    DEFAULT_FILTERS,
    Filter,
    diagnose,
    explain_node,
    format_reasons,
)
from forge.placement.scorers import (
    ALGORITHMS,
    BinPack,
    GpuPreserve,
    Scorer,
    Spread,
    Weighted,
    combined,
    scorers_for,
    utilisation_after,
)
from forge.placement.select import DEFAULT_CANDIDATES, Choice, Placer
from forge.placement.state import Binding, Cluster, NodeAlloc

__all__ = [
    "ALGORITHMS",
    "DEFAULT_CANDIDATES",
    "DEFAULT_FILTERS",
    "BinPack",
    "Binding",
    "Choice",
    "Cluster",
    "Filter",
    "GpuPreserve",
    "NodeAlloc",
    "Placer",
    "Scorer",
    "Spread",
    "Weighted",
    "combined",
    "diagnose",
    "explain_node",
    "format_reasons",
    "scorers_for",
    "utilisation_after",
]
