"""``forge agent --check``: what this machine would give its tasks, said before it
joins a cluster (nothing is connected or written)."""

from __future__ import annotations

from pathlib import Path

from forge.agent.config import ADDRESS_LABEL, AgentConfig
from forge.agent.limits import CGROUP_ROOT, limits_notice

__all__ = ["check_lines"]


def check_lines(config: AgentConfig, cgroup_root: Path = CGROUP_ROOT) -> list[str]:
    node = config.node
    lines = [f"node {node.id}: {node.cpu}m cpu, {node.memory} MiB, {len(node.gpus)} GPU"]
    for gpu in node.gpus:
        uuid = config.gpu_uuids.get(gpu.id)
        lines.append(f"  {gpu.id}: {gpu.model} {gpu.memory} MiB" + (f" {uuid}" if uuid else ""))
    lines.extend(config.notes)
    lines.append(f"peers reach this node at {node.labels.get(ADDRESS_LABEL, '?')}")
    lines.append(limits_notice(cgroup_root))
    return lines
