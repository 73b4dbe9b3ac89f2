"""Mutable allocation bookkeeping for one planning pass.

A pass builds a :class:`Cluster` from the nodes and the bindings that survive the
release phase, then allocates into it. These are plain ``__slots__`` classes, not
pydantic models: a 150,000-replica pass touches them millions of times.

GPU devices are kept in milli-GPU (1000 a device): a whole-device request takes
wholly free devices, a shared request (``Request.gpu_milli``) takes a share of one
device, so no device is ever allocated above 1000.

**GPU reservation** (``Cluster(gpu_reserve=...)``, per mille): work that asks no
GPU may use a GPU node's cpu and memory only beyond what its free GPUs need, so a
node bought for GPU work cannot be filled by CPU-only replicas and its GPUs
stranded. Each free milli-GPU reserves its share of the node (``cpu / gpus``
per device, scaled by ``gpu_reserve`` / 1000); the reservation shrinks as GPUs
are taken and is gone when they all are. It is part of :meth:`NodeAlloc.fits`,
the one fit kernel (:mod:`forge.core.placement.kernel`) the selector, the
filters and the explanation all use.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from forge.core.models import (
    GPU_MILLI,
    Assignment,
    AssignmentStatus,
    Node,
    NodeState,
    Request,
    workload_id,
)
from forge.core.placement.kernel import fits

__all__ = ["Binding", "Cluster", "NodeAlloc"]


@dataclass(slots=True)
class Binding:
    """One replica held by one node: what it occupies there, exactly."""

    job: str
    group: str
    ordinal: int
    node: str
    gpu_ids: tuple[str, ...]
    cpu: int
    memory: int
    status: AssignmentStatus = AssignmentStatus.PENDING
    #: A shared replica's share of its one device (1..999); 0 = whole devices, which
    #: is what every binding made before sharing existed holds.
    gpu_milli: int = 0
    #: The group version the replica runs (TaskGroup.version); "" = unknown (bound
    #: before rolling updates, or with them off).
    version: str = ""

    @property
    def workload_id(self) -> str:
        return workload_id(self.job, self.group, self.ordinal)

    def to_assignment(self) -> Assignment:
        return Assignment.model_construct(
            workload_id=self.workload_id,
            job=self.job,
            group=self.group,
            ordinal=self.ordinal,
            node=self.node,
            gpu_ids=self.gpu_ids,
            cpu=self.cpu,
            memory=self.memory,
            status=self.status,
            gpu_milli=self.gpu_milli,
            version=self.version,
        )

    @classmethod
    def from_assignment(cls, a: Assignment) -> Binding:
        return cls(
            a.job,
            a.group,
            a.ordinal,
            a.node,
            tuple(a.gpu_ids),
            a.cpu,
            a.memory,
            a.status,
            a.gpu_milli,
            a.version,
        )


@dataclass(slots=True)
class NodeAlloc:
    """A node and what is allocated on it during a pass.

    ``gpu_free[i]``: device i is wholly free; ``gpu_left[i]``: its free milli-GPU;
    ``gpus_used``: devices not wholly free; ``milli_free``: the sum of
    ``gpu_left``. ``res_cpu`` / ``res_mem``: what the free GPUs reserve from work
    that asks no GPU (0 unless the cluster reserves, see the module docstring).
    """

    node: Node
    index: int
    cpu_used: int = 0
    mem_used: int = 0
    gpu_free: list[bool] = field(default_factory=list)
    gpus_used: int = 0
    gpu_left: list[int] = field(default_factory=list)
    milli_free: int = 0
    reserve: int = 0
    res_cpu: int = 0
    res_mem: int = 0

    @property
    def id(self) -> str:
        return self.node.id

    @property
    def schedulable(self) -> bool:
        return self.node.state is NodeState.READY

    @property
    def cpu_free(self) -> int:
        return self.node.cpu - self.cpu_used

    @property
    def mem_free(self) -> int:
        return self.node.memory - self.mem_used

    def matching_gpus(self, req: Request, *, free_only: bool) -> list[int]:
        """Device indexes that satisfy the request's model and memory, in device
        order (``free_only``: wholly free devices only)."""
        out = []
        models = req.gpu_models
        for i, dev in enumerate(self.node.gpus):
            if free_only and not self.gpu_free[i]:
                continue
            if models and dev.model not in models:
                continue
            if dev.memory < req.gpu_memory:
                continue
            out.append(i)
        return out

    def shared_gpus(self, req: Request) -> list[int]:
        """Devices that can take the shared request's share now (model, memory and
        at least ``req.gpu_milli`` free milli-GPU), in device order."""
        milli = req.gpu_milli
        return [i for i in self.matching_gpus(req, free_only=False) if self.gpu_left[i] >= milli]

    def cpu_room(self, req: Request) -> int:
        """Cpu the request may use here: what is free, less the free GPUs'
        reservation when the request asks no GPU."""
        free = self.node.cpu - self.cpu_used
        return free if req.gpu else free - self.res_cpu

    def mem_room(self, req: Request) -> int:
        free = self.node.memory - self.mem_used
        return free if req.gpu else free - self.res_mem

    def fits(self, req: Request) -> bool:
        """:func:`forge.core.placement.kernel.fits`, the one fit kernel."""
        return fits(self, req)

    def allocate(self, req: Request, device: int | None = None) -> tuple[str, ...]:
        """Take the request's resources; returns the exact GPU device ids taken.

        Whole devices: the first free matching ones, so the choice is
        deterministic. A share: ``device`` when a scorer chose one, else the
        tightest device that has room (least free milli-GPU, then device order),
        which keeps wholly free devices whole for multi-GPU work.
        """
        gpu_ids: tuple[str, ...] = ()
        if req.gpu_milli:
            if device is None:
                fit = self.shared_gpus(req)
                if not fit:
                    raise ValueError(f"node {self.id}: no device has {req.gpu_milli} milli free")
                device = min(fit, key=lambda i: (self.gpu_left[i], i))
            elif self.gpu_left[device] < req.gpu_milli:
                raise ValueError(f"node {self.id}: device {device} has too little free")
            self._take(device, req.gpu_milli)
            gpu_ids = (self.node.gpus[device].id,)
        elif req.gpu:
            idx = self.matching_gpus(req, free_only=True)[: req.gpu]
            if len(idx) < req.gpu:
                raise ValueError(f"node {self.id}: not enough free matching gpus")
            for i in idx:
                self._take(i, GPU_MILLI)
            gpu_ids = tuple(self.node.gpus[i].id for i in idx)
        self.cpu_used += req.cpu
        self.mem_used += req.memory
        return gpu_ids

    def hold(self, b: Binding) -> bool:
        """Account an existing binding. False when it does not fit any more (its
        node shrank, or a device id vanished), so the caller releases it. The GPU
        reservation does not apply: it steers new placements, it never evicts."""
        if self.cpu_used + b.cpu > self.node.cpu or self.mem_used + b.memory > self.node.memory:
            return False
        milli = b.gpu_milli if b.gpu_milli else GPU_MILLI
        if b.gpu_milli and len(b.gpu_ids) != 1:
            return False  # a share names exactly one device
        idx = []
        for gid in b.gpu_ids:
            i = self._gpu_index(gid)
            if i is None or self.gpu_left[i] < milli or i in idx:  # unknown, taken or repeated
                return False
            idx.append(i)
        for i in idx:
            self._take(i, milli)
        self.cpu_used += b.cpu
        self.mem_used += b.memory
        return True

    def unhold(self, b: Binding) -> None:
        """Give back what ``hold`` (or ``allocate``) took for ``b``."""
        self.cpu_used -= b.cpu
        self.mem_used -= b.memory
        milli = b.gpu_milli if b.gpu_milli else GPU_MILLI
        for gid in b.gpu_ids:
            i = self._gpu_index(gid)
            if i is None:
                continue
            self.gpu_left[i] += milli
            self.milli_free += milli
            if self.gpu_left[i] >= GPU_MILLI and not self.gpu_free[i]:
                self.gpu_free[i] = True
                self.gpus_used -= 1
        if self.reserve:
            self._reserve()

    def _take(self, i: int, milli: int) -> None:
        if self.gpu_free[i]:
            self.gpu_free[i] = False
            self.gpus_used += 1
        self.gpu_left[i] -= milli
        self.milli_free -= milli
        if self.reserve:
            self._reserve()

    def _reserve(self) -> None:
        """Each free milli-GPU reserves its share of the node's cpu and memory."""
        scale = len(self.node.gpus) * GPU_MILLI * 1000
        self.res_cpu = self.node.cpu * self.milli_free * self.reserve // scale
        self.res_mem = self.node.memory * self.milli_free * self.reserve // scale

    def _gpu_index(self, gid: str) -> int | None:
        for i, dev in enumerate(self.node.gpus):
            if dev.id == gid:
                return i
        return None


