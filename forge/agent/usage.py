"""Real utilisation of each replica, as the autoscaler reads it: cpu and memory
used over what the binding requested (1.0 = exactly the request), and the busy
fraction of its GPUs where the agent can measure them (:mod:`forge.agent.gpu_usage`).

CPU is the cpu time the replica's process trees consumed between two samples over
the wall time between them, so a task that forks workers is counted whole; memory
is the trees' resident set now.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

import psutil

from forge.agent.gpu_usage import BusyMeter, replica_gpu, shares_on
from forge.agent.supervisor import Replica

__all__ = ["Sample", "UsageSampler"]


@dataclass(frozen=True)
class Sample:
    cpu: float  # utilisation of the requested cpu
    memory: float  # utilisation of the requested memory
    cpu_millicores: int
    memory_mib: int
    gpu: float | None = None  # busy fraction of its GPUs; None: not measured

    def describe(self, ports: Mapping[str, int]) -> str:
        """The report's message (``forge status`` shows the latest)."""
        gpu = "" if self.gpu is None else f" gpu {self.gpu:.0%}"
        bound = " ".join(f"{k}={v}" for k, v in sorted(ports.items()))
        return f"cpu {self.cpu_millicores}m memory {self.memory_mib}Mi{gpu}" + (
            f" ports {bound}" if bound else ""
        )


def _tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def _cpu_and_rss(replica: Replica) -> tuple[float, int]:
    cpu_seconds, rss = 0.0, 0
    for t in replica.tasks:
        if t.gone:
            continue
        for proc in _tree(t.pid):
            try:
                times = proc.cpu_times()
                cpu_seconds += times.user + times.system
                rss += proc.memory_info().rss
            except psutil.Error:
                continue
    return cpu_seconds, rss


class UsageSampler:
    """``meter``: the node's measured GPUs (None: none measured); ``replicas``: the
    supervisor's, whose shares divide a shared device's busy time."""

    def __init__(
        self, meter: BusyMeter | None = None, replicas: Mapping[str, Replica] | None = None
    ) -> None:
        self._last: dict[str, tuple[float, float]] = {}  # wid -> (monotonic, cpu seconds)
        self._meter = meter
        self._replicas = replicas if replicas is not None else {}

    def sample(self, replica: Replica) -> Sample | None:
        """The replica's usage since its previous sample (None on the first)."""
        now = time.monotonic()
        cpu_seconds, rss = _cpu_and_rss(replica)
        last = self._last.get(replica.workload_id)
        self._last[replica.workload_id] = (now, cpu_seconds)
        if last is None or now <= last[0]:
            return None
        used = max(0.0, cpu_seconds - last[1]) / (now - last[0])  # cores
        millicores = int(used * 1000)
        mib = rss // (1 << 20)
        return Sample(
            cpu=round(millicores / replica.cpu, 4) if replica.cpu else 0.0,
            memory=round(mib / replica.memory, 4) if replica.memory else 0.0,
            cpu_millicores=millicores,
            memory_mib=mib,
            gpu=self._gpu(replica),
        )

    def _gpu(self, replica: Replica) -> float | None:
        if self._meter is None or not replica.gpu_ids:
            return None
        milli_on = shares_on((r.gpu_ids, r.gpu_milli) for r in self._replicas.values())
        return replica_gpu(replica.gpu_ids, replica.gpu_milli, self._meter.busy(), milli_on)

    def memory_mib(self, replica: Replica) -> int:
        return _cpu_and_rss(replica)[1] // (1 << 20)

    def forget(self, workload_id: str) -> None:
        self._last.pop(workload_id, None)
