from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio
from temporalio.testing import WorkflowEnvironment

from forge.wire.codec import data_converter


@pytest_asyncio.fixture
async def skipping_env(test_server_bin: str) -> AsyncIterator[WorkflowEnvironment]:
    """A time-skipping server of the test's own. Shared, one test's workflow that is
    still running an activity (the store watch) keeps the clock locked for the next:
    ``env.sleep(300)`` then waits 300 real seconds and its RPC times out."""
    env = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=test_server_bin, data_converter=data_converter()
    )
    try:
        yield env
    finally:
        await env.shutdown()


@pytest_asyncio.fixture
async def dev_env(temporal_cli: str) -> AsyncIterator[WorkflowEnvironment]:
    """A dev server of the test's own: unlike the time-skipping one, describe() shows
    the pending workflow task's attempt (how the watchdog sees a failing task), and it
    takes the cancel of an activity that completed as the cancel was sent."""
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_cli, data_converter=data_converter()
    )
    try:
        yield env
    finally:
        await env.shutdown()
