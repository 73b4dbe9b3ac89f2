"""Can this machine hold a task to its request? Said plainly at start-up (and by
``forge agent --check``).

Hard limits need cgroup v2 with the cpu and memory controllers delegated to a
cgroup the agent may write (the hierarchy's root, or the agent's own cgroup when a
service manager delegated it): then each replica gets its own cgroup
(:mod:`forge.agent.cgroups`). Where that is missing (cgroup v1, a container without
delegation) the agent says so, enforces the memory request itself by sampling
(a replica over it is stopped and reported failed with the reason) and leaves cpu
unlimited.
"""

from __future__ import annotations

import os
from pathlib import Path

from forge.agent.cgroups import Cgroups

__all__ = [
    "CGROUP_ROOT",
    "PROC_SELF_CGROUP",
    "cgroup_problem",
    "hard_limits",
    "limits_notice",
    "own_cgroup",
]

CGROUP_ROOT = Path("/sys/fs/cgroup")
#: Where the kernel says which cgroup a process is in (``0::/a/b`` on cgroup v2).
PROC_SELF_CGROUP = Path("/proc/self/cgroup")
_NEEDED = {"cpu", "memory"}


def own_cgroup(root: Path = CGROUP_ROOT, proc: Path = PROC_SELF_CGROUP) -> Path | None:
    """The agent's own cgroup under ``root`` (None: not on cgroup v2, unreadable)."""
    try:
        lines = proc.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("0::"):
            return root / line[3:].strip().lstrip("/")
    return None


def _controllers(path: Path) -> set[str]:
    try:
        return set((path / "cgroup.controllers").read_text().split())
    except OSError:
        return set()


def _placement(root: Path, proc: Path) -> tuple[Path | None, str | None]:
    """Where the agent's subtree goes, or why nowhere: the hierarchy's root where the
    agent may write it (as root on a plain host), else the agent's own cgroup where
    it was delegated (a systemd service with ``Delegate=yes``, a user's service: its
    ``cgroup.subtree_control`` writable, cpu and memory available in it)."""
    if not (root / "cgroup.controllers").exists():
        return None, "no cgroup v2 hierarchy at /sys/fs/cgroup (cgroup v1 or none)"
    try:
        available = set((root / "cgroup.controllers").read_text().split())
    except OSError as err:
        return None, f"cannot read {root / 'cgroup.controllers'}: {err.strerror}"
    missing = _NEEDED - available
    if missing:
        return None, f"cgroup v2 controllers not available: {', '.join(sorted(missing))}"
    if os.access(root / "cgroup.subtree_control", os.W_OK):
        return root, None
    own = own_cgroup(root, proc)
    if own is None or own == root:
        return None, f"{root} is not writable by the agent (no delegation)"
    if not os.access(own / "cgroup.subtree_control", os.W_OK):
        return None, (
            f"{root} is not writable by the agent, nor its own cgroup {own} (no delegation: "
            "run it as a systemd service with Delegate=yes)"
        )
    lacking = _NEEDED - _controllers(own)
    if lacking:
        return None, f"its own cgroup {own} was delegated without: {', '.join(sorted(lacking))}"
    return own, None


def cgroup_problem(root: Path = CGROUP_ROOT, proc: Path = PROC_SELF_CGROUP) -> str | None:
    """Why cgroup v2 limits cannot be used here (None if they can)."""
    return _placement(root, proc)[1]


def hard_limits(
    node: str, root: Path = CGROUP_ROOT, proc: Path = PROC_SELF_CGROUP
) -> tuple[Cgroups | None, str]:
    """The cgroups to hold replicas to their requests, or None, and the line that
    says which applies and why."""
    parent, problem = _placement(root, proc)
    if parent is not None:
        cgroups = Cgroups(parent, node, delegated=parent != root)
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


def limits_notice(root: Path = CGROUP_ROOT, proc: Path = PROC_SELF_CGROUP) -> str:
    """What :func:`hard_limits` would say, without setting anything up."""
    parent, problem = _placement(root, proc)
    if parent is not None:
        return f"hard limits: cgroup v2 with cpu and memory delegated, under {parent}"
    return (
        f"no hard limits: {problem}. Memory requests are enforced by sampling (a replica "
        "over its request is stopped and reported failed); cpu is not limited."
    )
