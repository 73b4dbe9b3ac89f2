"""What one agent is: its node (capacity detected from the machine unless given),
where it keeps its state, and how often it talks to the store.

Option parsing lives here rather than in the CLI so any front end (argparse today,
Click tomorrow) hands over typed values and gets the same validation and the same
error messages.
"""

from __future__ import annotations

import ipaddress
import json
import secrets
import shutil
import subprocess
from dataclasses import dataclass, field, replace
from pathlib import Path

import psutil
import pydantic

from forge.core.models import Node, is_valid_name
from forge.errors import InvalidInput

__all__ = [
    "LOGS_LABEL",
    "AgentConfig",
    "AgentConfigError",
    "build_config",
    "detect_gpus",
    "detect_node",
]

#: The node label through which ``forge logs`` finds the agent serving a replica.
LOGS_LABEL = "forge.agent/logs"


class AgentConfigError(InvalidInput, ValueError):
    """An option the agent cannot use; the message names it."""


@dataclass(frozen=True)
class AgentConfig:
    node: Node
    data_dir: Path
    cluster: str = "default"
    store_url: str = ""
    #: How often the agent re-reads its bindings and checks its processes.
    poll: float = 0.5
    heartbeat_every: float = 5.0
    #: How often running replicas' cpu/memory are sampled and reported.
    usage_every: float = 10.0
    #: host:port of the log server; port 0 picks a free one.
    logs_address: str = "127.0.0.1:0"
    token: str = field(default="", repr=False)
    log_max_bytes: int = 1 << 20
    log_keep: int = 2

    @property
    def loopback(self) -> bool:
        host = self.logs_address.rpartition(":")[0].strip("[]")
        try:
            return host == "localhost" or ipaddress.ip_address(host).is_loopback
        except ValueError:
            return False


def detect_gpus() -> list[tuple[str, int]]:
    """``(model, memory MiB)`` per GPU from ``nvidia-smi``; none without it."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    gpus = []
    for line in out.splitlines():
        name, _, mem = line.rpartition(",")
        model = "-".join(name.strip().split()).replace("NVIDIA-", "")[:63] or "gpu"
        try:
            gpus.append((model, int(float(mem))))
        except ValueError:
            continue
    return gpus


def detect_node(node_id: str) -> tuple[int, int]:
    """This machine's ``(cpu millicores, memory MiB)``."""
    return (psutil.cpu_count() or 1) * 1000, psutil.virtual_memory().total // (1 << 20)


def _label(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise AgentConfigError(f"--label {text!r}: use KEY=VALUE")
    return key, value


def _gpu(text: str) -> tuple[str, int]:
    model, sep, mem = text.rpartition(":")
    if not sep or not model:
        raise AgentConfigError(f"--gpu {text!r}: use MODEL:MEMORY_MIB")
    try:
        return model, int(mem)
    except ValueError:
        raise AgentConfigError(f"--gpu {text!r}: memory must be an integer (MiB)") from None


def build_config(
    *,
    node_id: str,
    data_dir: Path,
    cluster: str = "default",
    store_url: str = "",
    cpu: int | None = None,
    memory: int | None = None,
    gpus: list[str] | None = None,
    labels: list[str] | None = None,
    logs_address: str = "127.0.0.1:0",
    token: str = "",
    poll: float = 0.5,
    heartbeat_every: float = 5.0,
    usage_every: float = 10.0,
) -> AgentConfig:
    """Validate the agent's options; what is not given is detected from the machine."""
    if not is_valid_name(node_id):
        raise AgentConfigError(f"--node-id {node_id!r}: 1-63 of [A-Za-z0-9._-]")
    for name, value in (("--poll", poll), ("--heartbeat-every", heartbeat_every)):
        if not value > 0:
            raise AgentConfigError(f"{name} must be more than 0, got {value}")
    host, sep, port = logs_address.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise AgentConfigError(f"--logs-address {logs_address!r}: use HOST:PORT")
    detected_cpu, detected_memory = detect_node(node_id)
    pairs = [_gpu(g) for g in gpus] if gpus is not None else detect_gpus()
    label_map: dict[str, str] = {}
    for text in labels or []:
        key, text_value = _label(text)
        if key in label_map:
            raise AgentConfigError(f"--label {key} given twice")
        label_map[key] = text_value
    config = AgentConfig(
        node=Node(id=node_id, cpu=1, memory=1),  # replaced below, once validated
        data_dir=data_dir,
        cluster=cluster,
        store_url=store_url,
        poll=poll,
        heartbeat_every=heartbeat_every,
        usage_every=usage_every,
        logs_address=logs_address,
        token=token,
    )
    if not config.loopback and not token:
        config = replace(config, token=secrets.token_urlsafe(24))
    doc = {
        "id": node_id,
        "cpu": detected_cpu if cpu is None else cpu,
        "memory": detected_memory if memory is None else memory,
        "gpus": [{"id": f"gpu{i}", "model": m, "memory": mem} for i, (m, mem) in enumerate(pairs)],
        "labels": label_map,
    }
    try:
        node = Node.model_validate_json(json.dumps(doc))
    except pydantic.ValidationError as err:
        raise AgentConfigError(f"node {node_id}: {err.errors()[0]['msg']}") from None
    return replace(config, node=node)
