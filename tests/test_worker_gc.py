"""The worker keeps full garbage collections out of workflow activations
(worker.py, keep_gc_short): automatic full collections are off, and cyclic garbage
that reached the oldest generation is still reclaimed by the worker's own periodic
full collection."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Iterator

import pytest

import worker
from tests.e2e.procs import eventually


class _Cycle:
    def __init__(self) -> None:
        self.me = self


@pytest.fixture
def gc_restored() -> Iterator[None]:
    """The thresholds and the freeze are process-wide: give the other tests theirs back."""
    thresholds = gc.get_threshold()
    yield
    gc.set_threshold(*thresholds)
    gc.unfreeze()


async def test_automatic_full_collections_are_off_and_the_imports_frozen(
    gc_restored: None,
) -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(worker.keep_gc_short(stop))
    await eventually(
        lambda: asyncio.sleep(0, gc.get_threshold()),
        lambda t: t[2] == worker.GC_NO_AUTO_FULL,
        what="the thresholds set",
    )
    young, middle, _ = gc.get_threshold()
    assert (young, middle) > (0, 0)  # the young generations still collect
    assert gc.get_freeze_count() > 0
    stop.set()
    await asyncio.wait_for(task, 5)


async def test_old_cyclic_garbage_is_reclaimed_by_the_periodic_full_collection(
    gc_restored: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(worker, "GC_FULL_EVERY", 0.01)
    stop = asyncio.Event()
    task = asyncio.create_task(worker.keep_gc_short(stop))
    try:
        await eventually(  # started: what existed before it is frozen, garbage or not
            lambda: asyncio.sleep(0, gc.get_threshold()),
            lambda t: t[2] == worker.GC_NO_AUTO_FULL,
            what="the thresholds set",
        )
        old = _Cycle()
        gc.collect()  # survivors of a full collection sit in the oldest generation
        ref = weakref.ref(old)
        del old  # now cyclic garbage that only a full collection reclaims
        await eventually(  # (the probe must not hold the object itself)
            lambda: asyncio.sleep(0, ref() is None), bool, what="the cycle reclaimed"
        )
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)
