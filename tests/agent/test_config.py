"""``forge agent`` and ``forge node add`` read ``--gpu`` and ``--label`` with one
parser (:mod:`forge.params`): the same text gives the same node, the same bad text
the same message and exit 2, before anything is connected or written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import pytest

from forge import cli
from forge.agent.config import ADDRESS_LABEL, AgentConfigError, build_config, default_address
from forge.cli.agent import agent
from forge.cli.node import add
from forge.loaders import GPU_MEMORY_MIB
from forge.params import node_from_flags

GOOD = [
    ["--gpu", "A100:40960"],
    ["--gpu", "T4"],  # a known model: its memory from the table
    ["--gpu", "H100:81920", "--gpu", "T4"],
    ["--label", "zone=a"],
    ["--label", "example.com/zone=a=b", "--label", "disk=ssd"],
    ["--label", "empty="],
]

BAD = [
    ["--gpu", "A100"],  # no memory, and A100 is not in the table
    ["--gpu", "A100:lots"],
    ["--gpu", "A100:-5"],
    ["--gpu", "A100:0"],
    ["--gpu", "bad/model:100"],
    ["--gpu", ":100"],
    ["--label", "zone"],
    ["--label", "=v"],
    ["--label", "bad key=1"],
    ["--label", "k=\x07"],
]


def _params(command: click.Command, argv: list[str]) -> dict[str, Any]:
    return command.make_context(command.name or "", argv).params


@pytest.mark.parametrize("flags", GOOD, ids=" ".join)
def test_both_accept_the_same_forms_and_build_the_same_node(
    flags: list[str], tmp_path: Path
) -> None:
    on_agent = _params(agent, ["--node-id", "n1", *flags])
    on_node = _params(add, ["--id", "n1", *flags])
    assert on_agent["gpu"] == on_node["gpus"]
    assert on_agent["label"] == on_node["labels"]
    config = build_config(
        node_id="n1",
        data_dir=tmp_path,
        cpu=1000,
        memory=1024,
        gpus=list(on_agent["gpu"]),
        labels=list(on_agent["label"]),
    )
    # the agent adds the address its peers reach it at: a node add'ed node has none
    address = (ADDRESS_LABEL, default_address("127.0.0.1:0"))
    expected = node_from_flags("n1", 1000, 1024, on_node["gpus"], [*on_node["labels"], address])
    assert config.node == expected


def test_a_known_model_gets_its_memory_from_the_table() -> None:
    assert _params(agent, ["--node-id", "n1", "--gpu", "T4"])["gpu"] == (
        ("T4", GPU_MEMORY_MIB["T4"]),
    )


def _error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith(("Error:", "forge:"))]
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize("flags", [*BAD, ["--label", "zone=a", "--label", "zone=b"]], ids=" ".join)
def test_both_refuse_the_same_text_with_the_same_message(
    flags: list[str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.setenv("FORGE_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("FORGE_TEMPORAL_ADDRESS", "127.0.0.1:1")  # never reached
    assert cli.main(["agent", "--node-id", "n1", "--cpu", "1000", "--memory", "1024", *flags]) == 2
    _, on_agent = capsys.readouterr()
    assert cli.main(["node", "add", "--id", "n1", "--cpu", "1000", "--memory", "1024", *flags]) == 2
    _, on_node = capsys.readouterr()
    assert _error_line(on_agent) == _error_line(on_node)
    assert flags[0] in _error_line(on_agent)
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_build_config_refuses_a_label_twice_as_node_add_does(tmp_path: Path) -> None:
    with pytest.raises(AgentConfigError, match="--label zone given twice"):
        build_config(node_id="n1", data_dir=tmp_path, labels=[("zone", "a"), ("zone", "b")])


def test_the_advertised_address_is_given_or_the_routable_logs_host(tmp_path: Path) -> None:
    def address(advertise: str = "", logs: str = "127.0.0.1:0") -> str:
        config = build_config(
            node_id="n1",
            data_dir=tmp_path,
            cpu=1000,
            memory=1024,
            advertise_address=advertise,
            logs_address=logs,
            token="t",
        )
        return config.node.labels[ADDRESS_LABEL]

    assert address("10.1.2.3") == "10.1.2.3"
    assert address("gpu-7.example.com") == "gpu-7.example.com"
    assert address(logs="10.9.9.9:7000") == "10.9.9.9"
    # loopback or every interface: not an address a peer can use, so the host's own
    for logs in ("127.0.0.1:0", "0.0.0.0:7000"):
        assert address(logs=logs) == default_address(logs) != "0.0.0.0"


@pytest.mark.parametrize("bad", ["-lead", "a b", "x" * 254, "host:80"])
def test_a_bad_advertised_address_is_refused_naming_the_flag(tmp_path: Path, bad: str) -> None:
    with pytest.raises(AgentConfigError, match="--advertise-address"):
        build_config(node_id="n1", data_dir=tmp_path, advertise_address=bad)