class Cluster:
    """All nodes of a pass, indexed, with their allocations.

    ``gpu_reserve`` (per mille, 0 = off): how much of its per-GPU share of cpu and
    memory each free GPU keeps from work that asks no GPU (module docstring).
    """

    __slots__ = ("by_id", "gpu_reserve", "lifted", "nodes", "static")

    def __init__(self, nodes: list[Node], *, gpu_reserve: int = 0) -> None:
        if not 0 <= gpu_reserve <= 1000:
            raise ValueError(f"gpu_reserve is per mille (0..1000), got {gpu_reserve}")
        ordered = sorted(nodes, key=lambda n: n.id)
        self.gpu_reserve = gpu_reserve
        #: a placer lifted the reservation (for the rest of its pass): the cluster is
        #: not what ``gpu_reserve`` says until :meth:`reserve_gpus` restores it
        self.lifted = False
        self.nodes = []
        for i, n in enumerate(ordered):
            self.nodes.append(self._alloc(n, i))
        self.by_id = {a.id: a for a in self.nodes}
        #: What depends only on the nodes, never on what they hold (a placer's
        #: shuffled order, the statically eligible nodes per rule set and why the
        #: others are out), kept across the passes of a carried cluster and
        #: dropped whenever a node changes (:meth:`refresh`). Owned by the placer.
        self.static: dict[object, object] = {}

    def _alloc(self, n: Node, index: int) -> NodeAlloc:
        ngpu = len(n.gpus)
        a = NodeAlloc(
            node=n,
            index=index,
            gpu_free=[True] * ngpu,
            gpu_left=[GPU_MILLI] * ngpu,
            milli_free=GPU_MILLI * ngpu,
            reserve=self.gpu_reserve if ngpu else 0,
        )
        if a.reserve:
            a._reserve()
        return a

    def reserve_gpus(self, gpu_reserve: int) -> None:
        """Make the GPU reservation ``gpu_reserve`` per mille on every GPU node, from
        what the nodes hold now: the state a cluster built with it and holding the
        same bindings has. A carried cluster is brought back to it between passes
        (a pass may lift the reservation, a carry may start without one). O(nodes)
        when it changes anything, free otherwise."""
        if gpu_reserve == self.gpu_reserve and not self.lifted:
            return
        if not 0 <= gpu_reserve <= 1000:
            raise ValueError(f"gpu_reserve is per mille (0..1000), got {gpu_reserve}")
        self.gpu_reserve = gpu_reserve
        self.lifted = False
        for a in self.nodes:
            if not a.node.gpus:
                continue
            a.reserve = gpu_reserve
            if gpu_reserve:
                a._reserve()
            else:
                a.res_cpu = a.res_mem = 0

    def refresh(self, nodes: dict[str, Node], changed: set[str]) -> None:
        """Bring the allocations up to date with ``nodes``: a changed or new node
        starts empty (its holders are re-held by the caller), a removed one goes,
        the rest keep what they hold."""
        for node_id in changed:
            node = nodes.get(node_id)
            if node is None:
                self.by_id.pop(node_id, None)
            else:
                self.by_id[node_id] = self._alloc(node, 0)
        self.nodes = [self.by_id[k] for k in sorted(self.by_id)]
        for i, a in enumerate(self.nodes):
            a.index = i
        self.static = {}

    def __len__(self) -> int:
        return len(self.nodes)
