"""Task output on disk, bounded.

A task writes straight into its log file (opened with O_APPEND), not through a
pipe to the agent: its output must survive the agent being restarted or killed,
and a pipe whose reader died would kill the task with SIGPIPE. Rotation is
therefore copy-then-truncate: the current file is copied to ``.1`` (older copies
shift up to ``.keep``) and truncated in place, and the task's next append lands
at the new end. A task's disk use is at most ``max_bytes * (keep + 1)`` plus what
it writes between two checks.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

__all__ = ["log_path", "read_from", "rotate_if_needed"]


def log_path(root: Path, workload_id: str, task: str) -> Path:
    job, group, ordinal = workload_id.split("/")
    return root / "logs" / job / group / ordinal / f"{task}.log"


def rotate_if_needed(path: Path, max_bytes: int, keep: int) -> bool:
    """Rotate ``path`` when it has grown past ``max_bytes``; True if it did."""
    try:
        size = path.stat().st_size
    except OSError:
        return False
    if size <= max_bytes:
        return False
    for i in range(keep, 0, -1):
        older = path.with_name(f"{path.name}.{i}")
        if i == keep:
            older.unlink(missing_ok=True)
        else:
            newer = path.with_name(f"{path.name}.{i + 1}")
            if older.exists():
                os.replace(older, newer)
    if keep > 0:
        shutil.copyfile(path, path.with_name(f"{path.name}.1"))
    with path.open("r+b") as fh:
        fh.truncate(0)
    return True


def read_from(path: Path, offset: int, limit: int = 1 << 20) -> tuple[bytes, int]:
    """Bytes of ``path`` from ``offset`` (at most ``limit``) and the offset to ask
    next. An offset past the end means the file was rotated: read from the start."""
    try:
        with path.open("rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if offset > size:
                offset = 0
            fh.seek(offset)
            data = fh.read(limit)
    except FileNotFoundError:
        return b"", 0
    return data, offset + len(data)
