"""The FGD paper's protocol through the product's own path: ``forge plan``.

Run from the repository root::

    python -m bench.fgd_plan --trace DIR [--pods default,...] [--seeds 42..51]
        [--algorithm fgd2] [-- extra forge plan flags]

:mod:`bench.fragmentation` calls the selector pod by pod; a user never does. Here
the same arrivals (the pod list shuffled with the seed, clones to 130%) are cut at
the 100% arrival point (the last pod of it) and written as a trace CSV, one pod a
job of one priority, named so that id order is arrival order; the trace's GPU nodes
are written as a node CSV; then ``python -m forge plan --nodes N --jobs J
--algorithm A --json`` plans them in one pass, exactly as the cluster workflow
would. Unallocated GPU % = 100 - the plan's ``gpu_milli_used`` / capacity, mean of
the seeds, against the paper's FGD.
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from bench.fragmentation import INFLATION, MIN_CPU, NODES_CSV, PAPER, TRACES, _seeds, load
from forge.core.models import GPU_MILLI, Request

__all__ = ["at_100", "main"]


def at_100(
    rows: Sequence[list[str]], pods: Sequence[Request], capacity: int, seed: int
) -> list[list[str]]:
    """The trace rows of :func:`bench.fragmentation.arrivals` (the same shuffle and
    clones, drawn over indices) up to the last pod whose arrived workload rounds to
    100%; renamed in arrival order, a cpu of 0 counted as 100 millicores."""
    rng = random.Random(seed)
    order = list(range(len(pods)))
    rng.shuffle(order)
    asked = sum(pods[i].milli for i in order)
    while asked < INFLATION * capacity:
        i = rng.randrange(len(pods))
        order.append(i)
        asked += pods[i].milli
    out: list[list[str]] = []
    asked = 0
    for n, i in enumerate(order):
        asked += pods[i].milli
        if round(100 * asked / capacity) > 100:
            break
        row = list(rows[i])
        row[0] = f"a-{n:06d}"
        row[1] = str(max(MIN_CPU, int(row[1])))
        out.append(row)
    return out


def _trace_rows(path: Path) -> tuple[list[str], list[list[str]]]:
    """The pod list's header and rows in file order (as :func:`load` orders pods)."""
    with path.open(newline="") as f:
        reader = csv.reader(f)
        header = next(reader)
        rows = sorted((r for r in reader if r), key=lambda r: r[0])
    return header, rows


def _write_gpu_nodes(source: Path, path: Path) -> None:
    """The node list's GPU nodes only (the protocol's 1,213), in file order."""
    with source.open(newline="") as f, path.open("w", newline="") as out:
        reader, writer = csv.reader(f), csv.writer(out)
        header = next(reader)
        gpu = header.index("gpu")
        writer.writerow(header)
        writer.writerows(r for r in reader if r and int(r[gpu]) > 0)


def plan_once(
    nodes_csv: Path,
    header: list[str],
    pods: Sequence[list[str]],
    algorithm: str,
    extra: list[str],
    workdir: Path,
) -> tuple[int, float]:
    """``forge plan`` on ``pods`` (trace rows): (GPU milli held, seconds of the command)."""
    jobs_csv = workdir / "pods.csv"
    with jobs_csv.open("w", newline="") as f:
        csv.writer(f).writerows([header, *pods])
    cmd = [
        sys.executable,
        "-m",
        "forge",
        "plan",
        "--nodes",
        str(nodes_csv),
        "--jobs",
        str(jobs_csv),
        "--algorithm",
        algorithm,
        "--json",
        *extra,
    ]
    start = time.perf_counter()
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    seconds = time.perf_counter() - start
    return int(json.loads(out)["summary"]["gpu_milli_used"]), seconds


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.fgd_plan", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--trace", type=Path, required=True, help="the trace's directory")
    parser.add_argument("--pods", default=",".join(TRACES), help="pod lists (default: all four)")
    parser.add_argument("--seeds", default="42..51", help="e.g. 42..51 or 42,43")
    parser.add_argument("--algorithm", default="fgd2")
    parser.add_argument("extra", nargs="*", help="more forge plan flags (after --)")
    args = parser.parse_args(argv)
    seeds = _seeds(args.seeds)
    table = []
    with tempfile.TemporaryDirectory(prefix="fgd-plan-") as tmp:
        workdir = Path(tmp)
        for trace in [t for t in args.pods.split(",") if t]:
            nodes, pods = load(args.trace, trace)
            header, rows = _trace_rows(args.trace / TRACES[trace])
            nodes_csv = workdir / NODES_CSV
            _write_gpu_nodes(args.trace / NODES_CSV, nodes_csv)
            capacity = GPU_MILLI * sum(len(n.gpus) for n in nodes)
            values = []
            for seed in seeds:
                held, seconds = plan_once(
                    nodes_csv,
                    header,
                    at_100(rows, pods, capacity, seed),
                    args.algorithm,
                    args.extra,
                    workdir,
                )
                values.append(100.0 * (1 - held / capacity))
                print(
                    f"{trace:<12} seed {seed}: {values[-1]:6.2f}% unallocated ({seconds:.1f} s)",
                    file=sys.stderr,
                    flush=True,
                )
            paper = PAPER[trace]["fgd"]
            mean = statistics.mean(values)
            verdict = "below" if mean < paper else "NOT below"
            table.append(f"| {trace} | {mean:.2f} | {paper:.2f} | {verdict} |")
    print(
        f"Unallocated GPU % at 100% arrival through `forge plan --algorithm "
        f"{args.algorithm}`, mean of {len(seeds)} seed(s)\n"
    )
    print("| trace | forge plan | paper's FGD | |\n|---|---|---|---|")
    print("\n".join(table))
    argv_list = list(sys.argv[1:] if argv is None else argv)
    print("\nreproduce: " + shlex.join(["python", "-m", "bench.fgd_plan", *argv_list]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
