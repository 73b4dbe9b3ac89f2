"""What one agent is: its node (capacity detected from the machine unless given),
where it keeps its state, and how often it talks to the store.

Any front end hands over typed values: ``--gpu`` and ``--label`` parsed by
:mod:`forge.params` (the functions behind the CLI's own parameter types, so
``forge agent`` and ``forge node add`` accept and refuse the same text), the node
built by :func:`forge.params.node_from_flags` as ``forge node add`` builds it.
"""

from __future__ import annotations

import ipaddress
import re
import secrets
import shutil
import socket
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import psutil

from forge.core.models import Node, is_valid_name
from forge.errors import InvalidInput
from forge.params import node_from_flags

__all__ = [
    "ADDRESS_LABEL",
    "LOGS_LABEL",
    "AgentConfig",
    "AgentConfigError",
    "DetectedGpu",
    "build_config",
    "default_address",
    "detect_gpus",
    "detect_node",
]

#: The node label through which ``forge logs`` finds the agent serving a replica.
LOGS_LABEL = "forge.agent/logs"
#: The node label holding the address peers reach the node at (``MASTER_ADDR``).
ADDRESS_LABEL = "forge.agent/address"


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
    #: Registered GPU id -> the device's UUID, for the GPUs nvidia-smi listed.
    gpu_uuids: dict[str, str] = field(default_factory=dict)
    #: Start-up lines on where the node's GPUs came from.
    notes: tuple[str, ...] = ()

    @property
    def loopback(self) -> bool:
        host = self.logs_address.rpartition(":")[0].strip("[]")
        try:
            return host == "localhost" or ipaddress.ip_address(host).is_loopback
        except ValueError:
            return False


@dataclass(frozen=True)
class DetectedGpu:
    """One device as ``nvidia-smi`` lists it: its index (PCI bus order), UUID,
    model and memory."""

    index: int
    uuid: str
    model: str
    memory: int  # MiB


#: ``nvidia-smi``'s CSV columns, in this order (the same fields NVML gives).
GPU_QUERY = "index,uuid,name,memory.total"


def nvidia_smi(query: str, timeout: float) -> str:
    """``nvidia-smi``'s CSV (no header, no units) for ``--query-gpu=query``; raises
    OSError / SubprocessError when it cannot answer."""
    return subprocess.run(
        ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=True,
    ).stdout


def detect_gpus() -> tuple[list[DetectedGpu], str]:
    """The machine's GPUs from ``nvidia-smi``'s CSV, and why none when there are
    none (a start-up line, never a crash)."""
    if shutil.which("nvidia-smi") is None:
        return [], "no nvidia-smi on PATH"
    try:
        out = nvidia_smi(GPU_QUERY, timeout=10)
    except (OSError, subprocess.SubprocessError) as err:
        return [], f"nvidia-smi failed: {err}"
    gpus = []
    for line in out.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) < 4:
            continue
        index, uuid, mem = fields[0], fields[1], fields[-1]
        name = ",".join(fields[2:-1])
        model = "-".join(name.split()).replace("NVIDIA-", "")[:63] or "gpu"
        try:
            gpus.append(DetectedGpu(int(index), uuid, model, int(float(mem))))
        except ValueError:
            continue
    gpus.sort(key=lambda g: g.index)
    return gpus, "" if gpus else "nvidia-smi lists no GPU"


