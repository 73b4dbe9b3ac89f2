"""``forge plan``: one placement pass offline, with exactly the workflow's code."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import cast

import click

from forge.cli import plan_output
from forge.cli.params import Checked, nonnegative_int, permille
from forge.cli.remote import print_json
from forge.core.models import Job, Node
from forge.core.placement import Binding
from forge.core.placement.scorers import ALGORITHMS, Algorithm
from forge.core.placement.select import DEFAULT_CANDIDATES, WIDER_WINDOW, default_candidates
from forge.core.plan import DEFAULT_GPU_RESERVE
from forge.core.reconcile import Plan, ReconcileOptions, reconcile
from forge.loaders import load_jobs, load_nodes
from forge.spinner import Spinner

__all__ = ["COMMANDS", "plan", "plan_passes", "replica_count"]

_WIDER = ", ".join(f"{n} for {a}" for a, n in WIDER_WINDOW.items())


def replica_count(jobs: Sequence[Job]) -> int:
    return sum(g.scaling.desired for j in jobs for g in j.groups)


def plan_passes(
    nodes: Sequence[Node],
    running: Sequence[Job],
    jobs: Sequence[Job],
    options: ReconcileOptions,
) -> tuple[Plan, float]:
    """Plan ``running`` on the empty ``nodes`` (when there are any), then ``running``
    and ``jobs`` against what the first pass bound: (the last plan, its seconds)."""
    by_id = {n.id: n for n in nodes}
    bindings: dict[str, Binding] = {}
    if running:
        first = reconcile(
            jobs={j.id: j for j in running},
            nodes=by_id,
            bindings={},
            pending={},
            failures={},
            now=0.0,
            options=options,
        )
        bindings = first.bindings
    start = time.perf_counter()
    result = reconcile(
        jobs={j.id: j for j in [*running, *jobs]},
        nodes=by_id,
        bindings=bindings,
        pending={},
        failures={},
        now=0.0,
        options=options,
    )
    return result, time.perf_counter() - start


@click.command(
    short_help="dry-run one placement pass offline (no server)",
    help=(
        "Plan one reconcile pass offline with exactly the code the cluster workflow "
        "runs (forge.core.reconcile): every replica of the jobs against the nodes. With "
        "--running, those jobs are planned first on the empty nodes and --jobs are then "
        "planned against what they hold, so higher-priority jobs show which replicas "
        "they would preempt.\n\n--json prints one object: {placements: [{workload_id, "
        "node, gpu_ids}], preemptions: [{preemptor, node, victims}], pending: "
        "[{workload_id, reasons}], summary: {placed, pending, running, preemptions, "
        "preempted, nodes_used, gpus_used, gpu_milli_used, seconds}}; placements and "
        "preemptions are the last pass's, running counts the replicas it kept, "
        "preempted the victims; seconds is the last pass's planning time only; a "
        "shared GPU's placement adds gpu_milli, gpus_used counts devices holding "
        "anything."
    ),
)
@click.option("--nodes", required=True, metavar="FILE", help="nodes: YAML, JSON or trace CSV")
@click.option("--jobs", required=True, metavar="FILE", help="jobs: YAML, JSON or trace CSV")
@click.option("--algorithm", type=click.Choice(ALGORITHMS), default="binpack")
@click.option(
    "--gpu-reserve",
    type=Checked(permille, "PERMILLE"),
    default=None,
    help="share of each free GPU's cpu/memory kept from GPU-less work, 0-1000 "
    f"(default {DEFAULT_GPU_RESERVE})",
)
@click.option(
    "--candidates",
    type=Checked(nonnegative_int, "N"),
    default=None,
    help=f"feasible nodes scored per replica; 0 scores all (default "
    f"{DEFAULT_CANDIDATES}; {_WIDER})",
)
@click.option(
    "--running",
    metavar="FILE",
    default=None,
    help="jobs already running (YAML, JSON or trace CSV): planned first; --jobs then "
    "planned against what they hold",
)
@click.option(
    "--preemption/--no-preemption",
    default=True,
    help="a replica that fits nowhere may evict lower-priority replicas (default on)",
)
@click.option(
    "--min-gap",
    type=click.IntRange(1, 99),
    default=ReconcileOptions().min_gap,
    show_default=True,
    help="priority points a victim is below its preemptor",
)
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
def plan(
    nodes: str,
    jobs: str,
    algorithm: str,
    gpu_reserve: int | None,
    candidates: int | None,
    running: str | None,
    preemption: bool,
    min_gap: int,
    as_json: bool,
) -> int:
    node_list = load_nodes(nodes)
    job_list = load_jobs(jobs)
    running_list = load_jobs(running) if running is not None else []
    clash = sorted({j.id for j in job_list} & {j.id for j in running_list})
    if clash:
        raise click.BadParameter(
            f"job {clash[0]!r} is in both --running and --jobs", param_hint="--running"
        )
    replicas = replica_count(job_list) + replica_count(running_list)
    if candidates is None:
        candidates = default_candidates(algorithm)
    options = ReconcileOptions(
        algorithm=cast(Algorithm, algorithm),  # one of ALGORITHMS (click.Choice)
        candidates=candidates,
        max_placements=max(1, replicas),
        gpu_reserve=gpu_reserve,
        preemption=preemption,
        min_gap=min_gap,
    )
    show = sys.stderr.isatty() and not (as_json and not sys.stdout.isatty())
    message = f"planning {replicas:,} replicas on {len(node_list):,} nodes..."
    with Spinner(message, enabled=show):
        result, seconds = plan_passes(node_list, running_list, job_list, options)
    if as_json:
        print_json(plan_output.plan_json(result, seconds))
    else:
        print(
            plan_output.plan_text(
                result, node_list, seconds, algorithm=algorithm, candidates=candidates
            )
        )
    return 0


COMMANDS = [plan]
