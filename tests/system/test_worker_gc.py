"""The worker logs a garbage collection that pauses it for long (worker.py,
watch_gc_pauses): the likeliest cause of a workflow activation that runs long for
no reason its own code shows."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest
from structlog.testing import capture_logs

import worker


@pytest.fixture
def callbacks_restored() -> Iterator[None]:
    before = list(gc.callbacks)
    yield
    gc.callbacks[:] = before


def test_a_long_collection_is_logged_with_its_generation(
    callbacks_restored: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    worker.watch_gc_pauses()
    monkeypatch.setattr(worker, "GC_PAUSE_WARN", 0.0)  # every collection is "long"
    with capture_logs() as logs:
        gc.collect()
    long = [e for e in logs if e["event"] == "long garbage collection"]
    assert [e["generation"] for e in long] == [2]
    assert long[0]["seconds"] >= 0 and long[0]["log_level"] == "warning"


def test_a_short_collection_is_not(
    callbacks_restored: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    worker.watch_gc_pauses()
    monkeypatch.setattr(worker, "GC_PAUSE_WARN", 3600.0)
    with capture_logs() as logs:
        gc.collect()
    assert not [e for e in logs if e["event"] == "long garbage collection"]


class _Cycle:
    def __init__(self) -> None:
        self.me = self


@pytest.fixture
def unfrozen() -> Iterator[None]:
    yield
    gc.unfreeze()
    gc.freeze()  # as the worker leaves it: what the imports made stays out


def test_the_governor_freezes_what_exists_so_collections_skip_it(unfrozen: None) -> None:
    governor = worker.GcGovernor(floor=10**9)  # never cleans up here
    state = [[i] for i in range(50_000)]  # long-lived state (tracked), as a load makes
    assert not governor.step()
    assert gc.get_freeze_count() >= governor.baseline + len(state)
    # a full collection now sweeps only what came after the freeze
    assert len(gc.get_objects(2)) < len(state)


def test_frozen_cyclic_garbage_is_freed_once_the_frozen_set_has_doubled(unfrozen: None) -> None:
    governor = worker.GcGovernor(grow=2.0, floor=1_000, interval=0.0)
    cycles = [_Cycle() for _ in range(5_000)]
    probe = weakref.ref(cycles[0])
    governor.step()  # frozen while alive
    del cycles  # now garbage, but frozen: no collection sees it
    gc.collect()
    assert probe() is not None
    frozen_before = gc.get_freeze_count()
    growth = [[i] for i in range(frozen_before + 1_000)]  # the frozen set doubles
    assert governor.step()
    assert governor.cleanups == 1
    assert probe() is None  # the frozen garbage went
    assert gc.get_freeze_count() >= len(growth)  # what is alive is frozen again
