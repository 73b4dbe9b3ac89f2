"""The processes of the replicas bound to this node: start, watch, stop, adopt.

Each task runs in its own session (so in its own process group): stopping a replica
signals the whole group, a shell's children included, and the agent's own signals
(a Ctrl-C in its terminal) do not reach the tasks. A replica is one unit: when
one of its tasks ends, the others are stopped and the replica is reported once.

The supervisor never decides what should run; the agent tells it (``start``,
``stop``) from the bindings it reads, and it reports what happened (``poll``).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from forge.agent.cgroups import Cgroups
from forge.agent.logfiles import log_path
from forge.agent.shim import exit_path, read_exit, shimmed, unstartable
from forge.agent.state import ProcessRecord, alive
from forge.core.models import STOP_GRACE, TaskGroup
from forge.core.taskenv import MASTER_PORTS, TaskDevices, device_env

__all__ = ["Event", "Replica", "Supervisor", "TaskProc"]


@dataclass
class TaskProc:
    name: str
    pid: int
    started: float
    log: Path
    ports: dict[str, int] = field(default_factory=dict)
    popen: subprocess.Popen[bytes] | None = None  # None when adopted from a previous agent
    exit_code: int | None = None
    gone: bool = False

    def finished(self) -> bool:
        if self.gone:
            return True
        if self.popen is not None:
            code = self.popen.poll()
            if code is not None:
                self.exit_code, self.gone = code, True
        elif not alive(self.pid, self.started):  # adopted: its shim kept its status
            self.exit_code, self.gone = read_exit(exit_path(self.log)), True
        return self.gone

    def describe_exit(self) -> str:
        if self.exit_code is None:
            return f"task {self.name} ended while the agent was away (exit status unknown)"
        if self.exit_code < 0:
            name = signal.Signals(-self.exit_code).name
            return f"task {self.name} was killed by {name}"
        return f"task {self.name} exited with status {self.exit_code}"


@dataclass
class Replica:
    workload_id: str
    node: str
    tasks: list[TaskProc]
    cpu: int  # the binding's request: millicores
    memory: int  # MiB
    grace: float = STOP_GRACE
    stopping_since: float | None = None
    #: Set once the replica has ended; the agent reports it and keeps the tombstone
    #: until the binding goes away (a failed replica is restarted by the loop's
    #: policy through a new binding, never by the agent on its own).
    outcome: tuple[str, str] | None = None
    #: Why the agent stops it, when it does (memory limit): reported instead of
    #: the signal that ended it.
    stop_reason: str = ""
    #: The binding's devices and share (the agent keeps them current): what its
    #: GPU utilisation is measured on.
    gpu_ids: tuple[str, ...] = ()
    gpu_milli: int = 0
    #: the peers a gang member was told (ordinal -> node; forge.agent.peers)
    peers: dict[int, str] = field(default_factory=dict)

    def rebind(self, cpu: int, memory: int, gpu_ids: tuple[str, ...], gpu_milli: int) -> None:
        """The binding's request, read again each step (an adopted replica learns it)."""
        self.cpu, self.memory, self.gpu_ids, self.gpu_milli = cpu, memory, gpu_ids, gpu_milli

    @property
    def ports(self) -> dict[str, int]:
        return {k: v for t in self.tasks for k, v in t.ports.items()}


@dataclass(frozen=True)
class Event:
    workload_id: str
    status: str  # running | failed | exited
    message: str
    #: the exit status of the task whose end ended the replica, when its own exit
    #: ended it (not a stop the agent made, not a failed start; None: unknown)
    exit_code: int | None = None


#: Nomad's default dynamic port range: below Linux's ephemeral range (32768-60999), so a
#: port handed to a task is not one the kernel is about to give another socket's bind(0).
DYNAMIC_PORTS = range(20000, 32000)


def free_port(taken: set[int]) -> int:
    """A TCP port free right now on every interface and not in ``taken`` (added to it),
    nor one a gang's rank 0 may be told to listen on (``MASTER_PORTS``).

    Random in the dynamic range rather than the kernel's bind(0): two agents on one host
    asking bind(0) a moment apart are often given the same just-closed port, and the task
    that binds second fails (seen in CI with three agents on one machine).
    """
    for _ in range(200):
        port = random.choice(DYNAMIC_PORTS)
        if port in taken or port in MASTER_PORTS:  # a gang's rank 0 listens there
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
        taken.add(port)
        return port
    raise OSError(f"no free port in {DYNAMIC_PORTS.start}-{DYNAMIC_PORTS.stop - 1}")


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)  # the task is its session's leader: pgid == pid


