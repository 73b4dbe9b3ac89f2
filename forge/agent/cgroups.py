"""Hard limits with cgroup v2: each replica in a cgroup of its own, its request as
``memory.max`` and ``cpu.max``.

Used where :func:`forge.agent.limits.cgroup_problem` finds a cgroup v2 hierarchy with
the cpu and memory controllers and a subtree the agent may write (delegation).
Elsewhere the agent keeps its sampling fallback. A task joins its cgroup before it
runs its command (a shell writes its own pid, then ``exec``\\s the task), so nothing
it forks escapes the limit; the kernel's OOM killer then ends a replica over its
memory, which the agent reports as "out of memory" from ``memory.events``.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

__all__ = ["CPU_PERIOD_US", "Cgroups", "cpu_max", "memory_max"]

#: ``cpu.max``'s period: the quota is the request's share of it.
CPU_PERIOD_US = 100_000
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def memory_max(memory_mib: int) -> str:
    """``memory.max`` for a request of ``memory_mib`` (0: no request, no limit)."""
    return str(memory_mib * 1024 * 1024) if memory_mib > 0 else "max"


def cpu_max(cpu_milli: int) -> str:
    """``cpu.max`` for a request of ``cpu_milli`` millicores (1000 = one core)."""
    if cpu_milli <= 0:
        return f"max {CPU_PERIOD_US}"
    return f"{max(1000, cpu_milli * CPU_PERIOD_US // 1000)} {CPU_PERIOD_US}"


class Cgroups:
    """The agent's subtree, ``<parent>/forge-<node>``, one child per replica.
    ``parent`` is the hierarchy's root, or the agent's own cgroup when it was
    delegated (``delegated``): the agent then moves its own processes to the leaf
    ``<parent>/forge-agent`` first, since cgroup v2 enables controllers for the
    children of a cgroup only while it holds no process itself."""

    def __init__(self, parent: Path, node: str, *, delegated: bool = False) -> None:
        self.base = parent / f"forge-{_UNSAFE.sub('_', node)}"
        self.leaf = parent / "forge-agent" if delegated else None

    def prepare(self) -> None:
        """Create the subtree and delegate cpu and memory to its children."""
        if self.leaf is not None:
            self._leave_parent(self.leaf)
        self.base.mkdir(exist_ok=True)
        (self.base.parent / "cgroup.subtree_control").write_text("+cpu +memory")
        (self.base / "cgroup.subtree_control").write_text("+cpu +memory")

    @staticmethod
    def _leave_parent(leaf: Path) -> None:
        """Move every process of the delegated cgroup (the agent, what its service
        started beside it) into ``leaf``: one pid per write, as the kernel takes them."""
        leaf.mkdir(exist_ok=True)
        try:
            pids = (leaf.parent / "cgroup.procs").read_text().split()
        except FileNotFoundError:
            pids = []
        for pid in pids or [str(os.getpid())]:
            (leaf / "cgroup.procs").write_text(pid)

    def path(self, workload_id: str) -> Path:
        return self.base / _UNSAFE.sub("_", workload_id)

    def create(self, workload_id: str, cpu_milli: int, memory_mib: int) -> Path:
        """The replica's cgroup with its limits (an earlier one of the same id is
        reused: its limits are written again)."""
        path = self.path(workload_id)
        path.mkdir(exist_ok=True)
        (path / "memory.max").write_text(memory_max(memory_mib))
        (path / "cpu.max").write_text(cpu_max(cpu_milli))
        return path

    @staticmethod
    def wrap(path: Path, argv: list[str]) -> list[str]:
        """``argv`` run inside ``path``: the shell joins the cgroup, then becomes
        the task (same pid, same process group)."""
        return ["/bin/sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(path), *argv]

    def oom_killed(self, workload_id: str) -> bool:
        """Whether the kernel killed a process of the replica for its memory."""
        try:
            events = (self.path(workload_id) / "memory.events").read_text()
        except OSError:
            return False
        for line in events.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit() and int(value) > 0:
                return True
        return False

    def remove(self, workload_id: str) -> None:
        """Remove the replica's cgroup once its processes are gone (a real cgroup
        directory is removed with rmdir; the kernel refuses while it has members)."""
        path = self.path(workload_id)
        with contextlib.suppress(OSError):
            path.rmdir()
