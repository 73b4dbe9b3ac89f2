"""``forge dev --demo``: the example nodes and jobs, placed while you watch."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

from forge.cli import output
from forge.loaders import load_jobs, load_nodes
from forge.services.processes import DevError

if TYPE_CHECKING:
    from forge.client.client import ForgeClient

__all__ = ["DEMO_TIMEOUT", "demo", "say"]

#: How long ``--demo`` watches for the placements to converge.
DEMO_TIMEOUT = 30.0


def _examples_dir() -> Path:
    """``./examples`` when it has nodes.yaml, else the repository's examples."""
    for base in (Path.cwd(), Path(__file__).resolve().parent.parent.parent):
        if (base / "examples" / "nodes.yaml").is_file():
            return base / "examples"
    raise DevError("--demo needs examples/nodes.yaml (run from the repository)")


async def demo(fc: ForgeClient) -> None:
    """Register the example nodes, submit the example jobs, watch them converge."""
    examples = _examples_dir()
    nodes = load_nodes(examples / "nodes.yaml")
    files = sorted(p for p in examples.glob("*.yaml") if p.name != "nodes.yaml")
    jobs = [job for f in files for job in load_jobs(f)]
    await fc.register_nodes(nodes)
    say(f"demo: registered {len(nodes)} nodes from {examples / 'nodes.yaml'}")
    for job in jobs:
        result = await fc.submit_job(job)
        say(f"demo: submitted {output.job_result_line(result)}")
    loop = asyncio.get_running_loop()
    start = loop.time()
    while True:
        status = await fc.status()
        s = status.summary
        elapsed = loop.time() - start
        say(f"demo: [{elapsed:4.1f} s] {s.desired} desired, {s.bound} bound, {s.pending} pending")
        if s.pending == 0 and s.bound >= s.desired:
            say("demo: converged: every replica is bound")
            return
        if elapsed >= DEMO_TIMEOUT:
            say(f"demo: {s.pending} still pending after {DEMO_TIMEOUT:g} s (reasons below)")
            return
        await asyncio.sleep(1.0)  # print status once a second, as promised


def say(text: str) -> None:
    print(text, flush=True)
