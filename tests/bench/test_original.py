"""The exhaustive port of the original scheduler (bench/original.py) and the bench script.

The port is the yardstick of the placement benchmark, so it must be right: it
checks every node, picks the best score (the fullest feasible node, minus the
headroom penalty), breaks ties like Rust's ``max_by`` and allocates whole GPUs
first-free. The last tests run ``python -m bench.placement`` on a tiny size so
the benchmark cannot rot.
"""

from __future__ import annotations

import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench import original
from bench.original import OriginalNode, allocate, can_fit, place_all, schedule, score
from bench.placement import InvariantError, check_invariants, in_arrival_order
from bench.workloads import requests_in_order, synthetic
from forge.core.models import GpuDevice, Job, Node, NodeState, Request
from forge.core.placement import Cluster, NodeAlloc, Placer, combined

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def node(
    name: str,
    cpu: int = 10_000,
    memory: int = 10_000,
    *,
    cpu_used: int = 0,
    mem_used: int = 0,
    gpus: tuple[int, ...] = (),
    gpus_taken: tuple[int, ...] = (),
    schedulable: bool = True,
) -> OriginalNode:
    """An original-scheduler node; ``gpus`` are device memories, ``gpus_taken`` indexes."""
    return OriginalNode(
        id=name,
        cpu_capacity=cpu,
        memory_capacity=memory,
        gpu_ids=[f"gpu{i}" for i in range(len(gpus))],
        gpu_memory=list(gpus),
        gpu_allocated=[i in gpus_taken for i in range(len(gpus))],
        cpu_allocated=cpu_used,
        memory_allocated=mem_used,
        gpus_allocated=len(gpus_taken),
        schedulable=schedulable,
    )


def req(cpu: int = 1_000, memory: int = 1_000, gpu: int = 0, gpu_memory: int = 0) -> Request:
    return Request(cpu=cpu, memory=memory, gpu=gpu, gpu_memory=gpu_memory)


# ------------------------------------------------------------------- the score


def test_score_is_the_weighted_mean_of_current_utilisation() -> None:
    n = node("a", cpu_used=5_000, mem_used=2_500, gpus=(16, 16, 16, 16), gpus_taken=(0,))
    # (1 * 0.5 + 1 * 0.25 + 2 * 0.25) / 4, before placing (the Rust source)
    assert score(n, req(gpu=1)) == pytest.approx(0.3125)


def test_gpu_less_node_counts_gpu_utilisation_as_zero_with_its_weight() -> None:
    assert score(node("a", cpu_used=4_000, mem_used=4_000), req()) == pytest.approx(0.2)


def test_headroom_penalty_when_cpu_or_memory_left_drops_under_5_percent() -> None:
    roomy = node("a", cpu_used=4_000, mem_used=4_000)
    assert score(roomy, req(cpu=5_000)) == pytest.approx(0.2)  # 10% cpu left
    assert score(roomy, req(cpu=5_600)) == pytest.approx(0.1)  # 4% cpu left
    assert score(roomy, req(memory=5_600)) == pytest.approx(0.1)  # 4% memory left
    assert score(node("b"), req(cpu=9_900)) == 0.0  # clamped at zero, not -0.1


def test_after_variant_scores_utilisation_after_placing_and_gpu_headroom() -> None:
    n = node("a", cpu_used=4_000, mem_used=4_000, gpus=(16, 16))
    # after: cpu 0.5, mem 0.5, gpu 1/2 -> (0.5 + 0.5 + 1.0) / 4
    assert score(n, req(gpu=1), original.VARIANT_AFTER) == pytest.approx(0.5)
    # taking both GPUs leaves 0% of them: the penalty applies in this reading only
    assert score(n, req(gpu=2), original.VARIANT_AFTER) == pytest.approx(0.75 - 0.1)
    assert score(n, req(gpu=2)) == pytest.approx(0.2)


# ---------------------------------------------------------------- the choice


def test_picks_the_fullest_node_that_fits() -> None:
    nodes = [
        node("empty"),
        node("half", cpu_used=5_000, mem_used=5_000),
        node("full", cpu_used=9_500, mem_used=9_500),  # fullest, but cannot fit
        node("third", cpu_used=3_000, mem_used=3_000),
    ]
    assert schedule(nodes, req(cpu=1_000, memory=1_000)) == 1


def test_headroom_penalty_sends_the_replica_to_a_roomier_node() -> None:
    nodes = [
        node("tight", cpu_used=6_000, mem_used=6_000),  # 0.3, but 2% cpu left: 0.2
        node("roomy", cpu_used=5_000, mem_used=5_000),  # 0.25, 13% cpu left
    ]
    assert schedule(nodes, req(cpu=3_800)) == 1
    assert schedule(nodes, req(cpu=3_000)) == 0  # 10% left: no penalty, fullest wins


