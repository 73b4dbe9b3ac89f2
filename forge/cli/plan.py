"""``forge plan``: one placement pass offline, with exactly the workflow's code."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import cast

import click

from forge import render
from forge.cli import plan_output
from forge.cli.params import Checked, nonnegative_int, permille
from forge.cli.remote import print_json
from forge.core.models import Job
from forge.core.placement.scorers import ALGORITHMS, Algorithm
from forge.core.reconcile import ReconcileOptions, reconcile
from forge.loaders import load_jobs, load_nodes

__all__ = ["COMMANDS", "plan", "replica_count"]

_CANDIDATES = ReconcileOptions().candidates


def replica_count(jobs: Sequence[Job]) -> int:
    return sum(g.scaling.desired for j in jobs for g in j.groups)


@click.command(
    short_help="dry-run one placement pass offline (no server)",
    help=(
        "Plan one reconcile pass offline with exactly the code the cluster workflow "
        "runs (forge.core.reconcile): every replica of the jobs against the nodes, no "
        "existing bindings.\n\n--json prints one object: {placements: [{workload_id, "
        "node, gpu_ids}], pending: [{workload_id, reasons}], summary: {placed, pending, "
        "nodes_used, gpus_used, gpu_milli_used, seconds}}; seconds is the planning time "
        "only; a shared GPU's placement adds gpu_milli, gpus_used counts devices "
        "holding anything."
    ),
)
@click.option("--nodes", required=True, metavar="FILE", help="nodes: YAML, JSON or trace CSV")
@click.option("--jobs", required=True, metavar="FILE", help="jobs: YAML, JSON or trace CSV")
@click.option("--algorithm", type=click.Choice(ALGORITHMS), default="binpack")
@click.option(
    "--placement-version",
    type=click.Choice(["1", "2"]),
    default="2",
    help="1: as recorded workflow histories place; 2 (default): GPU reservation, "
    "GPU jobs first within a priority, binpack fills nodes in use first",
)
@click.option(
    "--gpu-reserve",
    type=Checked(permille, "PERMILLE"),
    default=None,
    help="share of each free GPU's cpu/memory kept from GPU-less work, 0-1000 "
    "(default: the placement version's)",
)
@click.option(
    "--candidates",
    type=Checked(nonnegative_int, "N"),
    default=_CANDIDATES,
    help=f"feasible nodes scored per replica; 0 scores all (default {_CANDIDATES})",
)
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
def plan(
    nodes: str,
    jobs: str,
    algorithm: str,
    placement_version: str,
    gpu_reserve: int | None,
    candidates: int,
    as_json: bool,
) -> int:
    node_list = load_nodes(nodes)
    job_list = load_jobs(jobs)
    replicas = replica_count(job_list)
    options = ReconcileOptions(
        algorithm=cast(Algorithm, algorithm),  # one of ALGORITHMS (click.Choice)
        candidates=candidates,
        max_placements=max(1, replicas),
        placement_version=int(placement_version),
        gpu_reserve=gpu_reserve,
    )
    show = sys.stderr.isatty() and not (as_json and not sys.stdout.isatty())
    message = f"planning {replicas:,} replicas on {len(node_list):,} nodes..."
    with render.Spinner(message, enabled=show):
        start = time.perf_counter()
        result = reconcile(
            jobs={j.id: j for j in job_list},
            nodes={n.id: n for n in node_list},
            bindings={},
            pending={},
            failures={},
            now=0.0,
            options=options,
        )
        seconds = time.perf_counter() - start
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
