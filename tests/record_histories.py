"""Record workflow histories for the replay tests: `make histories`.

Runs a few scenarios on the time-skipping test server with the current code and
writes each run's history to tests/histories/. Re-record after a deliberate,
patched behaviour change; never to silence a failing replay test.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from temporalio.testing import WorkflowEnvironment

from forge.codec import data_converter
from forge.reconcile import ReconcileOptions
from tests.workflow.harness import cluster, default_options, job, node

OUT = Path(__file__).parent / "histories"
BIN = Path(sys.executable).parent


async def _lifecycle(env: WorkflowEnvironment) -> list[tuple[str, str]]:
    """Submit, scale, fail, lose, drain, back off, stop."""
    opts = default_options(reconcile=ReconcileOptions(max_placements=5))
    async with cluster(env.client, options=opts, name="lifecycle") as (fc, _):
        await fc.register_nodes([node("a"), node("b"), node("c", gpus=2)])
        await fc.submit_job(job("web", replicas=6))
        await fc.submit_job(job("train", replicas=2, cpu=500, gpu=1, priority=80))
        await fc.scale("web", "main", 8)
        await fc.report_failed(["web/main/0"])
        await fc.node_lost("a")
        await fc.drain_node("b")
        await fc.submit_job(job("huge", replicas=1, cpu=64000))
        await env.sleep(10)
        await fc.register_nodes([node("d", cpu=8000), node("e", cpu=128000, memory=65536)])
        await env.sleep(2)
        await fc.stop_job("web")
        await fc.status()
        return await _histories(fc)


async def _continue_as_new(env: WorkflowEnvironment) -> list[tuple[str, str]]:
    async with cluster(env.client, options=default_options(max_passes_per_run=3), name="can") as (
        fc,
        _,
    ):
        for i in range(6):
            await fc.register_nodes([node(f"n{i}")])
        await fc.submit_job(job("web", replicas=10))
        await fc.submit_job(job("batch", replicas=5, cpu=250))
        await fc.node_lost("n0")
        await env.sleep(1)
        await fc.status()
        return await _histories(fc)


async def _histories(fc) -> list[tuple[str, str]]:
    out = []
    run_id = (await fc.handle().describe()).run_id
    # walk back through the continue-as-new chain
    while run_id:
        handle = fc.client.get_workflow_handle(fc.workflow_id, run_id=run_id)
        hist = await handle.fetch_history()
        out.append((run_id, hist.to_json()))
        first = hist.events[0].workflow_execution_started_event_attributes
        run_id = first.continued_execution_run_id
    return out


async def main() -> None:
    OUT.mkdir(exist_ok=True)
    env = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=str(BIN / "temporal-test-server"),
        data_converter=data_converter(),
    )
    try:
        for name, scenario in (("lifecycle", _lifecycle), ("continue_as_new", _continue_as_new)):
            runs = await scenario(env)
            for i, (_, body) in enumerate(reversed(runs)):
                path = OUT / f"{name}-run{i + 1}.json"
                path.write_text(json.dumps(json.loads(body), indent=1) + "\n")
                print(f"wrote {path.relative_to(OUT.parent.parent)}")
    finally:
        await env.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
