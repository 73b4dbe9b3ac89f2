"""A simulated fleet: many nodes in one process, speaking the agent protocol.

Kubernetes measures its control plane against kubemark's hollow nodes and Nomad
against nodesim; Forge's is this. Each simulated node does what ``forge agent`` does
through the store (:class:`~forge.stores.base.AgentStore`, nothing more): it
heartbeats, reads the bindings, reports each replica bound to it ``running``, and,
for a replica whose tasks are all ``sleep S``, reports it ``exited`` (status 0) S
seconds later; anything else runs until its binding goes. So a scale run measures
the loop with its agents' traffic (heartbeats, report pages, completions), not an
idle store, at a size no machine could start processes for.

It is a tool, not a test double: ``forge sim fleet`` runs it (docs/operations.md),
``bench/batch_fleet.py`` measures batch throughput with it, and the tests drive
:meth:`Fleet.step` with their own clock. The optional event log (JSON lines:
``t``, ``event`` started/exited, ``workload_id``, ``node``) is what a bench reads
to find an ordinal run twice or the time from a completion to the next start.
"""

from __future__ import annotations

import heapq
import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TextIO

from forge.core.models import Job
from forge.stores.base import AgentStore, TaskReport

__all__ = ["PAGE", "Fleet", "run_seconds"]

#: Bindings read per store call.
PAGE = 5000


def run_seconds(job: Job | None, group: str) -> float | None:
    """How long a replica of ``group`` runs in simulation: the longest of its tasks'
    ``sleep S``; None (until stopped) when a task runs anything else, as a real
    service would."""
    g = job.group(group) if job is not None else None
    if g is None:
        return None
    longest = 0.0
    for task in g.tasks:
        cmd = list(task.command or ())
        if len(cmd) != 2 or cmd[0] not in ("sleep", "/bin/sleep"):
            return None
        try:
            seconds = float(cmd[1])
        except ValueError:
            return None
        if not seconds >= 0:  # nan
            return None
        longest = max(longest, seconds)
    return longest


@dataclass
class Fleet:
    """Simulated nodes ``nodes`` of ``cluster``; :meth:`step` does what is due."""

    store: AgentStore
    cluster: str
    nodes: Sequence[str]
    heartbeat_every: float = 5.0
    poll_every: float = 0.2
    events: TextIO | None = None
    clock: Callable[[], float] = time.time
    #: workload id -> the node it runs on, for each replica reported running
    running: dict[str, str] = field(default_factory=dict)
    #: replicas reported exited whose binding has not gone yet
    ended: set[str] = field(default_factory=set)
    started: int = 0
    exited: int = 0
    heartbeats: int = 0
    errors: int = 0
    last_error: str = ""
    reads: int = 0
    read_seconds: float = 0.0  # wall time spent reading bindings (is the fleet the limit?)
    _mine: frozenset[str] = frozenset()
    _beat_due: list[float] = field(default_factory=list)
    _read_at: float = float("-inf")
    _ends: list[tuple[float, str, str]] = field(default_factory=list)  # (at, wid, node)
    _jobs: dict[str, Job | None] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._mine = frozenset(self.nodes)
        now = self.clock()
        n = max(1, len(self.nodes))
        # staggered as independent agents are: node i beats at i/n of the period
        self._beat_due = [now + self.heartbeat_every * i / n for i in range(len(self.nodes))]

    def step(self) -> bool:
        """Heartbeat the nodes due, read the bindings when due, report what started
        and what ended. True: it did something (the caller need not wait)."""
        now = self.clock()
        busy = self._heartbeat(now)
        reports: list[TaskReport] = []
        if now - self._read_at >= self.poll_every:
            self._read_at = now
            begun = time.perf_counter()
            reports += self._read_bindings(now)
            self.reads += 1
            self.read_seconds += time.perf_counter() - begun
        while self._ends and self._ends[0][0] <= now:
            _, wid, node = heapq.heappop(self._ends)
            if self.running.get(wid) == node and wid not in self.ended:
                self.ended.add(wid)
                self.exited += 1
                reports.append(_report(wid, "exited", now, node, code=0))
                self._log(now, "exited", wid, node)
        if reports:
            self.store.report(self.cluster, reports)
        return busy or bool(reports)

    def run(self, stop: threading.Event, idle: float = 0.02) -> None:
        """Step until ``stop`` is set; a store error is retried at the next step, as
        an agent keeps its tasks and tries again."""
        while not stop.is_set():
            try:
                busy = self.step()
            except Exception as err:  # a busy or restarting store: counted, said
                self.errors += 1
                self.last_error = f"{type(err).__name__}: {err}"[:300]
                busy = False
            if not busy:
                stop.wait(idle)

    def _heartbeat(self, now: float) -> bool:
        beat = False
        for i, node in enumerate(self.nodes):
            if now >= self._beat_due[i]:
                self._beat_due[i] = now + self.heartbeat_every
                self.store.heartbeat(self.cluster, node, now)
                self.heartbeats += 1
                beat = True
        return beat

    def _read_bindings(self, now: float) -> list[TaskReport]:
        bound: dict[str, tuple[str, str, str]] = {}  # wid -> node, job, group
        # a whole store's plain rows, no model built (a real agent's role reads only
        # its own node's): at 20,000 bindings, the fleet's own cost stays out of it
        read = getattr(self.store, "assignment_rows", None) or self.store.assignments
        after = ""
        while True:
            page = read(self.cluster, after, PAGE)
            for a in page:
                if a.node in self._mine:
                    bound[a.workload_id] = (a.node, a.job, a.group)
            if len(page) < PAGE:
                break
            after = page[-1].workload_id
        for wid in [w for w, node in self.running.items() if bound.get(w, ("",))[0] != node]:
            del self.running[wid]  # released (or moved): stopped here
            self.ended.discard(wid)
        out = []
        for wid, (node, job_id, group) in bound.items():
            if wid in self.running:
                continue
            self.running[wid] = node
            self.started += 1
            out.append(_report(wid, "running", now, node))
            self._log(now, "started", wid, node)
            seconds = run_seconds(self._job(job_id), group)
            if seconds is not None:
                heapq.heappush(self._ends, (now + seconds, wid, node))
        return out

    def _job(self, job_id: str) -> Job | None:
        if job_id not in self._jobs:
            self._jobs[job_id] = self.store.get_job(self.cluster, job_id)
        return self._jobs[job_id]

    def _log(self, now: float, event: str, wid: str, node: str) -> None:
        if self.events is not None:
            line = {"t": round(now, 4), "event": event, "workload_id": wid, "node": node}
            self.events.write(json.dumps(line) + "\n")


def _report(wid: str, status: str, now: float, node: str, code: int | None = None) -> TaskReport:
    message = "started" if status == "running" else "task exited with status 0"
    return TaskReport(
        workload_id=wid, status=status, at=now, node=node, message=message, exit_code=code
    )