def _choose_gpus(
    declared: Sequence[tuple[str, int]] | None, detected: list[DetectedGpu], why: str
) -> tuple[list[tuple[str, int]], dict[str, str], tuple[str, ...]]:
    """The GPUs to register (``gpu<index>``, as ``forge node add`` names them),
    each registered id's UUID, and the start-up lines that say where they came
    from. What the machine reports wins over a declaration that contradicts it."""
    found = [(g.model, g.memory) for g in detected]
    uuids = {f"gpu{i}": g.uuid for i, g in enumerate(detected) if g.uuid}
    if declared is None:
        if not detected:
            return [], {}, (f"no GPUs detected ({why}); declare them with --gpu MODEL:MiB",)
        return found, uuids, (f"{len(found)} GPU detected by nvidia-smi",)
    if not detected:
        return list(declared), {}, (f"{len(declared)} GPU as declared ({why})",)
    if list(declared) != found:
        shown = ", ".join(f"{m}:{mib}" for m, mib in found)
        return (
            found,
            uuids,
            (f"--gpu contradicts nvidia-smi; registering what it reports: {shown}",),
        )
    return found, uuids, (f"{len(found)} GPU as declared, confirmed by nvidia-smi",)


def default_address(logs_address: str) -> str:
    """Where peers reach this machine when ``--advertise-address`` is not given: the
    log server's host when it listens on a routable address, else the address of
    the interface that routes outward (no packet is sent), else loopback."""
    host = logs_address.rpartition(":")[0].strip("[]")
    try:
        ip = ipaddress.ip_address(host)
        if not (ip.is_loopback or ip.is_unspecified):
            return host
    except ValueError:
        if host and host != "localhost":
            return host  # a name the peers resolve
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))
            return str(s.getsockname()[0])
    except OSError:
        return "127.0.0.1"


def detect_node(node_id: str) -> tuple[int, int]:
    """This machine's ``(cpu millicores, memory MiB)``."""
    return (psutil.cpu_count() or 1) * 1000, psutil.virtual_memory().total // (1 << 20)


def build_config(
    *,
    node_id: str,
    data_dir: Path,
    cluster: str = "default",
    store_url: str = "",
    cpu: int | None = None,
    memory: int | None = None,
    gpus: Sequence[tuple[str, int]] | None = None,
    labels: Sequence[tuple[str, str]] = (),
    logs_address: str = "127.0.0.1:0",
    advertise_address: str = "",
    token: str = "",
    poll: float = 0.5,
    heartbeat_every: float = 5.0,
    usage_every: float = 10.0,
) -> AgentConfig:
    """Validate the agent's options; what is not given is detected from the machine.

    ``gpus`` and ``labels`` as :func:`forge.params.gpu` and :func:`forge.params.label`
    parse ``--gpu`` and ``--label`` (``forge agent`` declares them with the same
    types as ``forge node add``); ``gpus=None`` detects them with ``nvidia-smi``, and
    what ``nvidia-smi`` lists wins over declared GPUs that contradict it."""
    if not is_valid_name(node_id):
        raise AgentConfigError(f"--node-id {node_id!r}: 1-63 of [A-Za-z0-9._-]")
    for name, value in (("--poll", poll), ("--heartbeat-every", heartbeat_every)):
        if not value > 0:
            raise AgentConfigError(f"{name} must be more than 0, got {value}")
    host, sep, port = logs_address.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise AgentConfigError(f"--logs-address {logs_address!r}: use HOST:PORT")
    detected_cpu, detected_memory = detect_node(node_id)
    pairs, uuids, notes = _choose_gpus(gpus, *detect_gpus())
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
        gpu_uuids=uuids,
        notes=notes,
    )
    if not config.loopback and not token:
        config = replace(config, token=secrets.token_urlsafe(24))
    address = advertise_address or default_address(logs_address)
    if not is_valid_address(address):
        raise AgentConfigError(f"--advertise-address {address!r}: a host name or an IP address")
    try:
        node = node_from_flags(
            node_id,
            detected_cpu if cpu is None else cpu,
            detected_memory if memory is None else memory,
            pairs,
            [*labels, (ADDRESS_LABEL, address)],
            source=f"node {node_id}",
        )
    except InvalidInput as err:
        raise AgentConfigError(str(err)) from None
    return replace(config, node=node)


def is_valid_address(host: str) -> bool:
    """An IP address or a DNS name (what ``MASTER_ADDR`` may hold)."""
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return bool(re.fullmatch(r"(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?", host))
