"""Mutable allocation bookkeeping for one planning pass.

A pass builds a :class:`Cluster` from the nodes and the bindings that survive the
release phase, then allocates into it. These are plain ``__slots__`` classes, not
pydantic models: a 150,000-replica pass touches them millions of times.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from forge.models import Assignment, AssignmentStatus, Node, NodeState, Request, workload_id

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
        )

    @classmethod
    def from_assignment(cls, a: Assignment) -> Binding:
        return cls(a.job, a.group, a.ordinal, a.node, tuple(a.gpu_ids), a.cpu, a.memory, a.status)


@dataclass(slots=True)
class NodeAlloc:
    """A node and what is allocated on it during a pass."""

    node: Node
    index: int
    cpu_used: int = 0
    mem_used: int = 0
    gpu_free: list[bool] = field(default_factory=list)
    gpus_used: int = 0

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
        """Device indexes that satisfy the request's model and memory, in device order."""
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

    def fits(self, req: Request) -> bool:
        if self.node.cpu - self.cpu_used < req.cpu or self.node.memory - self.mem_used < req.memory:
            return False
        if req.gpu:
            if len(self.node.gpus) - self.gpus_used < req.gpu:
                return False
            return len(self.matching_gpus(req, free_only=True)) >= req.gpu
        return True

    def allocate(self, req: Request) -> tuple[str, ...]:
        """Take the request's resources; returns the exact GPU device ids taken
        (the first free matching devices, so the choice is deterministic)."""
        gpu_ids: tuple[str, ...] = ()
        if req.gpu:
            idx = self.matching_gpus(req, free_only=True)[: req.gpu]
            if len(idx) < req.gpu:
                raise ValueError(f"node {self.id}: not enough free matching gpus")
            for i in idx:
                self.gpu_free[i] = False
            self.gpus_used += len(idx)
            gpu_ids = tuple(self.node.gpus[i].id for i in idx)
        self.cpu_used += req.cpu
        self.mem_used += req.memory
        return gpu_ids

    def hold(self, b: Binding) -> bool:
        """Account an existing binding. False when it does not fit any more (its
        node shrank, or a device id vanished), so the caller releases it."""
        if self.cpu_used + b.cpu > self.node.cpu or self.mem_used + b.memory > self.node.memory:
            return False
        idx = []
        for gid in b.gpu_ids:
            i = self._gpu_index(gid)
            if i is None or not self.gpu_free[i] or i in idx:  # unknown, taken or repeated
                return False
            idx.append(i)
        for i in idx:
            self.gpu_free[i] = False
        self.gpus_used += len(idx)
        self.cpu_used += b.cpu
        self.mem_used += b.memory
        return True

    def unhold(self, b: Binding) -> None:
        """Give back what ``hold`` (or ``allocate``) took for ``b``."""
        self.cpu_used -= b.cpu
        self.mem_used -= b.memory
        for gid in b.gpu_ids:
            i = self._gpu_index(gid)
            if i is not None and not self.gpu_free[i]:
                self.gpu_free[i] = True
                self.gpus_used -= 1

    def _gpu_index(self, gid: str) -> int | None:
        for i, dev in enumerate(self.node.gpus):
            if dev.id == gid:
                return i
        return None


class Cluster:
    """All nodes of a pass, indexed, with their allocations."""

    __slots__ = ("by_id", "nodes")

    def __init__(self, nodes: list[Node]) -> None:
        ordered = sorted(nodes, key=lambda n: n.id)
        self.nodes = [
            NodeAlloc(node=n, index=i, gpu_free=[True] * len(n.gpus)) for i, n in enumerate(ordered)
        ]
        self.by_id = {a.id: a for a in self.nodes}

    def refresh(self, nodes: dict[str, Node], changed: set[str]) -> None:
        """Bring the allocations up to date with ``nodes``: a changed or new node
        starts empty (its holders are re-held by the caller), a removed one goes,
        the rest keep what they hold."""
        for node_id in changed:
            node = nodes.get(node_id)
            if node is None:
                self.by_id.pop(node_id, None)
            else:
                self.by_id[node_id] = NodeAlloc(
                    node=node, index=0, gpu_free=[True] * len(node.gpus)
                )
        self.nodes = [self.by_id[k] for k in sorted(self.by_id)]
        for i, a in enumerate(self.nodes):
            a.index = i

    def __len__(self) -> int:
        return len(self.nodes)
