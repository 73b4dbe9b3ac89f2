"""The shell each task runs under, so its exit status outlives the agent.

A task the agent started is its child: the agent reads its exit status from
``waitpid``. An agent killed (``kill -9``, an upgrade) and started again adopts the
tasks still running from its state file, but they are no longer its children: when
one ends, its status goes to whoever reaps it, not to the agent. For a service
that is a restart either way; for a batch run it is the difference between
**complete** (exit 0: never run again) and **failed** (run again, an attempt spent;
with one attempt, the job failed). Nomad keeps an executor process per task for
this; conmon and containerd's shim do the same for containers.

Here the shim is ``/bin/sh`` (a megabyte, no Python): it runs the task as its
child, and when the task ends writes the status to the task's exit file (atomically:
a temporary file renamed) and ends the same way, re-raising the signal that killed
the task so the agent that started it still reads "killed by SIGKILL". It traps
HUP, INT, TERM and QUIT only to outlive the stop signal the agent sends the
process group (the task, its child, gets the signal and its default handling), and
clears the traps before re-raising. A status above 128 is what a shell reports for
a task killed by signal ``status - 128``, and is read as that signal (as every
shell, and Kubernetes' 137, read it).
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["exit_path", "is_shim", "read_exit", "shimmed", "unstartable"]

_SHIM = (
    "trap : HUP INT TERM QUIT; "
    '"$@"; code=$?; '
    'printf "%s\\n" "$code" > "$0.tmp" 2>/dev/null && mv -f "$0.tmp" "$0" 2>/dev/null; '
    "trap - HUP INT TERM QUIT; "
    'if [ "$code" -gt 128 ]; then kill -"$((code - 128))" "$$"; fi; '
    'exit "$code"'
)


def exit_path(log: Path) -> Path:
    """Where a task's shim writes its status: beside its log (``<task>.exit``)."""
    return log.with_suffix(".exit")


def shimmed(argv: list[str], exit_file: Path) -> list[str]:
    """``argv`` run under the shim that keeps its status in ``exit_file``."""
    return ["/bin/sh", "-c", _SHIM, str(exit_file), *argv]


def is_shim(cmdline: Sequence[str]) -> bool:
    """Whether a process (by its command line) is a task's shim rather than the task:
    for whoever lists a node's task processes (they share the task's environment)."""
    return len(cmdline) > 2 and cmdline[1] == "-c" and cmdline[2] == _SHIM


def read_exit(exit_file: Path) -> int | None:
    """The status a shim kept (negative: killed by that signal); None when it kept
    none (the shim was killed too, or the task predates shims)."""
    try:
        code = int(exit_file.read_text().strip())
    except (OSError, ValueError):
        return None
    return -(code - 128) if code > 128 else code


def unstartable(argv0: str, env: Mapping[str, str], cwd: Path) -> str | None:
    """Why ``argv0`` could not be executed (the OS's words), None when it can:
    checked before the shim starts it, so a typo still fails the replica as "cannot
    start", not as a shell's exit 127."""
    if "/" not in argv0:
        found = shutil.which(argv0, path=env.get("PATH", os.defpath))
        return None if found else os.strerror(errno.ENOENT)
    path = Path(argv0) if os.path.isabs(argv0) else cwd / argv0
    if not path.exists():
        return os.strerror(errno.ENOENT)
    if path.is_dir() or not os.access(path, os.X_OK):
        return os.strerror(errno.EACCES)
    return None
