"""GPU fragmentation: how much of a node's free GPU the expected work cannot use.

The measure of "Beware of Fragmentation" (Weng et al., USENIX ATC '23), which the
``fgd`` algorithm descends. For a node n and a task m, the fragment F_n(m) is:

* all of n's free milli-GPU when m asks no GPU, when n has no GPU model m accepts,
  or when m cannot fit on n (cpu, or not enough free GPU: one device with room for
  a share, or ``k`` wholly free devices);
* otherwise the free milli-GPU on the devices whose free amount is below m's
  per-device request (m could never use those).

F_n(M) = sum over the typical tasks m of p_m * F_n(m); the cluster's expected
fragmentation is the sum over nodes. Placing a replica changes only its node, so a
scorer needs F of one node before and after (:class:`Fgd`). Only the node's free
cpu, its devices' models and their free milli-GPU matter, so F is memoised on that
state: nodes of one kind in one state share one computation.

``fgd2`` (:class:`Fgd` with ``memory=True``) is the same descent with two changes,
measured on the trace (README, "GPU fragmentation"):

* memory is part of "m cannot fit on n": the typical tasks are shapes of
  (cpu, memory, GPU) and a node whose free memory is below a task's counts all its
  free GPU as fragment for it. The paper's F looks at cpu only, yet memory strands
  GPUs as surely (on the Alibaba trace, 8-GPU nodes ended with whole GPUs free and
  cpu to spare but no memory left);
* a request for two or more whole GPUs is scored over a window ``WIDE`` times the
  selector's (:meth:`Fgd.window`), by the exact difference rather than the integer
  sigmoid: such requests are few, and each one that takes the wrong node breaks a
  node the next multi-GPU request needed whole (a 2-GPU request finds a 2-GPU node
  that a window of 16 misses).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from forge.core.models import GPU_MILLI, Request
from forge.core.placement.state import NodeAlloc

__all__ = [
    "DEFAULT_COVERAGE",
    "WIDE",
    "Fgd",
    "TypicalTask",
    "fragmentation",
    "typical_tasks",
]

#: The typical tasks are the most frequent request shapes covering this share of
#: the replicas (the paper's 95%: 35 shapes on the default Alibaba trace).
DEFAULT_COVERAGE = 0.95
_MEMO_LIMIT = 200_000  # states remembered per scorer; cleared when full (a pass is bounded)
#: fgd2: a request for two or more whole GPUs scores this many times the selector's window.
WIDE = 16


@dataclass(frozen=True, slots=True)
class TypicalTask:
    """One shape of expected work and its probability.

    ``milli`` is the per-device request: a share (1..999) for one shared device,
    1000 for ``count`` whole devices, 0 when the task asks no GPU. ``memory`` is
    0 for fgd's tasks (the paper's F ignores memory), the request's for fgd2's.
    """

    cpu: int
    milli: int
    count: int
    models: frozenset[str]
    p: float
    memory: int = 0


def typical_tasks(
    requests: Iterable[tuple[Request, float]],
    coverage: float = DEFAULT_COVERAGE,
    *,
    memory: bool = False,
) -> tuple[TypicalTask, ...]:
    """The most frequent shapes (cpu, GPU share, GPU count, models; with ``memory``
    also the memory) of weighted requests, covering ``coverage`` of the total
    weight, probabilities renormalised.

    Deterministic: ties in weight are broken by the shape itself.
    """
    weights: dict[tuple[int, int, int, int, tuple[str, ...]], float] = {}
    for req, w in requests:
        if w <= 0:
            continue
        milli = req.gpu_milli if req.gpu_milli else (GPU_MILLI if req.gpu else 0)
        key = (req.cpu, req.memory if memory else 0, milli, req.gpu, tuple(sorted(req.gpu_models)))
        weights[key] = weights.get(key, 0.0) + w
    total = sum(weights.values())
    if not total:
        return ()
    ranked = sorted(weights.items(), key=lambda kv: (-kv[1], kv[0]))
    chosen: list[tuple[tuple[int, int, int, int, tuple[str, ...]], float]] = []
    acc = 0.0
    for key, w in ranked:
        chosen.append((key, w))
        acc += w
        if acc >= coverage * total:
            break
    norm = sum(w for _, w in chosen)
    return tuple(
        TypicalTask(cpu, milli, count, frozenset(models), w / norm, mem)
        for (cpu, mem, milli, count, models), w in chosen
    )


def _state(
    node: NodeAlloc, cpu_taken: int, device: int, milli: int, mem_taken: int | None
) -> tuple[object, ...]:
    """The memo key of a node's state after taking ``cpu_taken``, ``mem_taken``
    (None: memory is not part of the state) and ``milli`` of ``device`` (-1: no
    device)."""
    left = list(node.gpu_left)
    if device >= 0:
        left[device] -= milli
    return _key(node, node.node.cpu - node.cpu_used - cpu_taken, _mem(node, mem_taken), left)


def _mem(node: NodeAlloc, mem_taken: int | None) -> int:
    return 0 if mem_taken is None else node.node.memory - node.mem_used - mem_taken


def _key(node: NodeAlloc, cpu_free: int, mem_free: int, left: list[int]) -> tuple[object, ...]:
    models = tuple(g.model for g in node.node.gpus)
    return (cpu_free, mem_free, tuple(sorted(zip(models, left, strict=True))))


def fragmentation(
    cpu_free: int,
    devices: Sequence[tuple[str, int]],
    tasks: Sequence[TypicalTask],
    mem_free: int = 0,
) -> float:
    """F_n(M) in milli-GPU for a node with ``cpu_free``, ``mem_free`` (looked at
    only for tasks with a memory) and ``(model, free milli)`` devices (module
    docstring)."""
    total = 0
    for _, left in devices:
        total += left
    if not total:
        return 0.0
    # what the tasks of one model set can use, and of it what one per-device request
    # can (tasks share model sets and requests: computed once per call)
    usable_by: dict[frozenset[str], tuple[list[int], int]] = {}
    room_by: dict[tuple[frozenset[str], int], int] = {}
    frag = 0.0
    for t in tasks:
        if not t.count or cpu_free < t.cpu or (t.memory and mem_free < t.memory):
            frag += t.p * total
            continue
        got = usable_by.get(t.models)
        if got is None:
            usable = [left for model, left in devices if not t.models or model in t.models]
            got = usable_by[t.models] = (usable, sum(1 for left in usable if left == GPU_MILLI))
        usable, whole = got
        if not usable:
            frag += t.p * total
            continue
        if t.milli < GPU_MILLI:
            room = room_by.get((t.models, t.milli))
            if room is None:
                room = room_by[(t.models, t.milli)] = sum(
                    left for left in usable if left >= t.milli
                )
            fits = room > 0  # some device has at least the share (a share is > 0)
        else:
            room = whole * GPU_MILLI
            fits = whole >= t.count
        if not fits:
            frag += t.p * total
            continue
        # devices this task cannot use: too little left, or a model it excludes
        frag += t.p * (total - room)
    return frag


class Fgd:
    """Fragmentation gradient descent: the node (and, for a share, the device) where
    the expected fragmentation F_n(M) grows least.

    Score: ``int(100 * sigmoid((F_before - F_after) / 1000))``, the paper's. The
    integer keeps differences of more than ~40 milli-GPU apart and makes smaller
    ones ties, which the selector breaks by its fixed node order: among nodes
    about as good, the first-fit one, which consolidates. Measured on the trace
    (bench/fragmentation.py), the exact difference packs worse (it chases tiny
    gains across the whole cluster): 5.0% unallocated against 4.7% on the default
    trace.

    ``memory=True`` is fgd2 (module docstring): memory in the typical tasks and in
    F, and a wider window scored by the exact difference for requests of two or
    more whole GPUs.
    """

    def __init__(
        self, workload: Iterable[tuple[Request, float]] = (), *, memory: bool = False
    ) -> None:
        self.memory = memory
        self.name = "fgd2" if memory else "fgd"
        self.tasks = typical_tasks(workload, memory=memory)
        self._memo: dict[tuple[object, ...], float] = {}
        # the last delta: (node, request, node's cpu and memory used, free milli-GPU),
        # device, delta; the node's usage is in the key because it changes between
        # passes over it
        self._pick: tuple[tuple[int, Request, int, int, int], int, float] | None = None

    def _f(self, key: tuple[object, ...]) -> float:
        f = self._memo.get(key)
        if f is None:
            if len(self._memo) >= _MEMO_LIMIT:
                self._memo.clear()
            cpu_free, mem_free, devices = key
            f = fragmentation(cpu_free, devices, self.tasks, mem_free)  # type: ignore[arg-type]
            self._memo[key] = f
        return f

    def delta(self, node: NodeAlloc, req: Request) -> tuple[float, int]:
        """(F_after - F_before, device): the growth of F_n(M) and, for a shared
        request, the device that grows it least (ties: the lowest index)."""
        key = (node.index, req, node.cpu_used, node.mem_used, node.milli_free)
        pick = self._pick
        if pick is not None and pick[0] == key:
            return pick[2], pick[1]
        mem = req.memory if self.memory else None
        before = self._f(_state(node, 0, -1, 0, 0 if self.memory else None))
        device = -1
        if req.gpu_milli:
            best = None
            seen: set[int] = set()
            for i in node.shared_gpus(req):
                left = node.gpu_left[i]
                if left in seen and len({g.model for g in node.node.gpus}) == 1:
                    continue  # same free amount on a same-model device: the same F
                seen.add(left)
                f = self._f(_state(node, req.cpu, i, req.gpu_milli, mem))
                if best is None or f < best:
                    best, device = f, i
            after = before if best is None else best
        elif req.gpu:
            taken = list(node.gpu_left)
            for i in node.matching_gpus(req, free_only=True)[: req.gpu]:
                taken[i] = 0
            cpu_free = node.node.cpu - node.cpu_used - req.cpu
            after = self._f(_key(node, cpu_free, _mem(node, mem), taken))
        else:
            after = self._f(_state(node, req.cpu, -1, 0, mem))
        d = after - before
        self._pick = (key, device, d)
        return d, device

    def _wide(self, req: Request) -> bool:
        """fgd2: a request for two or more whole GPUs (module docstring)."""
        return self.memory and req.gpu >= 2 and not req.gpu_milli

    def window(self, req: Request, candidates: int) -> int:
        """How many feasible nodes the selector scores for ``req`` (0: all)."""
        return candidates * WIDE if self._wide(req) else candidates

    def score(self, node: NodeAlloc, req: Request) -> float:
        if not node.node.gpus:
            return 50.0  # no GPU: no fragment either way
        d, _ = self.delta(node, req)
        x = d / 1000.0
        if x > 50.0:  # exp would overflow; the score is 0 long before
            return 0.0
        if self._wide(req):
            return 100.0 / (1.0 + math.exp(x))
        return float(int(100.0 / (1.0 + math.exp(x))))

    def device(self, node: NodeAlloc, req: Request) -> int | None:
        _, device = self.delta(node, req)
        return device if device >= 0 else None