def _problem(task: str, argv: list[str], env: Mapping[str, str], cwd: Path) -> str:
    """Why a task cannot start ("" when it can)."""
    if not argv:
        return f"task {task} has no command"
    why = unstartable(argv[0], env, cwd)
    return f"task {task}: cannot start {argv[0]!r}: {why}" if why else ""


def _launch(argv: list[str], jail: Path | None, log: Path) -> list[str]:
    """``argv`` under its shim (forge.agent.shim), in its cgroup when it has one; a
    status an earlier run of the replica left is removed first."""
    exit_path(log).unlink(missing_ok=True)
    shim = shimmed(argv, exit_path(log))
    return shim if jail is None else Cgroups.wrap(jail, shim)


class Supervisor:
    def __init__(
        self,
        data_dir: Path,
        node: str,
        gpu_uuids: Mapping[str, str] | None = None,
        cgroups: Cgroups | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.node = node
        #: Hard limits (cgroup v2) when the machine allows; None: the agent samples.
        self.cgroups = cgroups
        #: Registered device id -> the UUID detected for it (what CUDA reads).
        self.gpu_uuids = dict(gpu_uuids or {})
        self.replicas: dict[str, Replica] = {}

    # -- starting -----------------------------------------------------------------
    def start(
        self,
        workload_id: str,
        group: TaskGroup,
        cpu: int,
        memory: int,
        devices: Mapping[str, TaskDevices] | None = None,
        peers: Mapping[str, str] | None = None,
        told: Mapping[int, str] | None = None,
    ) -> Event:
        """Start every task of a replica; a task that cannot start (no such
        command) fails the replica with the OS error, and its started siblings
        are stopped. ``devices`` (:func:`forge.core.taskenv.split_devices`) are each
        task's GPUs: a task left out sees none; ``peers``
        (:func:`forge.core.taskenv.peer_env`) go to every task, and ``told``, the
        members they name (ordinal -> node), is kept with its processes."""
        taken = {p for r in self.replicas.values() for p in r.ports.values()}
        grace = max((t.stop_grace for t in group.tasks), default=STOP_GRACE)
        replica = Replica(workload_id, self.node, [], cpu, memory, grace, peers=dict(told or {}))
        self.replicas[workload_id] = replica
        ports = {name: free_port(taken) for t in group.tasks for name in t.ports}
        jail = self.cgroups.create(workload_id, cpu, memory) if self.cgroups else None
        for task in group.tasks:
            argv = [*(task.command or ()), *task.args]
            log = log_path(self.data_dir, workload_id, task.name)
            log.parent.mkdir(parents=True, exist_ok=True)
            workdir = self.data_dir / "work" / workload_id / task.name
            workdir.mkdir(parents=True, exist_ok=True)
            granted = (devices or {}).get(task.name, TaskDevices())
            env = {
                **os.environ,
                **task.env,
                **device_env(granted, self.gpu_uuids),
                **(peers or {}),
                "FORGE_WORKLOAD_ID": workload_id,
                "FORGE_TASK": task.name,
                "FORGE_NODE": self.node,
                **{f"FORGE_PORT_{name.upper()}": str(port) for name, port in ports.items()},
            }
            problem = _problem(task.name, argv, env, workdir)
            if not problem:
                try:
                    with log.open("ab") as out:
                        popen = subprocess.Popen(
                            _launch(argv, jail, log),
                            cwd=workdir,
                            env=env,
                            stdin=subprocess.DEVNULL,
                            stdout=out,
                            stderr=subprocess.STDOUT,
                            start_new_session=True,
                        )
                except OSError as err:
                    problem = f"task {task.name}: cannot start {argv[0]!r}: {err.strerror}"
            if problem:
                with log.open("ab") as out:
                    out.write(f"forge agent: {problem}\n".encode())
                self._begin_stop(replica, time.monotonic())
                replica.outcome = ("failed", problem)
                return Event(workload_id, "failed", problem)
            replica.tasks.append(
                TaskProc(
                    task.name,
                    popen.pid,
                    _create_time(popen.pid),
                    log,
                    {p: ports[p] for p in task.ports},
                    popen,
                )
            )
        shown = " ".join(f"{k}={v}" for k, v in sorted(ports.items()))
        return Event(workload_id, "running", f"started{' ports ' + shown if shown else ''}")

    def adopt(self, records: list[ProcessRecord], requests: dict[str, tuple[int, int]]) -> None:
        """Take over the processes a previous agent on this node started. A replica
        with a dead task is adopted too: ``poll`` then reports it ended."""
        by_replica: dict[str, list[ProcessRecord]] = {}
        for r in records:
            by_replica.setdefault(r.workload_id, []).append(r)
        for wid, recs in sorted(by_replica.items()):
            cpu, memory = requests.get(wid, (0, 0))
            tasks = [
                TaskProc(r.task, r.pid, r.started, log_path(self.data_dir, wid, r.task), r.ports)
                for r in recs
            ]
            told = {int(k): v for k, v in recs[0].peers.items()}
            self.replicas[wid] = Replica(
                wid, recs[0].node or self.node, tasks, cpu, memory, peers=told
            )

    def records(self) -> list[ProcessRecord]:
        return [
            ProcessRecord(
                r.workload_id,
                t.name,
                t.pid,
                t.started,
                t.ports,
                r.node,
                {str(k): v for k, v in sorted(r.peers.items())},
            )
            for r in self.replicas.values()
            for t in r.tasks
            if not t.finished()
        ]

    # -- watching -----------------------------------------------------------------
    def poll(self) -> list[Event]:
        """Advance every replica: escalate stops past their grace, notice ends."""
        now = time.monotonic()
        events = []
        for wid, replica in sorted(self.replicas.items()):
            done = [t for t in replica.tasks if t.finished()]
            overdue = replica.stopping_since is not None and (
                now - replica.stopping_since > replica.grace
            )
            if overdue and len(done) < len(replica.tasks):
                for t in replica.tasks:
                    if not t.finished():
                        _signal_group(t.pid, signal.SIGKILL)
            if replica.outcome is None and done:
                # the status that decides: a task's failure, whatever ended first
                first, code = next((t for t in done if t.exit_code != 0), done[0]), None
                if replica.stop_reason:
                    outcome = ("failed", replica.stop_reason)
                elif self.cgroups is not None and self.cgroups.oom_killed(wid):
                    outcome = (
                        "failed",
                        f"out of memory: over its memory.max of {replica.memory} MiB",
                    )
                elif first.exit_code == 0 and len(done) == len(replica.tasks):
                    outcome, code = ("exited", first.describe_exit()), 0
                else:
                    outcome, code = ("failed", first.describe_exit()), first.exit_code
                replica.outcome = outcome
                events.append(Event(wid, *outcome, exit_code=code))
                if len(done) < len(replica.tasks):
                    self._begin_stop(replica, now)
        return events

    # -- stopping -----------------------------------------------------------------
    def stop(self, workload_id: str, reason: str = "") -> None:
        replica = self.replicas.get(workload_id)
        if replica is None or replica.stopping_since is not None:
            return
        replica.stop_reason = replica.stop_reason or reason
        self._begin_stop(replica, time.monotonic())

    def _begin_stop(self, replica: Replica, now: float) -> None:
        replica.stopping_since = now
        for t in replica.tasks:
            if not t.finished():
                _signal_group(t.pid, signal.SIGTERM)

    def stopped(self, workload_id: str) -> bool:
        replica = self.replicas.get(workload_id)
        return replica is None or all(t.finished() for t in replica.tasks)

    def forget(self, workload_id: str) -> None:
        """Drop a replica whose processes are all gone (and its cgroup)."""
        self.replicas.pop(workload_id, None)
        if self.cgroups is not None:
            self.cgroups.remove(workload_id)

    def stop_all(self, timeout: float) -> None:
        """Stop everything and wait (the agent's own shutdown when asked to)."""
        for wid in list(self.replicas):
            self.stop(wid)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not all(map(self.stopped, self.replicas)):
            self.poll()
            time.sleep(0.05)


def _create_time(pid: int) -> float:
    import psutil

    try:
        return float(psutil.Process(pid).create_time())
    except psutil.NoSuchProcess:
        return 0.0
