"""forge.agent.gpu_usage: a replica's GPU utilisation from its devices' busy time
(issue 33), and the sampler that sends it with cpu and memory."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from forge.agent.gpu_usage import BusyMeter, parse_busy, replica_gpu, shares_on
from forge.agent.supervisor import Replica, TaskProc
from forge.agent.usage import UsageSampler

# what ``nvidia-smi --query-gpu=index,utilization.gpu --format=csv,noheader,nounits``
# prints: listed out of order here, one device unable to say
CSV = "1, 30\n0, 85\n2, [N/A]\n3, 0\n"


def test_busy_is_read_per_device_in_index_order_as_registered() -> None:
    # gpu<i> is the i-th device in index order, as the agent registered them
    # (forge.agent.config); a device that cannot say is unmeasured, not idle
    assert parse_busy(CSV) == {"gpu0": 0.85, "gpu1": 0.30, "gpu2": 0.0}
    assert parse_busy("") == {}
    assert parse_busy("garbage\n0, 101\n") == {}  # a percentage over 100 is no reading


def test_whole_devices_average_a_share_divides_its_device_by_the_shares_on_it() -> None:
    busy = {"gpu0": 0.8, "gpu1": 0.4, "gpu2": 0.3}
    assert replica_gpu(("gpu0", "gpu1"), 0, busy, {}) == pytest.approx(0.6)
    # two shares of 500 on gpu0: each sees the device's 0.8
    on = shares_on([(("gpu0",), 500), (("gpu0",), 500), (("gpu1", "gpu2"), 0)])
    assert on == {"gpu0": 1000}
    assert replica_gpu(("gpu0",), 500, busy, on) == pytest.approx(0.8)
    # a share of 300 alone on gpu2 keeping it 30% busy uses all of its share
    assert replica_gpu(("gpu2",), 300, busy, {"gpu2": 300}) == pytest.approx(1.0)
    # its own share counts even before the sampler saw it bound
    assert replica_gpu(("gpu2",), 300, busy, {}) == pytest.approx(1.0)
    assert replica_gpu((), 0, busy, {}) is None  # no GPU
    assert replica_gpu(("gpu0", "gpu9"), 0, busy, {}) is None  # one device unmeasured


@given(
    busy=st.dictionaries(
        st.sampled_from(["gpu0", "gpu1", "gpu2"]), st.floats(0, 1), min_size=3, max_size=3
    ),
    shares=st.lists(st.integers(1, 1000), min_size=1, max_size=4),
)
def test_shares_on_a_device_never_report_more_busy_time_than_it_had(
    busy: dict[str, float], shares: list[int]
) -> None:
    """The shares' utilisations weighted by their shares add up to the device's busy
    time, whatever the split: no busy time is invented or lost."""
    on = shares_on([(("gpu1",), m) for m in shares])
    total = sum(
        (replica_gpu(("gpu1",), m, busy, on) or 0.0) * m / 1000 for m in shares
    )  # back to a fraction of the device
    assert total == pytest.approx(busy["gpu1"], abs=1e-3)


def test_the_meter_reads_once_per_round_and_a_failed_read_measures_nothing() -> None:
    calls: list[int] = []
    outcome: list[object] = [CSV]

    def read() -> str:
        calls.append(1)
        if isinstance(outcome[0], Exception):
            raise outcome[0]
        return str(outcome[0])

    meter = BusyMeter(read, fresh=3600)
    assert meter.busy()["gpu0"] == 0.85
    assert meter.busy()["gpu1"] == 0.30
    assert len(calls) == 1  # one nvidia-smi call serves the round
    stale = BusyMeter(read, fresh=0)
    outcome[0] = subprocess.CalledProcessError(9, "nvidia-smi")
    assert stale.busy() == {}
    outcome[0] = OSError("gone")
    assert stale.busy() == {}
    outcome[0] = CSV
    assert stale.busy()["gpu0"] == 0.85  # back once the tool answers again


def _replica(wid: str, gpu_ids: tuple[str, ...], milli: int) -> Replica:
    me = TaskProc("t", os.getpid(), 0.0, Path(os.devnull))
    r = Replica(wid, "n1", [me], cpu=1000, memory=1024)
    r.rebind(1000, 1024, gpu_ids, milli)
    return r


def test_the_sampler_sends_gpu_only_for_measured_devices() -> None:
    replicas = {
        "a/main/0": _replica("a/main/0", ("gpu0",), 0),
        "s/main/0": _replica("s/main/0", ("gpu1",), 250),
        "s/main/1": _replica("s/main/1", ("gpu1",), 250),
        "c/main/0": _replica("c/main/0", (), 0),
    }
    sampler = UsageSampler(BusyMeter(lambda: CSV, fresh=3600), replicas)
    unmeasured = UsageSampler(None, replicas)
    for s in (sampler, unmeasured):
        for r in replicas.values():
            assert s.sample(r) is None  # the first sample only sets the cpu origin
    got = {w: sampler.sample(r) for w, r in replicas.items()}
    gpu = {w: s.gpu for w, s in got.items() if s is not None}
    assert gpu == {"a/main/0": 0.85, "s/main/0": 0.6, "s/main/1": 0.6, "c/main/0": None}
    assert all(s is not None and s.gpu is None for s in map(unmeasured.sample, replicas.values()))
    sample = got["a/main/0"]
    assert sample is not None
    assert " gpu 85%" in sample.describe({"http": 8080})
    assert sample.describe({"http": 8080}).endswith(" ports http=8080")
