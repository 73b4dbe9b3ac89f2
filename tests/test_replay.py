"""Determinism: recorded histories replay cleanly with today's code, and a
behaviour change without `workflow.patched` is caught on replay.

Refresh the histories with `make histories` (tests/record_histories.py) after a
deliberate, patched change.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

from forge.codec import data_converter
from forge.placement import select
from forge.placement.scorers import scorers_for
from workflows.cluster import ClusterWorkflow

HISTORIES = sorted((Path(__file__).parent / "histories").glob("*.json"))


def _history(path: Path) -> WorkflowHistory:
    return WorkflowHistory.from_json(path.stem, json.loads(path.read_text()))


def test_histories_exist() -> None:
    assert len(HISTORIES) >= 3, "run `make histories` to record them"


@pytest.mark.parametrize("path", HISTORIES, ids=lambda p: p.stem)
async def test_recorded_history_replays(path: Path) -> None:
    replayer = Replayer(workflows=[ClusterWorkflow], data_converter=data_converter())
    result = await replayer.replay_workflow(_history(path), raise_on_replay_failure=False)
    assert result.replay_failure is None, result.replay_failure


async def test_an_unpatched_scorer_change_is_detected(monkeypatch: pytest.MonkeyPatch) -> None:
    # A "harmless" change: spread instead of binpack, without workflow.patched.
    monkeypatch.setattr(select, "scorers_for", lambda algorithm, **kw: scorers_for("spread"))
    monkeypatch.setattr(select, "_fast_scorer", lambda scorers: None)
    replayer = Replayer(workflows=[ClusterWorkflow], data_converter=data_converter())
    path = next(p for p in HISTORIES if p.stem.startswith("lifecycle"))
    result = await replayer.replay_workflow(_history(path), raise_on_replay_failure=False)
    assert result.replay_failure is not None
    assert "digest" in str(result.replay_failure)
