"""Flag and argument types: a check's message reaches the user naming the flag, with
exit 2, and a default is never re-parsed."""

from __future__ import annotations

import click
import pytest

from forge import cli
from forge.cli import params
from forge.cli.root import forge
from forge.loaders import GPU_MEMORY_MIB


def test_a_failed_check_becomes_a_usage_error_naming_the_parameter() -> None:
    @click.command()
    @click.option("--count", type=params.Checked(params.replicas))
    def command(count: int) -> None:
        raise AssertionError("not reached")

    with pytest.raises(click.BadParameter) as raised:
        command.make_context("command", ["--count", "-3"])
    assert raised.value.exit_code == 2
    assert "'--count'" in raised.value.format_message()
    assert "'-3' must be >= 0" in raised.value.format_message()


def test_a_default_is_passed_through_unconverted() -> None:
    checked = params.Checked(params.positive_float)
    assert checked.convert(10.0, None, None) == 10.0
    assert checked.convert("2.5", None, None) == 2.5


@pytest.mark.parametrize(
    ("check", "text", "value"),
    [
        (params.gpu, "T4", ("T4", GPU_MEMORY_MIB["T4"])),
        (params.gpu, "H100:81920", ("H100", 81920)),
        (params.label, "example.com/zone=a=b", ("example.com/zone", "a=b")),
        (params.origin, "HTTP://LocalHost:8233/", "http://localhost:8233"),
        (params.host, "[::1]", "::1"),
    ],
)
def test_checks_return_the_parsed_value(check, text, value) -> None:
    assert check(text) == value


def test_help_lists_the_nouns_in_reading_order_and_exits_0(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    section = out.split("Commands:\n")[1].split("\n\n")[0]
    listed = [line.split()[0] for line in section.splitlines() if not line.startswith("   ")]
    assert listed == list(forge.commands)
    assert listed[:3] == ["plan", "job", "node"]
    assert "exit codes: 0 ok, 1 failure (no server, RPC error), 2 bad input." in out


def test_no_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([]) == 2
    assert "Usage: forge" in capsys.readouterr().err
