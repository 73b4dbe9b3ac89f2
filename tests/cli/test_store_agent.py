"""``forge store grant-agent NODE`` / ``revoke-agent NODE``: the agent's store URL
alone on stdout (``FORGE_STORE=$(forge store grant-agent n1)``), PostgreSQL only
(exit 2 naming it otherwise), and a revoke of a node without a role is NotFound
(exit 1)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from forge import cli
from forge.stores import open_agent_store
from forge.stores.postgres_agent import PostgresAgentStore
from tests.stores.conftest import Backend, postgres_backend
from tests.stores.pg_agents import drop_agent_roles, role_row, scram_matches, url_password, url_user

__all__ = ["postgres_backend"]

pytestmark = pytest.mark.postgres


@pytest.fixture
def store_url(postgres_backend: Backend, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    for name in ("FORGE_STORE", "FORGE_CLUSTER", "FORGE_DATA_DIR"):
        monkeypatch.delenv(name, raising=False)
    postgres_backend.open().close()  # the schema, as the worker would have made it
    try:
        yield postgres_backend.url
    finally:
        drop_agent_roles(postgres_backend.url)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(["store", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_grant_agent_prints_the_agents_store_url_and_nothing_else_on_stdout(
    capsys: pytest.CaptureFixture[str], store_url: str
) -> None:
    code, out, err = run(capsys, "grant-agent", "n1", "--store", store_url, "--cluster", "prod")
    assert code == 0, err
    (url,) = out.splitlines()  # one line: the URL
    role = url_user(url)
    assert role.startswith("forge_agent_n1_") and f"store role {role} for node n1" in err
    assert "cluster prod (created)" in err and url not in err
    password = url_password(url)
    assert password and password not in err
    row = role_row(store_url, role)
    assert row is not None and row["login"] and scram_matches(row["password"], password)
    agent = open_agent_store(url, "prod", "n1")  # what `forge agent` opens with it
    assert isinstance(agent, PostgresAgentStore)
    agent.heartbeat("prod", "n1", 1.0)
    agent.close()
    # again: the same role with a new password
    code, again, err = run(capsys, "grant-agent", "n1", "--store", store_url, "--cluster", "prod")
    assert code == 0 and "(password replaced)" in err
    assert url_user(again.strip()) == role and url_password(again.strip()) != password


def test_grant_agent_no_password_prints_a_url_without_one(
    capsys: pytest.CaptureFixture[str], store_url: str
) -> None:
    code, out, err = run(capsys, "grant-agent", "n1", "--store", store_url, "--no-password")
    assert code == 0 and "no password" in err
    url = out.strip()
    assert url_password(url) is None
    row = role_row(store_url, url_user(url))
    assert row is not None and row["login"] and row["password"] is None


def test_revoke_agent_drops_the_role_and_a_second_revoke_is_not_found(
    capsys: pytest.CaptureFixture[str], store_url: str
) -> None:
    _, out, _ = run(capsys, "grant-agent", "n1", "--store", store_url)
    role = url_user(out.strip())
    code, out, err = run(capsys, "revoke-agent", "n1", "--store", store_url)
    assert code == 0, err
    assert out.strip() == f"store role {role} of node n1 in cluster default dropped"
    assert role_row(store_url, role) is None
    code, out, err = run(capsys, "revoke-agent", "n1", "--store", store_url)
    # NotFound exits 1, apart from malformed input's 2 (tests/system/test_errors.py)
    assert (code, out) == (1, "")
    assert "node n1 of cluster default has no agent role to revoke" in err
    code, _, err = run(capsys, "revoke-agent", "n9", "--store", store_url, "--cluster", "other")
    assert code == 1 and "node n9 of cluster other" in err


@pytest.mark.parametrize("command", ["grant-agent", "revoke-agent"])
def test_agent_roles_refuse_a_store_that_is_not_postgresql(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    command: str,
) -> None:
    monkeypatch.delenv("FORGE_STORE", raising=False)
    db = tmp_path / "forge.db"
    for url in (f"sqlite:///{db}", "memory://"):
        code, out, err = run(capsys, command, "n1", "--store", url)
        assert (code, out) == (2, "")
        assert "PostgreSQL" in err and "no users" in err
    assert not db.exists()  # refused before opening anything
    monkeypatch.setenv("FORGE_DATA_DIR", str(tmp_path))  # the default store: SQLite
    code, _, err = run(capsys, command, "n1")
    assert code == 2 and "PostgreSQL" in err


def test_a_node_id_that_is_no_name_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], store_url: str
) -> None:
    code, out, _ = run(capsys, "grant-agent", "bad node!", "--store", store_url)
    assert (code, out) == (2, "")
