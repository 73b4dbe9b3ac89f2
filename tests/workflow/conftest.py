from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio
from temporalio.testing import WorkflowEnvironment

from forge.wire.codec import data_converter


@pytest_asyncio.fixture(scope="session")
async def skipping_env(test_server_bin: str) -> AsyncIterator[WorkflowEnvironment]:
    env = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=test_server_bin, data_converter=data_converter()
    )
    try:
        yield env
    finally:
        await env.shutdown()
