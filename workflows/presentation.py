"""What the loop shows: the status it publishes to the store and the memo, the
Web UI's current details and search attributes, and the pass metrics. The texts
and documents are pure views (``forge.wire.views``); this mixin only hands them to
Temporal."""

from __future__ import annotations

from temporalio import workflow
from temporalio.common import MetricMeter, SearchAttributeKey

from workflows import batch
from workflows.handlers import Handlers
from workflows.queues import views_of

with workflow.unsafe.imports_passed_through():
    from forge import queue_text
    from forge.core.reconcile import Plan
    from forge.errors import Busy, NotFound
    from forge.wire import contract as c
    from forge.wire import metrics, views
    from forge.wire.errors import encode_query

__all__ = ["Presentation", "status_json"]

SA_CLUSTER = SearchAttributeKey.for_keyword(c.SA_CLUSTER)
SA_PENDING = SearchAttributeKey.for_int(c.SA_PENDING)
SA_BOUND = SearchAttributeKey.for_int(c.SA_BOUND)
SA_NODES = SearchAttributeKey.for_int(c.SA_NODES)


class Presentation(Handlers):
    def __init__(self, inp: c.ClusterInput) -> None:
        super().__init__(inp)
        self.search_attrs: tuple[int, int, int] | None = None
        self.longest_plan = 0.0  # seconds; a metric only

    @workflow.query(name=c.QUERY_JOB_STATE)
    def job_state(self, job_id: str) -> c.JobState:
        """A job's state for any client (``"job_id"`` in, plain JSON out): ``forge job
        wait``'s answer without the store. Best-effort, as every query (RELIABILITY.md).
        A new run still loading its state from the store is ``Busy`` (ask again), not
        a run without the job."""
        if not self.ready:
            raise encode_query(Busy("the run is loading its state from the store; ask again"))
        found = batch.state_of(self.st, job_id) or self.st.batch_removed.get(job_id)
        if found is None:
            raise encode_query(NotFound(f"unknown job {job_id!r}"))
        return found

    def _publication(self, plan: Plan, now: float) -> tuple[str, c.Summary]:
        """What this pass publishes (status JSON without the fields that change every
        pass, so an unchanged cluster publishes nothing), and its summary."""
        st = self.st
        summary = c.Summary(
            desired=plan.desired,
            bound=len(plan.bindings),
            pending=len(plan.pending) + plan.deferred,
            nodes=len(st.nodes),
            jobs=len(st.jobs),
            passes=0,
            generation=st.generation,
            last_pass_at=None,
            last_pass="",
        )
        preemptions, recent = st.preemptions_after(plan)
        doc = views.loop_status(
            summary,
            plan.pending,
            deferred=plan.deferred,
            notices=st.notices(),
            state_digest=f"{st.state_after(plan):016x}",
            preemptions=preemptions,
            recent_preemptions=recent,
            resets=st.resets,
            last_reset=st.last_reset,
        )
        if st.batch_failed:
            doc = doc.model_copy(update={"failed_jobs": dict(sorted(st.batch_failed.items()))})
        if st.batch_removed:  # bounded: batch.REMOVED_KEPT
            doc = doc.model_copy(update={"removed_jobs": dict(st.batch_removed)})
        if st.batch_tolerated:  # bounded by the jobs with a run failed within max_failed
            tolerated = {j: sum(g.values()) for j, g in sorted(st.batch_tolerated.items())}
            doc = doc.model_copy(update={"tolerated_failures": tolerated})
        if plan.rollouts is not None and plan.rollouts.rollouts:
            doc = doc.model_copy(update={"rollouts": views.rollout_views(plan.rollouts)})
        if st.queues and plan.carry is not None:  # bounded: wire.queues.MAX_QUEUES
            doc = doc.model_copy(update={"queues": views_of(st.queues, plan.carry.ledger)})
        full = summary.model_copy(
            update={
                "passes": st.passes + 1,
                "last_pass_at": now,
                "last_pass": views.pass_text(st.passes + 1, plan),
            }
        )
        return doc.model_dump_json(), full

    def _details(self) -> None:
        st = self.st
        text = views.details(
            cluster=st.cluster,
            runs=st.runs,
            generation=st.generation,
            nodes=st.nodes.values(),
            jobs=len(st.jobs),
            bound=len(st.bindings),
            pending=st.pending,
            deferred=st.deferred,
            last_pass=st.last_pass,
            notices=st.notices(),
            preemptions=st.preemptions,
            resets=st.resets,
            last_reset=st.last_reset,
        )
        if st.rollouts:  # rolling updates: each group's target version and why it waits
            text += "\n\nRollouts:\n" + "\n".join(
                f"- {name}: to version {r.rollout.version} (from {r.rollout.previous})"
                + (f", failed: {r.failed}" if r.failed else "")
                + (", promoted" if r.rollout.promoted else "")
                + (f"; {st.rollout_waiting[name]}" if st.rollout_waiting.get(name) else "")
                for name, r in sorted(st.rollouts.items())
            )
        if st.queues and st.carry is not None:  # teams sharing the cluster: their quotas
            shown = views_of(st.queues, st.carry.ledger)
            text += "\n\nQueues:\n" + "\n".join(queue_text.lines(shown))
        workflow.set_current_details(text)
        self._search_attributes()

    def _search_attributes(self) -> None:
        if workflow.info().typed_search_attributes.get(SA_CLUSTER) is None:
            return  # the server has no Forge attributes registered; see worker start-up
        st = self.st
        values = (len(st.pending) + st.deferred, len(st.bindings), len(st.nodes))
        if values == self.search_attrs:
            return
        self.search_attrs = values
        workflow.upsert_search_attributes(
            [
                SA_PENDING.value_set(values[0]),
                SA_BOUND.value_set(values[1]),
                SA_NODES.value_set(values[2]),
            ]
        )

    def _record(self, plan: Plan, elapsed: float) -> None:
        meter = workflow.metric_meter().with_additional_attributes({"cluster": self.st.cluster})
        for m in metrics.pass_metrics(plan, self.st.nodes.values(), elapsed):
            _emit(meter, m)
        if self.st.queues and plan.carry is not None:
            for m in metrics.queue_metrics(views_of(self.st.queues, plan.carry.ledger)):
                _emit(meter, m)
        if elapsed > self.longest_plan:
            self.longest_plan = elapsed
            meter.create_gauge_float(
                "forge_longest_plan_seconds",
                "longest planning step of this run (one activation)",
                "s",
            ).set(elapsed)


def _emit(meter: MetricMeter, m: metrics.Metric) -> None:
    attrs = dict(m.attributes)
    if m.kind == "gauge":
        meter.create_gauge(m.name, m.description, m.unit).set(int(m.value), attrs)
    elif m.kind == "counter":
        meter.create_counter(m.name, m.description, m.unit).add(int(m.value), attrs)
    elif m.kind == "histogram":
        meter.create_histogram(m.name, m.description, m.unit).record(int(m.value), attrs)
    else:
        meter.create_histogram_float(m.name, m.description, m.unit).record(m.value, attrs)


def status_json(published: tuple[str, c.Summary]) -> str:
    """The published status with the live summary filled in."""
    doc = c.LoopStatus.model_validate_json(published[0])
    return doc.model_copy(update={"summary": published[1]}).model_dump_json()
