"""The ``forge`` root imports no noun: ``forge --help`` answers at once and
``forge job validate`` never loads the Temporal SDK, while every command is still
listed, with its own short help, and each one's ``--help`` works."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import click
import pytest

from forge import cli
from forge.cli.root import COMMANDS, forge, load

REPO = Path(__file__).resolve().parents[2]

_PROBE = """\
import sys
from forge import cli
code = cli.main(sys.argv[1:])
heavy = ("temporalio", "pydantic", "google", "yaml")
print(code)
print(" ".join(sorted({m.split(".")[0] for m in sys.modules if m.split(".")[0] in heavy})))
print(" ".join(sorted(m for m in sys.modules if m.startswith("forge."))))
"""


def _imports_of(*argv: str) -> tuple[int, set[str], set[str]]:
    """Run ``forge ARGV`` in a fresh interpreter: (exit code, heavy top-level
    packages imported, forge modules imported)."""
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, *argv],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        check=False,
    )
    lines = done.stdout.splitlines()[-3:]
    assert len(lines) == 3, done.stdout + done.stderr
    return int(lines[0]), set(lines[1].split()), set(lines[2].split())


def test_help_imports_no_noun_and_no_heavy_package() -> None:
    code, heavy, modules = _imports_of("--help")
    assert code == 0
    assert heavy == set(), f"forge --help imported {heavy}"
    assert modules <= {"forge.cli", "forge.cli.root", "forge.cli.text", "forge.errors"}, modules


def test_job_validate_never_imports_temporalio() -> None:
    code, heavy, modules = _imports_of("job", "validate", "examples/web.yaml")
    assert code == 0
    assert "temporalio" not in heavy
    assert "forge.settings" not in modules and "forge.client.client" not in modules
    assert "forge.cli.plan" not in modules  # validating does not load the planner


def test_a_bad_job_file_still_exits_2_without_temporalio(tmp_path: Path) -> None:
    bad = tmp_path / "job.yaml"
    bad.write_text("name: web\ngroups: []\n")
    code, heavy, _ = _imports_of("job", "validate", str(bad))
    assert code == 2 and "temporalio" not in heavy


def test_help_lists_every_command_with_the_short_help_of_its_module(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    section = out.split("Commands:\n")[1].split("\n\n")[0]
    listed = [line.split()[0] for line in section.splitlines() if not line.startswith("   ")]
    assert listed == list(COMMANDS)
    flat = " ".join(section.split())
    for name, (target, short) in COMMANDS.items():
        command = load(target)
        assert command.name == name, f"{target} is named {command.name!r}, listed as {name!r}"
        # the listing is built from the table: it must say what the command says
        assert command.get_short_help_str(limit=1000) == short, name
        assert " ".join(short.split()) in flat


def _every_command() -> list[list[str]]:
    paths: list[list[str]] = []

    def walk(command: click.Command, path: list[str]) -> None:
        paths.append(path)
        if isinstance(command, click.Group):
            for name, sub in command.commands.items():
                walk(sub, [*path, name])

    for name in COMMANDS:
        walk(forge.commands[name], [name])
    return paths


@pytest.mark.parametrize("path", _every_command(), ids=" ".join)
def test_every_command_has_a_working_help(
    path: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main([*path, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"Usage: forge {' '.join(path)}")


def test_an_unknown_command_is_a_usage_error_with_a_suggestion(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["stauts"]) == 2
    err = capsys.readouterr().err
    assert "No such command 'stauts'" in err and "status" in err
