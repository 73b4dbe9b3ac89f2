"""Size limits and the name rule: what keeps one job spec, one node and one pass
bounded, so nothing a user sends can grow a Temporal payload past its limit (see
README "Limits"). One module so a limit is changed (and reviewed) in one place.
"""

from __future__ import annotations

import re

__all__ = [
    "GPU_MILLI",
    "MAX_ARGS",
    "MAX_BATCH_BYTES",
    "MAX_CPU",
    "MAX_ENV",
    "MAX_GPUS",
    "MAX_GROUPS",
    "MAX_JOB_BYTES",
    "MAX_LABELS",
    "MAX_MEMORY",
    "MAX_REPLICAS",
    "MAX_STRING",
    "MAX_TAINTS",
    "MAX_TASKS",
    "NAME_PATTERN",
    "is_valid_name",
]

MAX_CPU = 10_000_000  # 10,000 cores in millicores
MAX_MEMORY = 1 << 30  # 1 PiB in MiB
MAX_GPUS = 64
MAX_GROUPS = 64
MAX_TASKS = 64
MAX_REPLICAS = 100_000
MAX_LABELS = 64
MAX_ENV = 256
MAX_ARGS = 256
MAX_STRING = 4096
MAX_TAINTS = 32
#: One GPU device in milli-GPU: a shared (fractional) request asks 1..999 of it.
GPU_MILLI = 1000
#: One job spec, as JSON. The field limits above allow specs of gigabytes (64 groups
#: x 64 tasks x 256 args of 4 KiB), and one over Temporal's 2 MiB payload limit
#: wedges the cluster workflow (every workflow task that carries it fails).
MAX_JOB_BYTES = 128 * 1024
#: Jobs or nodes carried by one update or signal, as JSON: the client splits bigger
#: batches, the workflow's validators refuse them and queue at most this much job
#: data for one store write.
MAX_BATCH_BYTES = 1024 * 1024

#: Names are path segments of a workload id (``job/group/ordinal``): no ``/``, no
#: whitespace or control characters, at most 63 characters (a DNS label's length).
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"
_NAME_RE = re.compile(NAME_PATTERN)


def is_valid_name(value: str) -> bool:
    return bool(_NAME_RE.fullmatch(value))  # not match: "$" also matches before a final "\n"
