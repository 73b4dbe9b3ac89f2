"""GPU utilisation of each replica, as the autoscaler reads it (``gpu`` beside cpu
and memory): the busy fraction of the devices the replica is bound to.

The agent reads every device's busy percentage once per usage round from
``nvidia-smi`` (the same tool that listed the devices at start-up, in the same
index order, so ``gpu<i>`` is the i-th device it listed) and attributes it:

* a replica with whole devices: the mean busy fraction over its devices (they are
  its own);
* a replica with a share of one device: the device's busy fraction over the shares
  bound on that device on this node (``busy * 1000 / milli bound``). A device does
  not say which process kept it busy, so the busy time is taken as spread over its
  sharers in proportion to their shares: a share alone on its device that keeps it
  30% busy while holding 300 milli is at 1.0 of its share. Approximate where
  neighbours differ, which the README says.

Devices only declared (``--gpu MODEL:MiB``, no ``nvidia-smi``) are not measured:
their replicas report no ``gpu`` at all, which the autoscaler reads as unknown, not
idle.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

from forge.agent.config import nvidia_smi

__all__ = ["BUSY_QUERY", "BusyMeter", "parse_busy", "replica_gpu", "shares_on"]

#: ``nvidia-smi``'s CSV columns for a usage round.
BUSY_QUERY = "index,utilization.gpu"


def parse_busy(csv: str) -> dict[str, float]:
    """``nvidia-smi --query-gpu=index,utilization.gpu`` CSV -> ``gpu<i>`` -> busy
    fraction, ``i`` the device's position in index order (as registered). A line
    that does not parse (``[N/A]`` on a device that cannot say) is left out: its
    device is unmeasured."""
    rows: list[tuple[int, float]] = []
    for line in csv.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 2:
            continue
        try:
            index, busy = int(fields[0]), float(fields[1])
        except ValueError:
            continue
        if 0 <= busy <= 100:
            rows.append((index, busy / 100))
    return {f"gpu{i}": busy for i, (_, busy) in enumerate(sorted(rows))}


def replica_gpu(
    ids: Sequence[str], milli: int, busy: Mapping[str, float], milli_on: Mapping[str, int]
) -> float | None:
    """A replica's GPU utilisation from its bound devices' busy fractions (module
    docstring); ``milli_on``: the milli bound on each device by this node's replicas.
    None when it has no device or one of its devices is unmeasured."""
    if not ids or any(d not in busy for d in ids):
        return None
    if milli:
        bound = max(milli_on.get(ids[0], milli), milli)
        return round(busy[ids[0]] * 1000 / bound, 4)
    return round(sum(busy[d] for d in ids) / len(ids), 4)


def shares_on(bound: Iterable[tuple[Sequence[str], int]]) -> dict[str, int]:
    """Milli bound per device from ``(device ids, milli)`` of the node's replicas
    (whole devices count nothing: a share never sits beside them)."""
    out: dict[str, int] = {}
    for ids, milli in bound:
        if milli and ids:
            out[ids[0]] = out.get(ids[0], 0) + milli
    return out


def _nvidia_smi() -> str:
    return nvidia_smi(BUSY_QUERY, timeout=5)


class BusyMeter:
    """Every device's busy fraction, read at most once per ``fresh`` seconds (one
    ``nvidia-smi`` call serves a whole usage round); a failed read measures
    nothing until the next one, never stops the agent."""

    def __init__(self, read: Callable[[], str] = _nvidia_smi, fresh: float = 0.5) -> None:
        self._read = read
        self._fresh = fresh
        self._at = -1e18
        self._busy: dict[str, float] = {}

    def busy(self) -> dict[str, float]:
        now = time.monotonic()
        if now - self._at >= self._fresh:
            self._at = now
            try:
                self._busy = parse_busy(self._read())
            except (OSError, subprocess.SubprocessError):
                self._busy = {}
        return self._busy
