"""Hard limits (cgroup v2): each replica in a cgroup of its own with its request as
``memory.max`` and ``cpu.max``, its tasks inside before they run their command, a
kernel OOM kill reported as "out of memory"; the sampling fallback where the machine
has no delegated cgroup v2, said plainly.

The kernel's cgroupfs is stood in for by a directory of plain files (what the agent
writes there is what it would write to the kernel); the last test uses the machine's
own cgroup v2 where it has one, and says which controller or right is missing where
it has not."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from forge.agent.cgroups import cpu_max, memory_max
from forge.agent.limits import cgroup_problem, hard_limits, limits_notice
from forge.agent.shim import is_shim
from forge.agent.supervisor import Event, Supervisor
from forge.core.models import TaskGroup

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]


def _fake_root(tmp: Path, controllers: str = "cpuset cpu io memory pids") -> Path:
    root = tmp / "cgroup"
    root.mkdir(parents=True)
    (root / "cgroup.controllers").write_text(controllers + "\n")
    (root / "cgroup.subtree_control").write_text("")
    return root


def _group(command: list[str], cpu: int = 500, memory: int = 64) -> TaskGroup:
    return TaskGroup.model_validate(
        {
            "name": "g",
            "tasks": [
                {
                    "name": "t",
                    "command": command,
                    "resources": {"cpu": cpu, "memory": memory},
                    "stop_grace": 1.0,
                }
            ],
        }
    )


def _until(pred: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError("condition not reached")


def test_the_limits_are_the_request() -> None:
    assert memory_max(64) == str(64 * 1024 * 1024)
    assert memory_max(0) == "max"
    assert cpu_max(500) == "50000 100000"  # half a core of every 100 ms
    assert cpu_max(2000) == "200000 100000"
    assert cpu_max(1) == "1000 100000"  # the kernel's minimum quota
    assert cpu_max(0) == "max 100000"


def test_a_delegated_hierarchy_gives_hard_limits_and_the_rest_say_why(tmp_path: Path) -> None:
    root = _fake_root(tmp_path)
    cgroups, line = hard_limits("n1", root)
    assert cgroups is not None and line.startswith("hard limits: cgroup v2 under")
    assert cgroups.base == root / "forge-n1" and cgroups.base.is_dir()
    assert (root / "cgroup.subtree_control").read_text() == "+cpu +memory"
    no_memory = _fake_root(tmp_path / "b", "cpu io pids")
    assert hard_limits("n1", no_memory)[0] is None
    assert "controllers not available: memory" in hard_limits("n1", no_memory)[1]
    assert "no cgroup v2 hierarchy" in hard_limits("n1", tmp_path / "none")[1]


def _delegated(tmp: Path, controllers: str = "cpu memory pids") -> tuple[Path, Path, Path]:
    """A hierarchy whose root the agent may not write (no ``cgroup.subtree_control``
    there for it) and the agent's own cgroup, delegated to it as systemd's
    ``Delegate=yes`` does; and the stand-in for /proc/self/cgroup naming it."""
    root = tmp / "cgroup"
    own = root / "system.slice" / "forge-agent.service"
    own.mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (own / "cgroup.controllers").write_text(controllers + "\n")
    (own / "cgroup.subtree_control").write_text("")
    (own / "cgroup.procs").write_text(f"{os.getpid()}\n")
    proc = tmp / "self-cgroup"
    proc.write_text("0::/system.slice/forge-agent.service\n")
    return root, own, proc


def test_a_delegated_own_cgroup_holds_the_subtree_with_the_agent_moved_to_a_leaf(
    tmp_path: Path,
) -> None:
    """Not root on the hierarchy, but a service given its cgroup (systemd's
    ``Delegate=yes``): the subtree goes there, and the agent's processes move to a
    leaf first (cgroup v2 enables controllers for children of a cgroup with none)."""
    root, own, proc = _delegated(tmp_path)
    cgroups, line = hard_limits("n1", root, proc)
    assert cgroups is not None, line
    assert cgroups.base == own / "forge-n1" and cgroups.base.is_dir()
    assert (own / "forge-agent" / "cgroup.procs").read_text() == str(os.getpid())
    assert (own / "cgroup.subtree_control").read_text() == "+cpu +memory"
    assert not (root / "cgroup.subtree_control").exists()  # the root is left alone
    assert f"under {own / 'forge-n1'}" in line
    assert limits_notice(root, proc).endswith(f"delegated, under {own}")


def test_an_own_cgroup_not_delegated_or_delegated_without_a_controller_says_so(
    tmp_path: Path,
) -> None:
    root, own, proc = _delegated(tmp_path / "a")
    (own / "cgroup.subtree_control").unlink()  # not the agent's to write
    cgroups, line = hard_limits("n1", root, proc)
    assert cgroups is None and "Delegate=yes" in line and "enforced by sampling" in line
    root, own, proc = _delegated(tmp_path / "b", controllers="cpu pids")
    assert cgroup_problem(root, proc) == f"its own cgroup {own} was delegated without: memory"
    root, _, proc = _delegated(tmp_path / "c")
    proc.write_text("0::/\n")  # in the root itself (a container's namespace)
    assert "is not writable by the agent (no delegation)" in (cgroup_problem(root, proc) or "")


@pytest.mark.parametrize("delegated", [False, True], ids=["root", "delegated"])
def test_a_replica_runs_inside_its_cgroup_with_its_request(tmp_path: Path, delegated: bool) -> None:
    if delegated:
        root, _, proc = _delegated(tmp_path)
        cgroups, _ = hard_limits("n1", root, proc)
    else:
        cgroups, _ = hard_limits("n1", _fake_root(tmp_path))
    sup = Supervisor(tmp_path / "data", "n1", cgroups=cgroups)
    try:
        event = sup.start("web/g/0", _group(SLEEP), cpu=500, memory=64)
        assert event.status == "running", event
        path = cgroups.path("web/g/0") if cgroups else Path()
        assert (path / "memory.max").read_text() == str(64 * 1024 * 1024)
        assert (path / "cpu.max").read_text() == "50000 100000"
        pid = sup.replicas["web/g/0"].tasks[0].pid
        # the task joined before running its command: the pid the shell wrote is
        # the task's own (exec keeps it)
        _until(lambda: _read(path / "cgroup.procs").strip() == str(pid))
        _until(lambda: "time.sleep" in " ".join(_cmdline(pid)))
    finally:
        sup.stop_all(10)


def test_a_kernel_oom_kill_is_reported_as_out_of_memory(tmp_path: Path) -> None:
    cgroups, _ = hard_limits("n1", _fake_root(tmp_path))
    assert cgroups is not None
    sup = Supervisor(tmp_path / "data", "n1", cgroups=cgroups)
    try:
        sup.start("web/g/0", _group(SLEEP), cpu=500, memory=64)
        pid = sup.replicas["web/g/0"].tasks[0].pid
        path = cgroups.path("web/g/0")
        (path / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
        # the kernel's SIGKILL; sent to the replica's process group (its shim and the
        # task), so the task is not left running whether or not the shim had started it
        os.killpg(pid, signal.SIGKILL)
        events = _events(sup)
        assert [(e.status, e.message) for e in events] == [
            ("failed", "out of memory: over its memory.max of 64 MiB")
        ]
    finally:
        sup.stop_all(10)


def test_without_cgroups_a_task_runs_as_it_is(tmp_path: Path) -> None:
    sup = Supervisor(tmp_path / "data", "n1")
    try:
        sup.start("web/g/0", _group(SLEEP), cpu=500, memory=64)
        pid = sup.replicas["web/g/0"].tasks[0].pid
        _until(lambda: "time.sleep" in " ".join(_cmdline(pid)))
        assert is_shim(_cmdline(pid))  # its exit-status shim (forge.agent.shim) only:
        assert "cgroup.procs" not in " ".join(_cmdline(pid))  # no cgroup to join
    finally:
        sup.stop_all(10)


def test_on_this_machine_the_limits_hold_or_the_agent_says_why_not(tmp_path: Path) -> None:
    """With a delegated cgroup v2 here, a replica over its memory is killed by the
    kernel and reported; without one, the agent falls back and names what is missing."""
    problem = cgroup_problem()
    cgroups, line = hard_limits(f"test-{os.getpid()}")
    if problem is not None:
        assert cgroups is None and problem in line and "enforced by sampling" in line
        return
    assert cgroups is not None, line
    sup = Supervisor(tmp_path / "data", "n1", cgroups=cgroups)
    hog = [sys.executable, "-c", "b = bytearray(256 * 1024 * 1024); import time; time.sleep(60)"]
    try:
        sup.start("hog/g/0", _group(hog, memory=64), cpu=500, memory=64)
        assert "out of memory" in _events(sup, timeout=30)[0].message
    finally:
        sup.stop_all(10)
        sup.forget("hog/g/0")
        cgroups.base.rmdir()


def _events(sup: Supervisor, timeout: float = 10.0) -> list[Event]:
    """The first events the supervisor reports (polled until there are some)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        events = sup.poll()
        if events:
            return events
        time.sleep(0.05)
    raise AssertionError("no event")


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    except OSError:
        return []
