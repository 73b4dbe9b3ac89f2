"""The worker logs a garbage collection that pauses it for long (worker.py,
watch_gc_pauses): the likeliest cause of a workflow activation that runs long for
no reason its own code shows."""

from __future__ import annotations

import gc
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
