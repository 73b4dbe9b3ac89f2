"""``forge codec-key``: key files made with a random key, owner-only from the start,
extended and promoted for a rotation, refused with exit 2 when asked the impossible."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from forge import cli
from forge.settings import Settings
from forge.wire.encryption import CodecKeys


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(["codec-key", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def ids(path: Path) -> list[str]:
    return CodecKeys.parse(path.read_text()).ids


def test_new_makes_an_owner_only_file_with_one_random_key(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "keys" / "codec.key"
    code, out, _ = run(capsys, "new", str(path), "--id", "first")
    assert code == 0 and "key first added (current)" in out
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert ids(path) == ["first"] and path.read_text().startswith("# Forge payload encryption")
    keys = Settings(codec_key_file=path).encryption_keys()  # what every process reads
    assert keys.current == "first" and len(keys.get("first") or b"") == 32
    other = tmp_path / "other.key"
    assert run(capsys, "new", str(other))[0] == 0
    assert CodecKeys.parse(other.read_text()).get(ids(other)[0]) != keys.get("first")


def test_a_rotation_standby_then_promote_keeps_every_key(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "codec.key"
    run(capsys, "new", str(path), "--id", "old")
    before = CodecKeys.parse(path.read_text()).get("old")
    code, out, _ = run(capsys, "new", str(path), "--id", "next", "--standby")
    assert code == 0 and "key next added (decrypting only)" in out
    assert ids(path) == ["old", "next"]  # step 1: the old key still encrypts
    code, out, _ = run(capsys, "promote", str(path), "next")
    assert code == 0 and "key next is current; keys next, old" in out
    assert ids(path) == ["next", "old"]  # step 2
    assert CodecKeys.parse(path.read_text()).get("old") == before  # the old key unchanged
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # rewritten, still owner-only
    code, out, _ = run(capsys, "new", str(path), "--id", "now")  # no --standby: current
    assert code == 0 and ids(path) == ["now", "next", "old"]
    code, out, _ = run(capsys, "list", str(path))
    assert out.splitlines() == ["now  (current)", "next", "old"]
    assert path.read_text().startswith("# Forge")  # the header stays on top


def test_if_missing_leaves_an_existing_file_alone(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "codec.key"
    run(capsys, "new", str(path), "--if-missing")
    text = path.read_text()
    code, out, _ = run(capsys, "new", str(path), "--if-missing")
    assert code == 0 and "left as it is" in out and path.read_text() == text


def test_dash_prints_one_entry_for_the_variable(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "new", "-", "--id", "env-1")
    assert code == 0
    keys = Settings.from_env({"FORGE_CODEC_KEYS": out.strip()}).encryption_keys()
    assert keys.ids == ["env-1"]


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (["new", "{path}", "--id", "no spaces"], "key id 'no spaces'"),
        (["new", "{path}", "--id", "k1"], "already holds a key 'k1'"),
        (["promote", "{path}", "k9"], "holds no key 'k9' (it holds k1)"),
        (["list", "{missing}"], "cannot read"),
    ],
)
def test_what_cannot_be_done_exits_2_naming_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, argv: list[str], problem: str
) -> None:
    path = tmp_path / "codec.key"
    run(capsys, "new", str(path), "--id", "k1")
    text = path.read_text()
    args = [a.format(path=path, missing=tmp_path / "missing.key") for a in argv]
    code, out, err = run(capsys, *args)
    assert code == 2, out + err
    assert problem in err and "Traceback" not in err
    assert path.read_text() == text  # nothing changed
    assert text.split(":")[-1].strip() not in out + err  # no key material shown
