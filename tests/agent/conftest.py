"""The fault suite's dev server and worker processes, for the end-to-end agent tests."""

from tests.faults.conftest import dev_env, pytest_runtest_makereport, spawn_worker

__all__ = ["dev_env", "pytest_runtest_makereport", "spawn_worker"]
