"""Placement benchmark: Forge against a port of the original's exhaustive scheduler.

Run from the repository root::

    python -m bench.placement [--trace DIR] [--sizes 1000x10000,5000x50000] [--repeat N]
                              [--skip-original] [--seed S] [--original-variant after]

For each size ``NODESxREPLICAS`` it builds a synthetic cluster (``bench.workloads``)
and places every replica twice in the same process: with Forge, through
``forge.core.reconcile.reconcile`` (the function the cluster workflow runs, binpack,
``now=0``, no placement limit), and with ``bench.original`` (every node checked
and scored for every replica). Both get the replicas in the same order. It prints
a table (seconds as the median of the runs, the speed-up, replicas placed, nodes
used, GPUs used), and with ``--trace`` the same for the Alibaba GPU trace
(``openb_node_list_all_node.csv`` + a pod list, default
``openb_pod_list_default.csv``) in arrival order with whole GPUs.

Timing: wall clock (``time.perf_counter``) around the placement call only, after a
``gc.collect()`` (the collector stays on), median of ``--repeat`` runs; the
original runs once where it would take minutes (above 20M node checks). The
process's CPU time is printed too: on a busy machine it is the steadier ratio.

After every run the placement is checked against the design's invariants (no
node over its cpu, memory or GPU capacity; no GPU id held twice; no replica bound
twice, bound within desired; a replica left unplaced only if no node can take
it in the end state; Forge's repeated runs identical). A violation prints what
broke and exits 1. Missing a performance target only prints MISS.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import itertools
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from bench import original
from bench.pending import pending_heavy
from bench.workloads import Workload, requests_in_order, synthetic
from forge.core.models import GpuRequest, Job, Node, NodeState, Request, TaskGroup
from forge.core.reconcile import Plan, ReconcileOptions, reconcile
from forge.loaders import InputError, load_jobs, load_nodes

__all__ = ["Result", "check_invariants", "main", "whole_gpus"]

DEFAULT_SIZES = "1000x10000,5000x50000"
DEFAULT_PODS = "openb_pod_list_default.csv"
NODES_CSV = "openb_node_list_all_node.csv"
#: The original is run once (not ``--repeat`` times) above this many node checks.
ORIGINAL_REPEAT_LIMIT = 20_000_000
# Targets from the issue
TARGET_SIZE = "5000x50000"  # the size the speed-up and nodes-used targets are set at
SPEEDUP_TARGET = 50.0
NODES_USED_TOLERANCE = 0.02
TRACE_PODS_TARGET = 6_932  # the original's pods placed on openb_pod_list_default.csv

OPTIONS = ReconcileOptions(algorithm="binpack", max_placements=1_000_000_000)

# (workload id, node id, gpu ids, cpu, memory)
Bound = tuple[str, str, tuple[str, ...], int, int]


class InvariantError(Exception):
    pass


@dataclass(slots=True)
class Result:
    seconds: list[float]  # wall clock, one per run
    cpu_seconds: list[float]  # this process's CPU time, one per run
    desired: int
    placed: int
    nodes_used: int
    gpus_used: int

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def cpu_median(self) -> float:
        return statistics.median(self.cpu_seconds)


_T = TypeVar("_T")


def _timed(fn: Callable[[], _T]) -> tuple[float, float, _T]:
    """(wall seconds, CPU seconds of this process, result). Collects garbage first,
    so a run does not pay for the previous run's garbage (the garbage collector
    stays on during the run: a real pass runs with it)."""
    gc.collect()
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - wall, time.process_time() - cpu, out


# ----------------------------------------------------------------------- invariants


def check_invariants(
    label: str,
    nodes: Sequence[Node],
    desired: Sequence[tuple[str, Request]],
    bound: Sequence[Bound],
    *,
    honour_models: bool,
    gpu_reserve: int = 0,
) -> None:
    """Raise InvariantError naming every broken invariant (at most 20 lines).

    ``gpu_reserve`` (placement version 2): while a GPU replica is left unplaced, a
    replica without GPUs counts as fitting a GPU node only beyond what its free GPUs
    reserve (per mille of each free GPU's share), as the placer decides it.
    """
    errors: list[str] = []
    by_id = {n.id: n for n in nodes}
    want = dict(desired)
    cpu: dict[str, int] = {}
    mem: dict[str, int] = {}
    held: dict[tuple[str, str], str] = {}
    seen: set[str] = set()
    for wid, node_id, gpu_ids, b_cpu, b_mem in bound:
        if wid in seen:
            errors.append(f"{wid} bound twice")
        seen.add(wid)
        req = want.get(wid)
        if req is None:
            errors.append(f"{wid} bound but not desired")
            continue
        node = by_id.get(node_id)
        if node is None:
            errors.append(f"{wid} bound to unknown node {node_id}")
            continue
        if node.state is not NodeState.READY:
            errors.append(f"{wid} bound to {node.state.value} node {node_id}")
        if (b_cpu, b_mem) != (req.cpu, req.memory):
            errors.append(f"{wid} holds {b_cpu}m/{b_mem}MiB, wants {req.cpu}m/{req.memory}MiB")
        if len(gpu_ids) != req.gpu:
            errors.append(f"{wid} holds {len(gpu_ids)} GPUs, wants {req.gpu}")
        devices = {g.id: g for g in node.gpus}
        for gid in gpu_ids:
            dev = devices.get(gid)
            if dev is None:
                errors.append(f"{wid} holds unknown GPU {node_id}/{gid}")
                continue
            if dev.memory < req.gpu_memory:
                errors.append(f"{wid} holds {node_id}/{gid} with too little memory")
            if honour_models and req.gpu_models and dev.model not in req.gpu_models:
                errors.append(f"{wid} holds {node_id}/{gid} of model {dev.model}")
            other = held.get((node_id, gid))
            if other is not None:
                errors.append(f"GPU {node_id}/{gid} held by {other} and {wid}")
            held[(node_id, gid)] = wid
        cpu[node_id] = cpu.get(node_id, 0) + b_cpu
        mem[node_id] = mem.get(node_id, 0) + b_mem
    for node_id in sorted(cpu):
        node = by_id[node_id]
        if cpu[node_id] > node.cpu:
            errors.append(f"node {node_id} cpu {cpu[node_id]} > capacity {node.cpu}")
        if mem[node_id] > node.memory:
            errors.append(f"node {node_id} memory {mem[node_id]} > capacity {node.memory}")
    # Completeness: capacity only shrinks during a pass, so a replica that fits some
    # node in the end state would have fitted it when it was tried.
    free_gpus: dict[str, list[tuple[str, int]]] = {
        n.id: [(g.model, g.memory) for g in n.gpus if (n.id, g.id) not in held] for n in nodes
    }
    checked: set[Request] = set()
    if gpu_reserve and not any(req.gpu and wid not in seen for wid, req in desired):
        gpu_reserve = 0  # no GPU work waits: the placer lifts the reservation
    for wid, req in desired:
        if wid in seen or req in checked:
            continue
        checked.add(req)
        for n in nodes:
            if n.state is not NodeState.READY:
                continue
            res_cpu = res_mem = 0
            if gpu_reserve and not req.gpu and n.gpus:
                scale = len(n.gpus) * 1000
                res_cpu = n.cpu * len(free_gpus[n.id]) * gpu_reserve // scale
                res_mem = n.memory * len(free_gpus[n.id]) * gpu_reserve // scale
            if (
                n.cpu - cpu.get(n.id, 0) - res_cpu < req.cpu
                or n.memory - mem.get(n.id, 0) - res_mem < req.memory
            ):
                continue
            ok = sum(
                1
                for model, dmem in free_gpus[n.id]
                if dmem >= req.gpu_memory
                and (not honour_models or not req.gpu_models or model in req.gpu_models)
            )
            if ok >= req.gpu:
                errors.append(f"{wid} left unplaced but fits node {n.id}")
                break
    if errors:
        more = f"\n  ... and {len(errors) - 20} more" if len(errors) > 20 else ""
        raise InvariantError(f"{label}: invariants violated:\n  " + "\n  ".join(errors[:20]) + more)


# ------------------------------------------------------------------------- runners


def _summary(
    desired: int, bound: Sequence[Bound], seconds: list[float], cpu_seconds: list[float]
) -> Result:
    return Result(
        seconds=seconds,
        cpu_seconds=cpu_seconds,
        desired=desired,
        placed=len(bound),
        nodes_used=len({b[1] for b in bound}),
        gpus_used=sum(len(b[2]) for b in bound),
    )


def run_forge(
    label: str,
    nodes: list[Node],
    jobs: list[Job],
    repeat: int,
    *,
    honour_models: bool = True,
    options: ReconcileOptions | None = None,
) -> Result:
    """Place with ``forge.core.reconcile`` ``repeat`` times; check each run, and that all
    runs chose the same placements (determinism)."""
    node_map = {n.id: n for n in nodes}
    job_map = {j.id: j for j in jobs}
    desired = requests_in_order(jobs)
    seconds: list[float] = []
    cpu_seconds: list[float] = []
    first: Result | None = None
    first_digest = b""
    for _ in range(max(1, repeat)):
        took, cpu, plan = _timed(
            lambda: reconcile(
                jobs=job_map,
                nodes=node_map,
                bindings={},
                pending={},
                failures={},
                now=0.0,
                options=options or OPTIONS,
            )
        )
        seconds.append(took)
        cpu_seconds.append(cpu)
        bound = _forge_bound(plan)
        deferred = plan.deferred
        del plan  # keep the heap of the next run as small as the first one's
        opts = options or OPTIONS
        check_invariants(
            label,
            nodes,
            desired,
            bound,
            honour_models=honour_models,
            gpu_reserve=opts.effective_gpu_reserve,
        )
        if deferred:
            raise InvariantError(f"{label}: {deferred} placements deferred")
        digest = hashlib.sha256(repr(bound).encode()).digest()
        if first is None:
            first, first_digest = _summary(len(desired), bound, [], []), digest
        elif digest != first_digest:
            raise InvariantError(f"{label}: two runs on the same input placed differently")
        del bound
    assert first is not None
    first.seconds, first.cpu_seconds = seconds, cpu_seconds
    return first


def _forge_bound(plan: Plan) -> list[Bound]:
    return [(b.workload_id, b.node, b.gpu_ids, b.cpu, b.memory) for b in plan.placed]


def run_original(
    label: str,
    nodes: list[Node],
    jobs: list[Job],
    repeat: int,
    variant: str = original.VARIANT_SOURCE,
) -> Result:
    """Place with the exhaustive port, replicas in the same order as Forge."""
    desired = requests_in_order(jobs)
    reqs = [r for _, r in desired]
    seconds: list[float] = []
    cpu_seconds: list[float] = []
    result: Result | None = None
    for _ in range(max(1, repeat)):
        took, cpu, (_, out) = _timed(lambda: original.place_all(nodes, reqs, variant))
        seconds.append(took)
        cpu_seconds.append(cpu)
        bound = [
            (wid, nodes[p.node].id, p.gpu_ids, req.cpu, req.memory)
            for (wid, req), p in zip(desired, out, strict=True)
            if p is not None
        ]
        del out
        # the original has no GPU model constraints
        check_invariants(label, nodes, desired, bound, honour_models=False)
        result = _summary(len(desired), bound, [], [])  # deterministic: every run the same
        del bound
    assert result is not None
    result.seconds, result.cpu_seconds = seconds, cpu_seconds
    return result


# -------------------------------------------------------------------------- trace


def without_gpu_spec(jobs: list[Job]) -> list[Job]:
    """The same jobs with every GPU model constraint dropped (the original has none)."""
    groups: dict[int, TaskGroup] = {}
    out = []
    for job in jobs:
        new_groups = []
        for g in job.groups:
            ng = groups.get(id(g))
            if ng is None:
                tasks = tuple(
                    t.model_copy(
                        update={
                            "resources": t.resources.model_copy(
                                update={
                                    "gpu": GpuRequest(
                                        count=t.resources.gpu.count,
                                        memory=t.resources.gpu.memory,
                                    )
                                }
                            )
                        }
                    )
                    for t in g.tasks
                )
                ng = g.model_copy(update={"tasks": tasks})
                groups[id(g)] = ng
            new_groups.append(ng)
        out.append(job.model_copy(update={"groups": tuple(new_groups)}))
    return out


def whole_gpus(jobs: list[Job]) -> list[Job]:
    """The same jobs with every GPU share rounded to a whole device (the original
    has no sharing)."""
    out = []
    cache: dict[int, TaskGroup] = {}
    for job in jobs:
        groups = []
        for g in job.groups:
            ng = cache.get(id(g))
            if ng is None:
                tasks = tuple(
                    t.model_copy(
                        update={
                            "resources": t.resources.model_copy(
                                update={
                                    "gpu": GpuRequest(
                                        count=t.resources.gpu.count,
                                        memory=t.resources.gpu.memory,
                                        models=t.resources.gpu.models,
                                    )
                                }
                            )
                        }
                    )
                    for t in g.tasks
                )
                ng = cache[id(g)] = g.model_copy(update={"tasks": tasks})
            groups.append(ng)
        out.append(job.model_copy(update={"groups": tuple(groups)}))
    return out


def in_arrival_order(jobs: list[Job]) -> list[Job]:
    """Jobs (given in arrival order) whose ids sort in arrival order, as reconcile
    places by (priority, id): kept as they are when they already do (the trace's
    pod names do), else prefixed with their arrival index."""
    if all(j.priority == jobs[0].priority for j in jobs) and all(
        a.id < b.id for a, b in itertools.pairwise(jobs)
    ):
        return jobs
    width = len(str(len(jobs)))
    return [
        j.model_copy(update={"id": f"a{i:0{width}d}-{j.id}"[:63], "priority": 50})
        for i, j in enumerate(jobs)
    ]


def load_trace(directory: Path, pods: str) -> tuple[list[Node], list[Job]]:
    """The trace's nodes and pods in arrival order, GPU shares rounded to whole
    devices (this benchmark compares with the original, which has no sharing)."""
    nodes = load_nodes(directory / NODES_CSV)
    jobs = in_arrival_order(whole_gpus(load_jobs(directory / pods)))
    return nodes, jobs


# -------------------------------------------------------------------------- output


def _fmt_s(seconds: float) -> str:
    return f"{seconds:.2f}" if seconds >= 0.1 else f"{seconds:.3f}"


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    line = "| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + " |"
    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    body = [
        "| " + " | ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in rows
    ]
    return "\n".join([line, rule, *body])


def _parse_sizes(text: str) -> list[tuple[int, int]]:
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            n, r = part.lower().split("x")
            out.append((int(n), int(r)))
        except ValueError:
            raise SystemExit(
                f"bad size {part!r}: expected NODESxREPLICAS, e.g. 1000x10000"
            ) from None
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.placement", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--trace", type=Path, help="directory of the Alibaba GPU trace CSVs")
    parser.add_argument(
        "--pods", default=DEFAULT_PODS, help=f"pod list in --trace (default {DEFAULT_PODS})"
    )
    parser.add_argument(
        "--sizes",
        default=DEFAULT_SIZES,
        help=f"NODESxREPLICAS,... (default {DEFAULT_SIZES}; '' for none)",
    )
    parser.add_argument(
        "--repeat", type=int, default=3, help="runs per measurement, median reported (default 3)"
    )
    parser.add_argument(
        "--skip-original", action="store_true", help="do not run the exhaustive port"
    )
    parser.add_argument("--seed", type=int, default=0, help="workload seed (default 0)")
    parser.add_argument(
        "--original-variant",
        choices=original.VARIANTS,
        default=original.VARIANT_SOURCE,
        help="score of the port: the Rust source's (default) or the design notes' reading "
        "(utilisation after placing; see bench/original.py)",
    )
    parser.add_argument(
        "--workload",
        choices=("synthetic", "pending"),
        default="synthetic",
        help="the clusters of --sizes: bench.workloads.synthetic (default) or "
        "bench.pending.pending_heavy (30 request shapes, ~10%% of pods unplaceable)",
    )
    args = parser.parse_args(argv)
    argv_list = list(sys.argv[1:] if argv is None else argv)
    sizes = _parse_sizes(args.sizes)

    print(
        f"# Forge placement benchmark (Python {platform.python_version()}, {platform.machine()}, "
        f"{os.cpu_count()} cpus, load average {os.getloadavg()[0]:.1f})"
    )
    print(
        "Forge: forge.core.reconcile.reconcile, binpack, "
        f"candidates={OPTIONS.candidates}, seed={OPTIONS.seed}. "
        f"Original: bench.original (exhaustive), variant {args.original_variant!r}."
    )
    notes: list[str] = []
    targets: list[tuple[str, bool]] = []
    try:
        if sizes:
            _bench_sizes(sizes, args, notes, targets)
        if args.trace is not None:
            _bench_trace(args.trace, args.pods, args, notes, targets)
    except InvariantError as e:
        print(f"\nFAIL {e}", file=sys.stderr)
        return 1
    except InputError as e:  # a missing or bad trace file
        print(f"\n{e}", file=sys.stderr)
        return 2
    if notes:
        print()
        for note in notes:
            print(f"note: {note}")
    if targets:
        print()
        for text, ok in targets:
            print(f"{'PASS' if ok else 'MISS'}  {text}")
    print("\nreproduce: " + shlex.join(["python", "-m", "bench.placement", *argv_list]))
    return 0


def _progress(who: str, r: Result) -> None:
    print(
        f"  {who:<9}{_fmt_s(r.median)} s (CPU {_fmt_s(r.cpu_median)} s, {len(r.seconds)} run"
        f"{'s' if len(r.seconds) > 1 else ''})  placed {r.placed:,}/{r.desired:,}  "
        f"nodes {r.nodes_used:,}  GPUs {r.gpus_used:,}",
        flush=True,
    )


def _bench_sizes(
    sizes: list[tuple[int, int]],
    args: argparse.Namespace,
    notes: list[str],
    targets: list[tuple[str, bool]],
) -> None:
    rows = []
    for n, r in sizes:
        if args.workload == "pending":
            pw = pending_heavy(n, r, seed=args.seed)
            w = Workload(f"{n}x{r}", pw.nodes, pw.jobs, {})
            about = f"{pw.shapes} shapes, {pw.unplaceable:,} unplaceable"
        else:
            w = synthetic(n, r, seed=args.seed)
            about = "demand " + ", ".join(f"{k} {v:.0%}" for k, v in w.demand.items())
        print(
            f"\n{w.name}: {len(w.jobs):,} jobs, {w.replicas:,} replicas, "
            f"{sum(1 for x in w.nodes if x.gpus):,} GPU nodes; {about}",
            flush=True,
        )
        f = run_forge(f"forge {w.name}", w.nodes, w.jobs, args.repeat)
        _progress("forge", f)
        o: Result | None = None
        if not args.skip_original:
            orep = args.repeat if n * r <= ORIGINAL_REPEAT_LIMIT else 1
            if orep < args.repeat:
                notes.append(
                    f"original at {w.name}: {orep} run (exhaustive O(R x N) is slow); "
                    f"Forge: median of {args.repeat}"
                )
            o = run_original(f"original {w.name}", w.nodes, w.jobs, orep, args.original_variant)
            _progress("original", o)
            notes.append(
                f"{w.name}: speed-up by CPU time {o.cpu_median / f.cpu_median:.0f}x "
                f"(Forge {_fmt_s(f.cpu_median)} s, original {_fmt_s(o.cpu_median)} s)"
            )
        rows.append(_size_row(w.name, f, o))
        if o is not None and w.name == TARGET_SIZE:
            ratio = o.median / f.median
            diff = (f.nodes_used - o.nodes_used) / o.nodes_used
            targets.append(
                (f"{w.name}: placed {f.placed:,} >= original {o.placed:,}", f.placed >= o.placed)
            )
            targets.append(
                (
                    f"{w.name}: speed-up {ratio:.1f}x >= {SPEEDUP_TARGET:.0f}x",
                    ratio >= SPEEDUP_TARGET,
                )
            )
            targets.append(
                (
                    f"{w.name}: nodes used {diff:+.2%} vs the original (at most "
                    f"{NODES_USED_TOLERANCE:+.0%}; fewer is better)",
                    diff <= NODES_USED_TOLERANCE,
                )
            )
    print()
    print(
        _table(
            [
                "size (nodes x replicas)",
                "forge s",
                "original s",
                "speed-up",
                "placed forge",
                "placed original",
                "nodes used forge",
                "nodes used original",
                "nodes used diff",
                "GPUs used forge",
                "GPUs used original",
            ],
            rows,
        )
    )


def _bench_trace(
    directory: Path,
    pods: str,
    args: argparse.Namespace,
    notes: list[str],
    targets: list[tuple[str, bool]],
) -> None:
    print(f"\nAlibaba trace {directory / pods}: arrival order, whole GPUs", flush=True)
    took, _, (nodes, jobs) = _timed(lambda: load_trace(directory, pods))
    plain = without_gpu_spec(jobs)
    spec = sum(1 for j in jobs for g in j.groups if g.request().gpu_models)
    print(
        f"  loaded {len(nodes):,} nodes, {len(jobs):,} pods ({spec:,} with a gpu_spec) "
        f"in {took:.2f} s",
        flush=True,
    )
    rows = []
    fp = run_forge("forge trace (gpu_spec ignored)", nodes, plain, args.repeat, honour_models=False)
    _progress("forge", fp)
    rows.append(_trace_row("Forge, gpu_spec ignored", fp, len(nodes)))
    if not args.skip_original:
        op = run_original("original trace", nodes, plain, 1, args.original_variant)
        _progress("original", op)
        rows.append(_trace_row("original (exhaustive port), gpu_spec ignored", op, len(nodes)))
        notes.append(f"trace: original 1 run, Forge median of {args.repeat}")
    fs = run_forge("forge trace (gpu_spec honoured)", nodes, jobs, args.repeat)
    _progress("forge", fs)
    rows.append(_trace_row("Forge, gpu_spec honoured", fs, len(nodes)))
    if spec == 0:
        notes.append(f"trace: no pod of {pods} has a gpu_spec, so honouring it changes nothing")
    print()
    print(_table(["trace run", "pods placed", "GPUs used", "nodes used", "seconds"], rows))
    if pods == DEFAULT_PODS:
        targets.append(
            (
                f"trace: Forge places {fp.placed:,} pods >= {TRACE_PODS_TARGET:,} (the original's)",
                fp.placed >= TRACE_PODS_TARGET,
            )
        )


def _size_row(name: str, f: Result, o: Result | None) -> list[str]:
    if o is None:
        return [
            name,
            _fmt_s(f.median),
            "-",
            "-",
            f"{f.placed:,}",
            "-",
            f"{f.nodes_used:,}",
            "-",
            "-",
            f"{f.gpus_used:,}",
            "-",
        ]
    diff = (f.nodes_used - o.nodes_used) / o.nodes_used if o.nodes_used else 0.0
    return [
        name,
        _fmt_s(f.median),
        _fmt_s(o.median),
        f"{o.median / f.median:.0f}x",
        f"{f.placed:,}",
        f"{o.placed:,}",
        f"{f.nodes_used:,}",
        f"{o.nodes_used:,}",
        f"{diff:+.2%}",
        f"{f.gpus_used:,}",
        f"{o.gpus_used:,}",
    ]


def _trace_row(name: str, r: Result, nodes: int) -> list[str]:
    return [
        name,
        f"{r.placed:,} / {r.desired:,}",
        f"{r.gpus_used:,}",
        f"{r.nodes_used:,} / {nodes:,}",
        _fmt_s(r.median),
    ]


if __name__ == "__main__":
    raise SystemExit(main())
