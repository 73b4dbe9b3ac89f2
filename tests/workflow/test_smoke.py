from __future__ import annotations

from temporalio.testing import WorkflowEnvironment

from tests.workflow.harness import cluster, job, node


async def test_submit_places_and_persists(skipping_env: WorkflowEnvironment) -> None:
    async with cluster(skipping_env.client) as (fc, store):
        await fc.register_nodes([node("n1"), node("n2")])
        res = await fc.submit_job(job("web", replicas=3))
        assert (res.desired, res.bound, res.pending) == (3, 3, 0)
        status = await fc.status()
        assert status.summary.bound == 3
        stored = store.assignments(fc.cluster)
        assert sorted(a.workload_id for a in stored) == ["web/main/0", "web/main/1", "web/main/2"]