def test_ties_go_to_the_last_node_like_rust_max_by() -> None:
    nodes = [node("a"), node("b"), node("c")]
    assert schedule(nodes, req()) == 2
    assert schedule(nodes, req(), ties="first") == 0


def test_no_node_fits_gives_none_and_unschedulable_nodes_are_skipped() -> None:
    nodes = [node("busy", cpu_used=9_500), node("cordoned", schedulable=False)]
    assert schedule(nodes, req()) is None
    assert not can_fit(nodes[1], req())


def test_gpu_fit_needs_enough_free_devices_with_enough_memory() -> None:
    n = node("g", gpus=(16, 32, 32), gpus_taken=(1,))
    assert can_fit(n, req(gpu=2, gpu_memory=16))
    assert not can_fit(n, req(gpu=2, gpu_memory=32))  # only gpu2 is free and big enough
    assert not can_fit(n, req(gpu=3))


def test_whole_gpus_are_allocated_first_free_with_enough_memory() -> None:
    n = node("g", gpus=(16, 32, 32, 80), gpus_taken=(1,))
    assert allocate(n, req(gpu=2, gpu_memory=32)) == ("gpu2", "gpu3")
    assert allocate(n, req(gpu=1)) == ("gpu0",)
    assert n.gpus_allocated == 4
    assert n.gpu_allocated == [True, True, True, True]
    assert (n.cpu_allocated, n.memory_allocated) == (2_000, 2_000)


def test_place_all_places_in_order_and_reports_who_did_not_fit() -> None:
    nodes = [
        Node(id="n1", cpu=4_000, memory=4_000),
        Node(
            id="n2",
            cpu=4_000,
            memory=4_000,
            gpus=(GpuDevice(id="g0", model="T4", memory=16_384),),
        ),
        Node(id="n3", cpu=64_000, memory=64_000, state=NodeState.DRAINING),
    ]
    reqs = [req(cpu=3_000), req(cpu=3_000), req(cpu=2_000, gpu=1), req(cpu=1_000)]
    state, out = place_all(nodes, reqs)
    # 1st: every node scores 0, a tie: the last schedulable node (n2). 2nd: n2 has
    # 1,000 cpu left, so n1. The GPU replica fits nowhere (1,000 cpu left on each).
    # 4th: n1 and n2 both score 0.25 - 0.1 (no cpu left after): a tie, n2 again.
    assert [None if p is None else nodes[p.node].id for p in out] == ["n2", "n1", None, "n2"]
    assert state[2].cpu_allocated == 0


def _brute_force(nodes: list[OriginalNode], r: Request, variant: str, ties: str) -> int | None:
    best, best_score = None, -1.0
    for i, n in enumerate(nodes):
        if not can_fit(n, r):
            continue
        s = score(n, r, variant)
        if s > best_score or (ties == "last" and s == best_score):
            best, best_score = i, s
    return best


@pytest.mark.parametrize("variant", original.VARIANTS)
@pytest.mark.parametrize("ties", ["last", "first"])
def test_schedule_is_the_exhaustive_argmax_of_can_fit_and_score(variant: str, ties: str) -> None:
    rng = random.Random(f"{variant}/{ties}")
    for _ in range(300):
        nodes = []
        for i in range(rng.randint(1, 12)):
            cpu, mem = rng.choice((4_000, 8_000, 16_000)), rng.choice((8_000, 32_000))
            gpus = tuple(rng.choice((16, 32)) for _ in range(rng.choice((0, 0, 2, 4))))
            nodes.append(
                node(
                    f"n{i}",
                    cpu,
                    mem,
                    cpu_used=rng.randint(0, cpu),
                    mem_used=rng.randint(0, mem),
                    gpus=gpus,
                    gpus_taken=tuple(j for j in range(len(gpus)) if rng.random() < 0.4),
                    schedulable=rng.random() < 0.9,
                )
            )
        r = req(
            cpu=rng.randint(1, 6_000),
            memory=rng.randint(1, 12_000),
            gpu=rng.choice((0, 0, 1, 2)),
            gpu_memory=rng.choice((0, 16, 32)),
        )
        assert schedule(nodes, r, variant, ties) == _brute_force(nodes, r, variant, ties)


# ------------------------------------------------------------ the bench script


def test_synthetic_workloads_are_deterministic_and_sized_as_asked() -> None:
    a, b = synthetic(40, 300, seed=3), synthetic(40, 300, seed=3)
    assert a.nodes == b.nodes and a.jobs == b.jobs
    assert len(a.nodes) == 40 and a.replicas == 300
    assert synthetic(40, 300, seed=4).jobs != a.jobs
    assert 0.7 <= a.demand["cpu"] <= 0.9


