"""``ForgeClient``'s error boundary: whatever Temporal raises leaves the client as a
:mod:`forge.errors` kind with an actionable message, the SDK's error as its cause."""

from __future__ import annotations

from typing import Any

import pytest
from temporalio.client import WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from forge.client.client import ForgeClient
from forge.errors import Busy, ForgeError, InvalidInput, NotFound, Unavailable
from forge.settings import Settings


class _Config:
    target_host = "temporal.example:7233"


class _Service:
    config = _Config()


class _Handle:
    def __init__(self, err: BaseException) -> None:
        self.err = err

    async def signal(self, *args: Any, **kw: Any) -> None:
        raise self.err

    async def execute_update(self, *args: Any, **kw: Any) -> Any:
        raise self.err


class _Client:
    """Enough of ``temporalio.client.Client`` for a signal and an update to fail."""

    namespace = "prod"
    service_client = _Service()

    def __init__(self, err: BaseException) -> None:
        self.err = err

    def get_workflow_handle(self, workflow_id: str) -> _Handle:
        return _Handle(self.err)


def _client(err: BaseException) -> ForgeClient:
    return ForgeClient(_Client(err), cluster="blue", search_attributes=False)  # type: ignore[arg-type]


def _rpc(status: RPCStatusCode, message: str) -> RPCError:
    return RPCError(message, status, b"")


async def test_a_server_that_is_away_is_unavailable_naming_the_address() -> None:
    err = _rpc(RPCStatusCode.UNAVAILABLE, "connection refused")
    with pytest.raises(Unavailable, match=r"temporal\.example:7233 is unavailable") as raised:
        await _client(err).remove_node("n1")
    assert raised.value.__cause__ is err


async def test_a_cluster_not_running_is_unavailable_and_says_how_to_start_it() -> None:
    err = _rpc(RPCStatusCode.NOT_FOUND, "workflow not found for ID: forge-cluster-blue")
    with pytest.raises(Unavailable, match="cluster 'blue' is not running") as raised:
        await _client(err).node_lost("n1")
    assert "namespace 'prod'" in str(raised.value) and "forge cluster start" in str(raised.value)


async def test_a_deadline_is_unavailable_and_asks_for_a_worker() -> None:
    err = _rpc(RPCStatusCode.DEADLINE_EXCEEDED, "context deadline exceeded")
    with pytest.raises(Unavailable, match="is a worker"):
        await _client(err).remove_node("n1")


async def test_any_other_rpc_error_is_a_forge_error_with_its_status() -> None:
    err = _rpc(RPCStatusCode.PERMISSION_DENIED, "no")
    with pytest.raises(ForgeError, match="permission_denied: no") as raised:
        await _client(err).remove_node("n1")
    assert type(raised.value) is ForgeError


@pytest.mark.parametrize(
    ("wire_type", "kind"),
    [
        ("NotFound", NotFound),
        ("InvalidInput", InvalidInput),
        (None, InvalidInput),  # a refusal Forge does not name: the request's fault
    ],
)
async def test_a_refused_update_is_the_kind_its_type_names(
    wire_type: str | None, kind: type[ForgeError]
) -> None:
    refusal = WorkflowUpdateFailedError(ApplicationError("unknown job 'x'", type=wire_type))
    with pytest.raises(ForgeError, match="unknown job 'x'") as raised:
        await _client(refusal).stop_job("x")
    assert type(raised.value) is kind
    assert raised.value.__cause__ is refusal


async def test_a_busy_refusal_that_never_clears_is_busy(monkeypatch: pytest.MonkeyPatch) -> None:
    from forge.client import transport

    monkeypatch.setattr(transport, "BUSY_DELAYS", (0.0,))
    refusal = WorkflowUpdateFailedError(ApplicationError("continuing as new", type="Busy"))
    with pytest.raises(Busy):
        await _client(refusal).stop_job("x")


async def test_connect_to_nothing_is_unavailable_naming_the_address() -> None:
    s = Settings.from_env({"FORGE_TEMPORAL_ADDRESS": "127.0.0.1:1"})
    with pytest.raises(Unavailable, match=r"cannot connect to Temporal at 127\.0\.0\.1:1"):
        await ForgeClient.connect(s)
