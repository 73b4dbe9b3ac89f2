"""The node agent's loop: make this machine's processes match its bindings.

Each step heartbeats through the store, reads this node's bindings from the store
(never a workflow query: see docs/architecture.md, "Queries can wedge replay"),
starts what is bound and not running, stops what is running and no longer bound,
and reports what happened as task reports, which the cluster loop reads in batches.

The agent never restarts a replica on its own: an ended replica is reported and
left ended until the loop releases its binding (and, by its reschedule policy,
binds it again here or elsewhere). So a replica runs at most once per binding,
and backoff and restart limits stay the loop's.

A task that declares a ``check`` is checked while its replica runs (``Checker``,
at the check's interval); each change of the replica's verdict (every checked
task passing, or not) is a task report with ``healthy``, in order with the rest.

When the store cannot be read the agent changes nothing: running tasks keep
running and reports queue (``Reporter``) until it is back.

The agent uses the store only through ``AgentStore`` (heartbeat, report, node,
bindings, jobs): all an agent's own PostgreSQL role may do."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from forge.agent.cgroups import Cgroups
from forge.agent.config import AgentConfig
from forge.agent.gpu_usage import BusyMeter
from forge.agent.health import Checker
from forge.agent.logfiles import rotate_if_needed
from forge.agent.peers import Peers, find_node
from forge.agent.reporter import Reporter
from forge.agent.state import StateFile
from forge.agent.supervisor import Event, Supervisor
from forge.agent.usage import UsageSampler
from forge.core.models import Assignment, HealthCheck, Job, Node, NodeState, TaskGroup
from forge.core.taskenv import has_peers, split_devices
from forge.stores.base import AgentStore, TaskReport

__all__ = ["Agent", "ReplicaView", "find_node"]  # find_node: forge.agent.peers

log = structlog.get_logger("forge.agent")

#: Bindings read per store call.
PAGE = 5000


@dataclass(frozen=True)
class ReplicaView:
    """What ``status`` and the log server show of one replica."""

    workload_id: str
    state: str  # running | stopping | failed | exited
    message: str
    ports: dict[str, int]
    cpu: float | None
    memory: float | None


class Agent:
    def __init__(
        self,
        config: AgentConfig,
        store: AgentStore,
        register: Callable[[Node], None],
        *,
        clock: Callable[[], float] = time.time,
        cgroups: Cgroups | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.node = config.node
        self._register = register
        self._clock = clock
        self.supervisor = Supervisor(config.data_dir, config.node.id, config.gpu_uuids, cgroups)
        self.reporter = Reporter(lambda batch: store.report(config.cluster, batch))
        meter = BusyMeter() if config.gpu_uuids else None  # detected, so measurable
        self.sampler = UsageSampler(meter, self.supervisor.replicas)
        self.state = StateFile(config.data_dir / "agent-state.json")
        self._released: set[str] = set()
        self._adopted: set[str] = set()
        self._jobs: dict[str, Job] = {}
        self._last_heartbeat = self._last_usage = -1e18
        self._last_memory_check = self._last_rotate = -1e18
        self._registered = False
        self._saved: list[object] = []
        self.usage: dict[str, tuple[float, float]] = {}
        self.messages: dict[str, str] = {}
        self.store_ok = True
        # health checks: per replica, its checked tasks and the verdict last reported
        self.checker = Checker()
        self._checks: dict[str, list[tuple[str, HealthCheck]]] = {}
        self._healthy: dict[str, bool] = {}
        # the group version each replica was started for: a binding of the same
        # replica on another version (a rolling update) replaces the process
        self._versions: dict[str, str] = {}
        # bound replicas whose start waits for released ones to stop (logged once)
        self._waiting: set[str] = set()
        self.peers = Peers(
            store, config.cluster, lambda: self.node, lambda n: find_node(store, config.cluster, n)
        )
        self._adopt()

    # -- start-up -------------------------------------------------------------------
    def _adopt(self) -> None:
        records = self.state.load()
        self.supervisor.adopt(records, {})
        self._adopted = set(self.supervisor.replicas)
        self.peers.adopt({w: r.peers for w, r in sorted(self.supervisor.replicas.items())})
        if records:
            log.info("agent.adopting", replicas=sorted(self._adopted))

    def set_node(self, node: Node) -> None:
        """The node as registered (the log server's address is known late)."""
        self.node = node

    # -- one step -------------------------------------------------------------------
    def step(self) -> None:
        now = time.monotonic()
        if now - self._last_heartbeat >= self.config.heartbeat_every:
            self._heartbeat_and_register()
            self.peers.forget_addresses()
            self._last_heartbeat = now
        mine = self._my_bindings()
        if mine is not None:
            self._converge(mine)
        for event in self.supervisor.poll():
            self._report(event)
        self._check_health()
        if now - self._last_memory_check >= min(self.config.usage_every, 2.0):
            self._last_memory_check = now
            self._check_memory()
        if now - self._last_usage >= self.config.usage_every:
            self._last_usage = now
            self._report_usage()
        if now - self._last_rotate >= 5.0:
            self._last_rotate = now
            for replica in self.supervisor.replicas.values():
                for t in replica.tasks:
                    rotate_if_needed(t.log, self.config.log_max_bytes, self.config.log_keep)
        self._save_state()
        err = self.reporter.flush()
        if err is not None and self.store_ok:
            log.warning("agent.store_unreachable", error=str(err), queued=len(self.reporter))
        self.store_ok = err is None

    def _heartbeat_and_register(self) -> None:
        cluster, me = self.config.cluster, self.node.id
        try:
            self.store.heartbeat(cluster, me, self._clock())
            stored = find_node(self.store, cluster, me)
        except Exception as err:
            log.warning("agent.heartbeat_failed", error=str(err))
            return
        if stored is not None and stored.state is NodeState.DRAINING:
            return  # an operator's drain: re-registering would undo it
        if stored is not None and stored.state is NodeState.READY and stored == self.node:
            self._registered = True
            return
        why = "new" if stored is None else "lost" if stored.state is NodeState.LOST else "changed"
        try:
            self._register(self.node)
            log.info("agent.registered", node=me, why=why)
        except Exception as err:
            log.warning("agent.register_failed", node=me, error=str(err))

    def _my_bindings(self) -> dict[str, Assignment] | None:
        mine: dict[str, Assignment] = {}
        after = ""
        self.peers.begin_scan()
        try:
            while True:
                page = self.store.assignments(self.config.cluster, after, PAGE)
                for a in page:
                    if a.node == self.node.id:
                        mine[a.workload_id] = a
                    self.peers.see(a)
                if len(page) < PAGE:
                    return mine
                after = page[-1].workload_id
        except Exception as err:
            log.warning("agent.bindings_unreadable", error=str(err))
            return None

    def _group(self, a: Assignment) -> TaskGroup | None:
        job = self._jobs.get(a.job)
        if job is None or not any(g.name == a.group for g in job.groups):
            fresh = self.store.get_job(self.config.cluster, a.job)
            if fresh is None:
                return None
            self._jobs[a.job] = job = fresh
        return next((g for g in job.groups if g.name == a.group), None)

    def _converge(self, mine: dict[str, Assignment]) -> None:
        sup = self.supervisor
        self._jobs = {}  # read afresh each step: a binding may be of a changed spec
        self.peers.prune(set(mine))
        for wid in sorted(set(sup.replicas) - set(mine)):
            why = "adopted, not bound here" if wid in self._adopted else "binding released"
            self._retire(wid, why)
        for wid, a in sorted(mine.items()):
            replica = sup.replicas.get(wid)
            if replica is not None and self._versions.setdefault(wid, a.version) != a.version:
                # bound again on another version (a rolling update): stop, then start
                if not self._retire(wid, f"new version {a.version}"):
                    continue
                replica = None
            if replica is not None and self.peers.moved(a):
                # a peer moved: told again by a restart (it cannot learn them running)
                if not self._retire(wid, "its peers moved"):
                    continue
                replica = None
            if replica is not None:
                replica.rebind(a.cpu, a.memory, tuple(a.gpu_ids), a.gpu_milli)
                if wid not in self._checks:  # adopted: its checks are learnt here
                    try:
                        adopted = self._group(a)
                    except Exception as err:
                        log.warning("agent.job_unreadable", job=a.job, error=str(err))
                        continue
                    if adopted is not None:
                        self._checks[wid] = _checks_of(adopted)
                continue
            try:
                group = self._group(a)
            except Exception as err:
                log.warning("agent.job_unreadable", job=a.job, error=str(err))
                continue
            if group is None:
                continue  # the job is gone: the loop releases the binding next
            if not self._room_for(a):
                continue  # replicas still stopping hold its room: started once they end
            peers = self.peers.env(a, group) if has_peers(group) else {}
            if peers is None:
                continue  # a member is not bound yet: started once all are
            self._forget_checks(wid)
            self._checks[wid] = _checks_of(group)
            self._versions[wid] = a.version
            devices = split_devices(group, a.gpu_ids, a.gpu_milli)
            event = sup.start(wid, group, a.cpu, a.memory, devices, peers, self.peers.told(wid))
            log.info("agent.started", workload=wid, status=event.status, message=event.message)
            self._report(event)

    def _room_for(self, a: Assignment) -> bool:
        """Can ``a`` start now without the node's processes holding more than its
        capacity? Replicas released but still in their ``stop_grace`` (a preemption's
        victims, a drain's) count until their processes end, so the replica bound in
        their place starts after them. Only the stopping ones can hold it back: the
        loop never binds more than the node holds."""
        cpu = mem = 0
        stopping = False
        for r in self.supervisor.replicas.values():
            if all(t.finished() for t in r.tasks):
                continue
            cpu, mem = cpu + r.cpu, mem + r.memory
            stopping = stopping or r.stopping_since is not None
        fits = cpu + a.cpu <= self.node.cpu and mem + a.memory <= self.node.memory
        if not fits and stopping:
            if a.workload_id not in self._waiting:
                self._waiting.add(a.workload_id)
                log.info("agent.start_waits", workload=a.workload_id, why="replicas stopping")
            return False
        self._waiting.discard(a.workload_id)
        return True

    def _report(self, event: Event) -> None:
        if event.workload_id in self._released:
            return  # stopped because it was released: the loop already knows
        self.messages[event.workload_id] = event.message
        if event.status != "running":
            log.info("agent.replica_ended", workload=event.workload_id, message=event.message)
        self.reporter.transition(
            TaskReport(
                workload_id=event.workload_id,
                status=event.status,
                at=self._clock(),
                message=event.message[:1024],
                node=self.node.id,
                exit_code=event.exit_code,
            )
        )

    def _retire(self, wid: str, why: str) -> bool:
        """Stop a replica that is no longer bound as it runs; True once it has
        stopped and is forgotten."""
        sup = self.supervisor
        if wid not in self._released:
            self._released.add(wid)
            log.info("agent.stopping", workload=wid, why=why)
            sup.stop(wid)
        if not sup.stopped(wid):
            return False
        self._forget_checks(wid)
        sup.forget(wid)
        self.sampler.forget(wid)
        self.usage.pop(wid, None)
        self._versions.pop(wid, None)
        self.peers.forget(wid)
        self._released.discard(wid)
        self._adopted.discard(wid)
        return True

    def _forget_checks(self, wid: str) -> None:
        for name, _ in self._checks.pop(wid, []):
            self.checker.forget(f"{wid}/{name}")
        self._healthy.pop(wid, None)

    def _check_health(self) -> None:
        """Run the checks that are due; report each replica whose verdict changed."""
        now = time.monotonic()
        for wid in self._running():
            checks = self._checks.get(wid)
            if not checks or wid in self._released:
                continue
            replica = self.supervisor.replicas[wid]
            for name, check in checks:
                self.checker.tick(f"{wid}/{name}", check, replica.ports, now)
            failing = [n for n, _ in checks if not self.checker.verdict.get(f"{wid}/{n}")]
            ok = not failing
            if self._healthy.get(wid) is ok:
                continue
            self._healthy[wid] = ok
            log.info("agent.health", workload=wid, healthy=ok, failing=failing)
            self.reporter.transition(
                TaskReport(
                    workload_id=wid,
                    status="running",
                    at=self._clock(),
                    message="health check passed"
                    if ok
                    else f"health check failing: {', '.join(failing)}",
                    node=self.node.id,
                    healthy=ok,
                )
            )

    def _running(self) -> list[str]:
        return [
            wid
            for wid, r in sorted(self.supervisor.replicas.items())
            if r.outcome is None and r.stopping_since is None
        ]

    def _check_memory(self) -> None:
        """Without a cgroup to enforce it, the agent enforces the memory request."""
        if self.supervisor.cgroups is not None:
            return  # the kernel does (memory.max)
        for wid in self._running():
            replica = self.supervisor.replicas[wid]
            used = self.sampler.memory_mib(replica)
            if replica.memory and used > replica.memory:
                reason = f"over its memory limit: {used} MiB used, limit {replica.memory} MiB"
                log.warning("agent.memory_limit", workload=wid, used=used, limit=replica.memory)
                self.supervisor.stop(wid, reason)

    def _report_usage(self) -> None:
        for wid in self._running():
            sample = self.sampler.sample(self.supervisor.replicas[wid])
            if sample is None:
                continue
            self.usage[wid] = (sample.cpu, sample.memory)
            self.reporter.usage(
                TaskReport(
                    workload_id=wid,
                    status="running",
                    cpu=sample.cpu,
                    memory=sample.memory,
                    gpu=sample.gpu,
                    at=self._clock(),
                    # the ports too: ``forge status`` reads the latest usage report
                    message=sample.describe(self.supervisor.replicas[wid].ports),
                    node=self.node.id,
                )
            )

    def _save_state(self) -> None:
        records = self.supervisor.records()
        if records != self._saved:
            self.state.save(records)
            self._saved = list(records)

    # -- views ----------------------------------------------------------------------
    def views(self) -> list[ReplicaView]:
        out = []
        for wid, r in sorted(self.supervisor.replicas.items()):
            state = r.outcome[0] if r.outcome else "stopping" if r.stopping_since else "running"
            cpu, memory = self.usage.get(wid, (None, None))
            message = r.outcome[1] if r.outcome else self.messages.get(wid, "")
            out.append(ReplicaView(wid, state, message, r.ports, cpu, memory))
        return out

    def shutdown(self, stop_tasks: bool, timeout: float = 15.0) -> None:
        """Leave: by default the tasks keep running for the next agent to adopt."""
        if stop_tasks:
            self.supervisor.stop_all(timeout)
        self._save_state()
        self.reporter.flush()


def _checks_of(group: TaskGroup) -> list[tuple[str, HealthCheck]]:
    return [(t.name, t.check) for t in group.tasks if t.check is not None]
