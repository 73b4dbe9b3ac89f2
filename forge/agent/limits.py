"""Can this machine hold a task to its request? Said plainly at start-up.

Hard limits need cgroup v2 with the cpu and memory controllers delegated to a
cgroup the agent may write. Where that is missing (cgroup v1, a container without
delegation) the agent says so, enforces the memory request itself by sampling
(a replica over it is stopped and reported failed with the reason) and leaves cpu
unlimited.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cgroup_problem", "limits_notice"]


def cgroup_problem(root: Path = Path("/sys/fs/cgroup")) -> str | None:
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


def limits_notice(root: Path = Path("/sys/fs/cgroup")) -> str:
    problem = cgroup_problem(root)
    if problem is None:
        return "cgroup v2 available; this agent version still enforces memory by sampling"
    return (
        f"no hard limits: {problem}. Memory requests are enforced by sampling (a replica "
        "over its request is stopped and reported failed); cpu is not limited."
    )
