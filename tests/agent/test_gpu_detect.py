"""``forge agent`` registers the machine's GPUs as ``nvidia-smi`` lists them (index,
UUID, model, memory), the declared ones where it is absent, what it reports where a
declaration contradicts it, and says which in a start-up line; no GPU tooling is a
line, not a crash. ``nvidia-smi`` here is a fake on PATH printing the CSV the real
one prints for ``--query-gpu=index,uuid,name,memory.total``."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from forge.agent.config import GPU_QUERY, DetectedGpu, build_config, detect_gpus

CSV = """\
1, GPU-bbbbbbbb-0000-0000-0000-000000000001, NVIDIA A100-SXM4-40GB, 40960
0, GPU-aaaaaaaa-0000-0000-0000-000000000000, NVIDIA A100-SXM4-40GB, 40960
"""


def _fake_smi(tmp: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> Path:
    bindir = tmp / "bin"
    bindir.mkdir()
    script = bindir / "nvidia-smi"
    args = tmp / "args"
    script.write_text(f'#!/bin/sh\necho "$@" > {args}\n{body}\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")  # first: a real one is not used
    return args


def test_detected_gpus_are_registered_by_index_with_their_uuids(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    args = _fake_smi(tmp_path, monkeypatch, f"cat <<'EOF'\n{CSV}EOF")
    gpus, why = detect_gpus()
    assert why == ""
    assert f"--query-gpu={GPU_QUERY}" in args.read_text()
    assert gpus == [
        DetectedGpu(0, "GPU-aaaaaaaa-0000-0000-0000-000000000000", "A100-SXM4-40GB", 40960),
        DetectedGpu(1, "GPU-bbbbbbbb-0000-0000-0000-000000000001", "A100-SXM4-40GB", 40960),
    ]
    config = build_config(node_id="n1", data_dir=tmp_path, cpu=1000, memory=1024, gpus=None)
    assert [(g.id, g.model, g.memory) for g in config.node.gpus] == [
        ("gpu0", "A100-SXM4-40GB", 40960),
        ("gpu1", "A100-SXM4-40GB", 40960),
    ]
    assert config.gpu_uuids == {
        "gpu0": "GPU-aaaaaaaa-0000-0000-0000-000000000000",
        "gpu1": "GPU-bbbbbbbb-0000-0000-0000-000000000001",
    }
    assert config.notes == ("2 GPU detected by nvidia-smi",)


def test_a_declaration_that_nvidia_smi_contradicts_is_replaced_and_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_smi(tmp_path, monkeypatch, f"cat <<'EOF'\n{CSV}EOF")
    config = build_config(
        node_id="n1", data_dir=tmp_path, cpu=1000, memory=1024, gpus=[("H100", 81920)]
    )
    assert [g.model for g in config.node.gpus] == ["A100-SXM4-40GB"] * 2
    assert config.notes[0].startswith("--gpu contradicts nvidia-smi; registering")
    agreeing = [("A100-SXM4-40GB", 40960)] * 2
    config = build_config(node_id="n1", data_dir=tmp_path, cpu=1000, memory=1024, gpus=agreeing)
    assert config.notes == ("2 GPU as declared, confirmed by nvidia-smi",)
    assert len(config.gpu_uuids) == 2


def test_without_nvidia_smi_declared_gpus_are_registered_and_none_is_a_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi there
    assert detect_gpus() == ([], "no nvidia-smi on PATH")
    config = build_config(
        node_id="n1", data_dir=tmp_path, cpu=1000, memory=1024, gpus=[("T4", 15360)]
    )
    assert [(g.id, g.model) for g in config.node.gpus] == [("gpu0", "T4")]
    assert config.gpu_uuids == {}
    assert config.notes == ("1 GPU as declared (no nvidia-smi on PATH)",)
    bare = build_config(node_id="n1", data_dir=tmp_path, cpu=1000, memory=1024, gpus=None)
    assert bare.node.gpus == ()
    assert bare.notes == (
        "no GPUs detected (no nvidia-smi on PATH); declare them with --gpu MODEL:MiB",
    )


def test_a_failing_nvidia_smi_is_a_reason_not_a_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_smi(tmp_path, monkeypatch, "echo 'NVIDIA-SMI has failed' >&2; exit 9")
    gpus, why = detect_gpus()
    assert gpus == [] and why.startswith("nvidia-smi failed:")
    bare = build_config(node_id="n1", data_dir=tmp_path, cpu=1000, memory=1024, gpus=None)
    assert bare.node.gpus == () and "nvidia-smi failed" in bare.notes[0]


def test_agent_check_says_what_tasks_get_and_writes_nothing(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from forge import cli

    _fake_smi(tmp_path, monkeypatch, f"cat <<'EOF'\n{CSV}EOF")
    data = tmp_path / "data"
    monkeypatch.setenv("FORGE_DATA_DIR", str(data))
    monkeypatch.setenv("FORGE_TEMPORAL_ADDRESS", "127.0.0.1:1")  # never reached
    argv = ["agent", "--node-id", "n1", "--advertise-address", "10.0.0.7", "--check"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "gpu0: A100-SXM4-40GB 40960 MiB GPU-aaaaaaaa-0000-0000-0000-000000000000" in out
    assert "2 GPU detected by nvidia-smi" in out
    assert "peers reach this node at 10.0.0.7" in out
    assert "limits" in out  # hard or not, and why
    assert not data.exists()
