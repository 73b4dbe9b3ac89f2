"""``forge dev --demo``: three local node agents run the examples in
``examples/demo/`` as real processes, while you watch.

- ``web``: three HTTP servers, each on the port its agent picked: curl them;
- ``crashy``: crashes two seconds after each start; its agent reports the failure
  and the loop's reschedule policy starts it again, with a growing delay;
- ``burn``: busy-loops; the agents report its CPU use and the autoscaler grows it.

The demo prints one line a second until each of the three has shown its part (or
``DEMO_TIMEOUT`` passes), then what to try next. Everything it reads comes from the
store, as ``forge status`` does.
"""

from __future__ import annotations

import asyncio
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from forge import render
from forge.loaders import load_jobs
from forge.services.processes import DevError
from forge.wire.views import parse_ports

if TYPE_CHECKING:
    from forge.client.client import ForgeClient
    from forge.stores.base import Store

__all__ = ["DEMO_AGENTS", "DEMO_TIMEOUT", "agent_argv", "demo", "say"]

#: How long ``--demo`` watches for the examples to show their parts.
DEMO_TIMEOUT = 90.0
#: The local agents ``--demo`` starts (node ids), each offering 2 cores and 2 GiB.
DEMO_AGENTS = ("demo-1", "demo-2", "demo-3")


def _examples_dir() -> Path:
    """``./examples/demo`` when it exists, else the repository's."""
    for base in (Path.cwd(), Path(__file__).resolve().parent.parent.parent):
        if (base / "examples" / "demo").is_dir():
            return base / "examples" / "demo"
    raise DevError("--demo needs examples/demo/*.yaml (run from the repository)")


def agent_argv(node: str, data_dir: Path) -> list[str]:
    """One local agent of the demo. Its tasks stop with it (``forge dev`` owns them)."""
    return [
        sys.executable, "-m", "forge", "agent", "--node-id", node,
        "--cpu", "2000", "--memory", "2048", "--data-dir", str(data_dir / f"agent-{node}"),
        "--heartbeat-every", "1", "--usage-every", "2", "--stop-tasks-on-exit",
    ]  # fmt: skip


@dataclass
class _Seen:
    """What the demo has seen so far in the task reports (read incrementally)."""

    seq: int = 0
    ports: dict[str, int] = field(default_factory=dict)  # web replica -> http port
    crashes: int = 0
    restarts: int = 0  # running reports of crashy after one of its failures
    answering: set[str] = field(default_factory=set)

    def read(self, store: Store, cluster: str) -> None:
        while batch := store.reports_since(cluster, self.seq, 1000):
            for r in batch:
                if r.workload_id.startswith("web/") and r.status == "running":
                    for name, port in parse_ports(r.message):
                        if name == "http":
                            self.ports[r.workload_id] = port
                elif r.workload_id.startswith("crashy/") and r.cpu is None:
                    if r.status == "failed":
                        self.crashes += 1
                    elif r.status == "running" and self.crashes:
                        self.restarts += 1
            self.seq = batch[-1].seq


def _answers(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as resp:
            return int(resp.status) == 200
    except OSError:
        return False


async def demo(fc: ForgeClient, *, timeout: float = DEMO_TIMEOUT) -> bool:
    """Wait for the agents, submit the demo jobs, watch them; True when every part
    showed (web answers, crashy restarted, burn grew)."""
    store = fc.store
    assert store is not None  # forge dev opens it before the demo
    files = sorted(_examples_dir().glob("*.yaml"))
    jobs = [job for f in files for job in load_jobs(f)]
    loop = asyncio.get_running_loop()
    start = loop.time()
    while len((await fc.status()).nodes) < len(DEMO_AGENTS):
        if loop.time() - start > 60:
            raise DevError("the demo agents did not register within 60 s (see agent-*.log)")
        await asyncio.sleep(0.5)
    say(f"demo: {len(DEMO_AGENTS)} local agents registered: {', '.join(DEMO_AGENTS)}")
    for job in jobs:
        result = await fc.submit_job(job)
        say(f"demo: submitted {render.job_result_line(result)}")
    web = next((j for j in jobs if j.id == "web"), None)
    web_count = web.groups[0].scaling.desired if web is not None else 0
    seen = _Seen()
    start = loop.time()
    while True:
        await asyncio.to_thread(seen.read, store, fc.cluster)
        for wid, port in sorted(seen.ports.items()):
            if wid not in seen.answering and await asyncio.to_thread(_answers, port):
                seen.answering.add(wid)
        burn = await asyncio.to_thread(store.get_job, fc.cluster, "burn")
        grown = burn.groups[0].scaling.desired if burn is not None else 0
        usage = await asyncio.to_thread(store.group_usage, fc.cluster, time.time() - 60)
        cpu = usage.get("burn/main", (0.0, 0.0))[0]
        elapsed = loop.time() - start
        say(
            f"demo: [{elapsed:4.1f} s] web {len(seen.answering)}/{web_count} answering; "
            f"crashy crashed {seen.crashes}x, restarted {seen.restarts}x; "
            f"burn {grown} replicas at {cpu:.1f}x its cpu request"
        )
        done = len(seen.answering) >= web_count and seen.restarts >= 1 and grown >= 2
        if done or elapsed >= timeout:
            break
        await asyncio.sleep(1.0)
    if done:
        say("demo: every part works: web answers, crashy is restarted with backoff, burn grew")
    else:
        say(f"demo: not every part showed within {timeout:g} s (see the agents' logs)")
    first = min(seen.ports.items(), default=None)
    lines = ["try, in another terminal (with the exports below):"]
    if first is not None:
        lines.append(f"  curl http://127.0.0.1:{first[1]}/        # {first[0]}")
    lines += [
        "  forge logs crashy/main/0             # its task log, served by its agent",
        "  forge status                         # usage and ports per node",
    ]
    say("\n".join(lines))
    return done


def say(text: str) -> None:
    print(text, flush=True)
