"""Can this machine hold a task to its request? Said plainly at start-up (and by
``forge agent --check``).

Hard limits need cgroup v2 with the cpu and memory controllers delegated to a
cgroup the agent may write: then each replica gets its own cgroup
(:mod:`forge.agent.cgroups`). Where that is missing (cgroup v1, a container without
delegation) the agent says so, enforces the memory request itself by sampling
(a replica over it is stopped and reported failed with the reason) and leaves cpu
unlimited.
"""

from __future__ import annotations

import os
from pathlib import Path

from forge.agent.cgroups import Cgroups

__all__ = ["CGROUP_ROOT", "cgroup_problem", "hard_limits", "limits_notice"]

CGROUP_ROOT = Path("/sys/fs/cgroup")


def cgroup_problem(root: Path = CGROUP_ROOT) -> str | None:
    """Why cgroup v2 limits cannot be used here (None if they can)."""
    controllers = root / "cgroup.controllers"
    if not controllers.exists():
        return "no cgroup v2 hierarchy at /sys/fs/cgroup (cgroup v1 or none)"
    try:
        available = set(controllers.read_text().split())
    except OSError as err:
        return f"cannot read {controllers}: {err.strerror}"
    missing = {"cpu", "memory"} - available
    if missing:
        return f"cgroup v2 controllers not available: {', '.join(sorted(missing))}"
    if not os.access(root / "cgroup.subtree_control", os.W_OK):
        return f"{root} is not writable by the agent (no delegation)"
    return None


def hard_limits(node: str, root: Path = CGROUP_ROOT) -> tuple[Cgroups | None, str]:
    """The cgroups to hold replicas to their requests, or None, and the line that
    says which applies and why."""
    problem = cgroup_problem(root)
    if problem is None:
        cgroups = Cgroups(root, node)
        try:
            cgroups.prepare()
        except OSError as err:
            problem = f"cannot set up {cgroups.base}: {err.strerror or err}"
        else:
            return cgroups, (
                f"hard limits: cgroup v2 under {cgroups.base}; each replica's memory.max and "
                "cpu.max are its request (over its memory: killed, reported out of memory)"
            )
    return None, (
        f"no hard limits: {problem}. Memory requests are enforced by sampling (a replica "
        "over its request is stopped and reported failed); cpu is not limited."
    )


def limits_notice(root: Path = CGROUP_ROOT) -> str:
    """What :func:`hard_limits` would say, without setting anything up."""
    problem = cgroup_problem(root)
    if problem is None:
        return "hard limits: cgroup v2 with cpu and memory delegated"
    return (
        f"no hard limits: {problem}. Memory requests are enforced by sampling (a replica "
        "over its request is stopped and reported failed); cpu is not limited."
    )
