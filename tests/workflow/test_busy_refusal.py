"""A run due to continue as new refuses updates before it parses them.

While it waits to go, the in-flight batches of a big submission come back every half
second; parsing 1,000 jobs to refuse each of them took most of the loop's thread."""

from __future__ import annotations

import json

import pytest
from temporalio.api.common.v1 import Payload
from temporalio.common import RawValue
from temporalio.exceptions import ApplicationError

from forge.wire import contract as c
from forge.wire import errors as wire
from workflows import handlers as handlers_module
from workflows.handlers import Handlers
from workflows.inputs import update_arg


def _raw(value: object) -> RawValue:
    return RawValue(Payload(metadata={"encoding": b"json/plain"}, data=json.dumps(value).encode()))


def _due(monkeypatch: pytest.MonkeyPatch) -> tuple[Handlers, list[type]]:
    h = Handlers(c.ClusterInput(cluster="c"))
    monkeypatch.setattr(h, "_continue_as_new_due", lambda: True)
    parsed: list[type] = []
    real = update_arg

    def counting(model: type, raw: object) -> object:
        parsed.append(model)
        return real(model, raw)

    monkeypatch.setattr(handlers_module, "update_arg", counting)
    return h, parsed


def test_a_batch_is_refused_as_busy_without_being_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    h, parsed = _due(monkeypatch)
    job = {"name": "a", "groups": [{"name": "g", "tasks": [{"name": "t",
           "resources": {"cpu": 100, "memory": 64}}]}]}  # fmt: skip
    for validate, arg in (
        (h._validate_submit_jobs, {"jobs": [job] * 3}),
        (h._validate_submit, {"job": job}),
        (h._validate_scale, {"job_id": "a", "group": "g", "desired": 2}),
        (h._validate_stop, {"job_id": "a"}),
    ):
        with pytest.raises(ApplicationError) as got:
            validate(_raw(arg))
        assert got.value.type == wire.BUSY
    assert parsed == []  # not one parse for four refusals


def test_bad_input_while_busy_is_refused_as_busy_and_judged_by_the_next_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    h, _ = _due(monkeypatch)
    with pytest.raises(ApplicationError) as got:
        h._validate_submit_jobs(_raw({"jobs": "not a list"}))
    assert got.value.type == wire.BUSY  # retried by the client, refused for its field later
