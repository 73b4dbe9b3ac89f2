"""Forge: a durable cluster reconciler.

The public surface, importable from ``forge`` itself::

    from forge import ForgeClient, Job, Node, NotFound

Every name is loaded on first use (PEP 562 ``__getattr__``): ``import forge`` costs
nothing, so ``forge --help`` and ``forge job validate`` never load pydantic or the
Temporal SDK through it. Everything else lives in its module (``forge.core.models``,
``forge.client.client``, ``forge.wire.contract`` ...) and may change; these names
are the ones kept.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from forge.client.client import ForgeClient
    from forge.core.models import (
        Assignment,
        AssignmentStatus,
        GpuDevice,
        GpuRequest,
        Job,
        Node,
        NodeState,
        Resources,
        ScalingPolicy,
        Task,
        TaskGroup,
    )
    from forge.errors import (
        Busy,
        Conflict,
        ForgeError,
        InvalidInput,
        NotFound,
        Unavailable,
    )
    from forge.loaders import InputError, load_jobs, load_nodes
    from forge.settings import Settings
    from forge.wire.contract import Explanation, JobResult, StatusView, Summary

#: Each public name and the module that defines it.
_EXPORTS: dict[str, str] = {
    # the client
    "ForgeClient": "forge.client.client",
    "Settings": "forge.settings",
    # what a cluster is made of
    "Assignment": "forge.core.models",
    "AssignmentStatus": "forge.core.models",
    "GpuDevice": "forge.core.models",
    "GpuRequest": "forge.core.models",
    "Job": "forge.core.models",
    "Node": "forge.core.models",
    "NodeState": "forge.core.models",
    "Resources": "forge.core.models",
    "ScalingPolicy": "forge.core.models",
    "Task": "forge.core.models",
    "TaskGroup": "forge.core.models",
    # files
    "InputError": "forge.loaders",
    "load_jobs": "forge.loaders",
    "load_nodes": "forge.loaders",
    # what the client answers
    "Explanation": "forge.wire.contract",
    "JobResult": "forge.wire.contract",
    "StatusView": "forge.wire.contract",
    "Summary": "forge.wire.contract",
    # what it raises
    "Busy": "forge.errors",
    "Conflict": "forge.errors",
    "ForgeError": "forge.errors",
    "InvalidInput": "forge.errors",
    "NotFound": "forge.errors",
    "Unavailable": "forge.errors",
}

__all__ = [
    "Assignment",
    "AssignmentStatus",
    "Busy",
    "Conflict",
    "Explanation",
    "ForgeClient",
    "ForgeError",
    "GpuDevice",
    "GpuRequest",
    "InputError",
    "InvalidInput",
    "Job",
    "JobResult",
    "Node",
    "NodeState",
    "NotFound",
    "Resources",
    "ScalingPolicy",
    "Settings",
    "StatusView",
    "Summary",
    "Task",
    "TaskGroup",
    "Unavailable",
    "load_jobs",
    "load_nodes",
]


def __getattr__(name: str) -> Any:
    """Load a public name from its module on first use, then keep it here."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'forge' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
