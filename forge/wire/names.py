"""The cluster workflow's id, in a module of its own: readers that need only the name
(``forge status``) get it without loading the contract's models.
:mod:`forge.wire.contract` re-exports it."""

from __future__ import annotations

__all__ = ["workflow_id"]


def workflow_id(cluster: str) -> str:
    """The id of cluster ``cluster``'s workflow: one per cluster."""
    return f"forge-cluster-{cluster}"