def test_invariant_check_catches_overcommit_double_binding_and_lost_replicas() -> None:
    nodes = [
        Node(
            id="n1",
            cpu=2_000,
            memory=2_000,
            gpus=(GpuDevice(id="g0", model="T4", memory=16_384),),
        )
    ]
    r, g = req(), req(gpu=1)
    with pytest.raises(InvariantError, match="cpu 3000 > capacity 2000"):
        check_invariants(
            "t",
            nodes,
            [("a", r), ("b", r), ("c", r)],
            [
                ("a", "n1", (), 1_000, 1_000),
                ("b", "n1", (), 1_000, 1_000),
                ("c", "n1", (), 1_000, 1_000),
            ],
            honour_models=True,
        )
    with pytest.raises(InvariantError, match="GPU n1/g0 held by a and b"):
        check_invariants(
            "t",
            nodes,
            [("a", g), ("b", g)],
            [("a", "n1", ("g0",), 1_000, 1_000), ("b", "n1", ("g0",), 1_000, 1_000)],
            honour_models=True,
        )
    with pytest.raises(InvariantError, match="a bound twice"):
        check_invariants(
            "t", nodes, [("a", r)], [("a", "n1", (), 1_000, 1_000)] * 2, honour_models=True
        )
    with pytest.raises(InvariantError, match="b left unplaced but fits node n1"):
        check_invariants(
            "t", nodes, [("a", r), ("b", r)], [("a", "n1", (), 1_000, 1_000)], honour_models=True
        )


def test_replicas_are_offered_in_reconcile_order() -> None:
    w = synthetic(10, 60, seed=1)
    order = [wid for wid, _ in requests_in_order(w.jobs)]
    by_job = {j.id: j for j in w.jobs}
    keys = [(-by_job[wid.split("/")[0]].priority, wid.split("/")[0]) for wid in order]
    assert keys == sorted(keys) and len(set(order)) == 60


def test_arrival_order_survives_reconciles_id_sort() -> None:
    def job(name: str) -> Job:
        return Job.model_validate(
            {
                "name": name,
                "groups": [
                    {"name": "m", "tasks": [{"name": "t", "resources": {"cpu": 1, "memory": 1}}]}
                ],
            }
        )

    jobs = [job("p2"), job("p1"), job("p3")]  # arrival order, ids not sorted
    renamed = in_arrival_order(jobs)
    assert [j.id for j in renamed] == sorted(j.id for j in renamed)
    assert [j.name for j in renamed] == ["p2", "p1", "p3"]
    ordered = [job("p1"), job("p2")]
    assert in_arrival_order(ordered) is ordered


def _run_bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bench.placement", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_bench_runs_on_a_small_size_and_prints_the_table_and_command() -> None:
    proc = _run_bench("--sizes", "50x200", "--repeat", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert " 50x200 |" in proc.stdout
    assert "speed-up" in proc.stdout
    assert "reproduce: python -m bench.placement --sizes 50x200 --repeat 1" in proc.stdout


def test_bench_runs_on_a_tiny_trace(tmp_path: Path) -> None:
    shutil.copy(FIXTURES / "trace_nodes.csv", tmp_path / "openb_node_list_all_node.csv")
    shutil.copy(FIXTURES / "trace_pods.csv", tmp_path / "openb_pod_list_default.csv")
    proc = _run_bench("--sizes", "", "--repeat", "1", "--trace", str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "original (exhaustive port)" in proc.stdout
    assert "Forge, gpu_spec honoured" in proc.stdout


# ----------------------------------------- Forge's window search, against its spec


def _naive_binpack(placer: Placer, req: Request) -> NodeAlloc | None:
    """The binpack rule spelled out: score the first ``candidates`` nodes (in the
    placer's seeded order, GPU nodes first for work without GPUs) that can take the
    replica now; the best wins, the earliest on a tie."""
    order = placer.order
    if not req.gpu:  # stable: each part keeps the seeded order
        order = [n for n in order if n.node.gpus] + [n for n in order if not n.node.gpus]
    window = [n for n in order if n.schedulable and n.fits(req)][: placer.candidates]
    best, best_score = None, -1e18
    for n in window:
        s = combined(n, req, placer.scorers)
        if s > best_score:
            best, best_score = n, s
    return best


@pytest.mark.parametrize("candidates", [1, 3, 8])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_forge_binpack_window_search_makes_the_choices_of_its_naive_spec(
    candidates: int, seed: int
) -> None:
    # The benchmark times Placer's incremental window (kept per class, rebased on
    # smaller classes' findings, scored inline); it must choose what the plain
    # rule chooses, replica for replica.
    w = synthetic(40, 400, seed=seed)
    fast = Placer(Cluster(w.nodes), candidates=candidates, seed=seed)
    naive = Placer(Cluster(w.nodes), candidates=candidates, seed=seed)
    for _, r in requests_in_order(w.jobs):
        choice = fast.place(r)
        expected = _naive_binpack(naive, r)
        assert (choice and choice.node.id) == (expected and expected.id)
        if expected is not None:
            expected.allocate(r)
