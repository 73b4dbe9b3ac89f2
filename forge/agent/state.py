"""The agent's memory across its own restarts: which processes it started, for which
replica.

A pid alone is not an identity (the kernel reuses pids), so each entry keeps the
process's start time as the kernel reports it; a process is ours only when both
match. The file is replaced atomically (write, fsync, rename) so a kill -9 in the
middle of a write leaves the previous version, never half of one.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

__all__ = ["ProcessRecord", "StateFile", "alive"]


@dataclass(frozen=True)
class ProcessRecord:
    """One task process of one replica."""

    workload_id: str
    task: str
    pid: int
    started: float  # psutil's create_time(): the kernel's start time of the process
    ports: dict[str, int] = field(default_factory=dict)
    node: str = ""
    #: a gang member's peers as it was told them (ordinal -> node), so the agent
    #: that adopts it restarts it when they have moved (forge.agent.peers)
    peers: dict[str, str] = field(default_factory=dict)


def alive(pid: int, started: float) -> bool:
    """Whether ``pid`` is still the process that was started at ``started``."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return abs(proc.create_time() - started) < 0.05
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


class StateFile:
    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> list[ProcessRecord]:
        """The recorded processes; an unreadable file is treated as empty (its
        processes cannot be identified, so they cannot be adopted either)."""
        try:
            doc = json.loads(self.path.read_text())
            return [ProcessRecord(**entry) for entry in doc["processes"]]
        except (OSError, ValueError, KeyError, TypeError):
            return []

    def save(self, records: list[ProcessRecord]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        body = json.dumps(
            {"version": 1, "processes": [asdict(r) for r in sorted(records, key=_key)]},
            indent=1,
        )
        with tmp.open("w") as fh:
            fh.write(body)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)


def _key(r: ProcessRecord) -> tuple[str, str]:
    return r.workload_id, r.task
