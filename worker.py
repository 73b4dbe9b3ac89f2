"""The Forge worker: hosts the cluster workflow and its activities.

    python worker.py        (settings from FORGE_* environment variables)

Stops cleanly on SIGTERM or Ctrl-C: the worker finishes the activities in flight
(up to a grace period) and the workflow carries on from history on the next
worker to poll the queue.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import gc
import signal
import sys
import time
from datetime import timedelta

import structlog
from temporalio.client import Client, WorkflowHistory
from temporalio.converter import DataConverter
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig
from temporalio.service import RPCError
from temporalio.worker import Replayer, Worker

from activities.periodic import PeriodicActivities
from activities.store_activities import StoreActivities
from forge import takeover
from forge.client import watchdog
from forge.client.client import ensure_search_attributes
from forge.logs import configure
from forge.settings import Settings, SettingsError
from forge.stores import Store, open_store
from forge.wire.codec import data_converter
from workflows.cluster import ClusterWorkflow
from workflows.periodic import PeriodicJobWorkflow

__all__ = ["GcGovernor", "build_worker", "history_replay", "main", "run_worker"]

log = structlog.get_logger("forge.worker")


#: A collection longer than this is logged: the interpreter stops every thread for
#: it, so it counts against the SDK's 2 s limit on a workflow activation.
GC_PAUSE_WARN = 0.1


def watch_gc_pauses() -> None:
    """Log each garbage collection that pauses the worker for long: a cluster's
    state is held in this process (300,000 bindings are millions of objects), and a
    full collection over it is the likeliest cause of an activation that runs long
    for no reason its own code shows. Measured at 10,000 nodes / 300,000 replicas:
    a full collection every 1-2 s, 0.2-0.6 s each, freeing a few dozen objects.
    Turning the automatic ones off is no cure: the rest of each activation (the
    SDK, the workflow code) leaves cycles (1.9 million objects in two minutes; the
    pure planning code leaves none), and the full collection that reclaimed them
    took 6.8 s."""
    started: list[float] = []

    def callback(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[:] = [time.perf_counter()]
        elif started:
            took = time.perf_counter() - started[0]
            if took >= GC_PAUSE_WARN:
                log.warning(
                    "long garbage collection",
                    seconds=round(took, 3),
                    generation=info.get("generation"),
                    collected=info.get("collected"),
                    tracked=len(gc.get_objects(info.get("generation", 2))),
                )

    gc.callbacks.append(callback)


class GcGovernor:
    """Keeps the cluster's long-lived state out of the collector's sweeps.

    A full collection walks every tracked object: with a 50,000-job cluster's state
    (~1 million objects) it took 0.2-1.9 s and landed inside workflow activations,
    whose limit is 2 s. So, every ``period`` seconds, what exists is frozen
    (``gc.freeze``: moved to the permanent generation, never swept): the state
    built by the last load and passes stops costing anything, and collections look
    only at what the last second made. Cyclic garbage frozen by mistake is freed
    when the permanent generation has grown ``grow`` times since the last clean-up,
    at most once per ``interval`` seconds: one full collection then, not one every
    few seconds (measured at 5,000 nodes / 50,000 jobs: a clean-up took 0.6-1 s and
    found almost nothing, since a run lets go of its state before it continues as
    new, so they are rare). Acyclic garbage (most of it) is freed by reference
    counting, frozen or not."""

    def __init__(self, *, grow: float = 4.0, floor: int = 500_000, interval: float = 600.0) -> None:
        self.grow = grow
        self.floor = floor
        self.interval = interval
        gc.freeze()
        self.baseline = gc.get_freeze_count()
        self.cleaned_at = time.monotonic()
        self.cleanups = 0

    def step(self) -> bool:
        """Freeze what exists; clean up when the frozen set has grown too much.
        True when it cleaned up."""
        gc.freeze()
        frozen = gc.get_freeze_count()
        if frozen <= max(self.baseline * self.grow, self.baseline + self.floor):
            return False
        if time.monotonic() - self.cleaned_at < self.interval:
            return False
        gc.unfreeze()
        started = time.perf_counter()
        gc.collect()
        gc.freeze()
        self.baseline = gc.get_freeze_count()
        self.cleaned_at = time.monotonic()
        self.cleanups += 1
        log.info(
            "frozen objects cleaned up",
            seconds=round(time.perf_counter() - started, 3),
            before=frozen,
            after=self.baseline,
        )
        return True

    async def run(self, stop: asyncio.Event, period: float = 1.0) -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=period)
            self.step()


def build_worker(client: Client, store: Store, task_queue: str) -> Worker:
    # a run this worker answered a query for from a history that had moved on leaves
    # its cache, so its next task replays as every later replay will (forge.takeover)
    if not takeover.install():
        log.warning("this SDK has no activation hook: takeovers with queries may not replay")
    acts = StoreActivities(store)
    return Worker(
        client,
        task_queue=task_queue,
        # a periodic job's firings run beside the loop, on its task queue
        workflows=[ClusterWorkflow, PeriodicJobWorkflow],
        activities=acts.all() + PeriodicActivities(client, store).all(),
        activity_executor=concurrent.futures.ThreadPoolExecutor(max_workers=16),
        max_concurrent_activities=16,
        graceful_shutdown_timeout=timedelta(seconds=5),
        # after a crash, the workflow's next task leaves this worker's sticky queue
        # for the shared one after this long (the default is 10 s)
        sticky_queue_schedule_to_start_timeout=timedelta(seconds=2),
    )


def history_replay(converter: DataConverter, runtime: Runtime | None = None) -> watchdog.Replay:
    """The watchdog's replay: a run's history through this worker's workflow code
    (with the client's data converter: the same codec keys), as a worker taking the
    run over would replay it. None when it replays cleanly, else the failure."""
    replayer = Replayer(workflows=[ClusterWorkflow], data_converter=converter, runtime=runtime)

    async def replay(history: WorkflowHistory) -> str | None:
        result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
        return None if result.replay_failure is None else str(result.replay_failure)

    return replay


async def run_worker(settings: Settings, stop: asyncio.Event | None = None) -> None:
    runtime = Runtime.default()
    if settings.metrics_port:
        runtime = Runtime(
            telemetry=TelemetryConfig(
                metrics=PrometheusConfig(bind_address=f"0.0.0.0:{settings.metrics_port}")
            )
        )
    keys = settings.encryption_keys()  # the same chain as every client's
    client = await Client.connect(
        **settings.connect_config(), data_converter=data_converter(keys), runtime=runtime
    )
    try:
        created = await ensure_search_attributes(client, settings.namespace)
        if created:
            log.info("search attributes created", names=created)
    except RPCError as err:
        log.warning(
            "cannot register search attributes; the Web UI will lack Forge's columns",
            error=str(err),
        )
    store = open_store(settings.store_url)
    stop = stop or asyncio.Event()
    governor = asyncio.create_task(GcGovernor().run(stop)) if settings.gc_freeze else None
    guard: asyncio.Task[None] | None = None
    if settings.watchdog_seconds:
        guard = asyncio.create_task(
            watchdog.watch(
                client,
                settings.task_queue,
                period=settings.watchdog_seconds,
                meter=runtime.metric_meter,
                stop=stop,
                replay=history_replay(client.data_converter, runtime),
            )
        )
    try:
        async with build_worker(client, store, settings.task_queue):
            log.info(
                "worker running",
                address=settings.address,
                namespace=settings.namespace,
                task_queue=settings.task_queue,
                store=settings.store_url.split("@")[-1],
                metrics_port=settings.metrics_port or None,
                encryption=f"key {keys.current} of {keys.ids}" if keys else "off",
            )
            await stop.wait()
            log.info("worker stopping")
    finally:
        if guard is not None:
            guard.cancel()
        if governor is not None:
            governor.cancel()
        store.close()


def main() -> int:
    try:
        settings = Settings.from_env()
        settings.encryption_keys()  # an unreadable key file: exit 2 before connecting
    except SettingsError as err:
        print(f"forge worker: {err}", file=sys.stderr)
        return 2
    configure(settings.log_format)
    # what the interpreter and the imports made is never garbage: out of every full
    # collection's sweep (a cluster's state makes those long enough as it is)
    gc.freeze()
    watch_gc_pauses()

    async def _main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await run_worker(settings, stop)

    try:
        asyncio.run(_main())
    except RuntimeError as err:
        if not str(err).startswith("Failed client connect"):
            raise
        reason = str(err).splitlines()[0].rsplit(":", 1)[-1].strip(' "})')
        print(f"forge: cannot connect to Temporal at {settings.address}: {reason}", file=sys.stderr)
        return 1
    finally:
        # Collect the SDK's objects while the interpreter is whole: at exit they
        # can crash it (temporalio/sdk-python#300).
        gc.unfreeze()  # frozen objects are never collected: the SDK's must be
        gc.collect()
    return 0


if __name__ == "__main__":
    sys.exit(main())
