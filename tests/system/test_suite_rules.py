"""The suite's own rules hold: skips need an opt-out, Hypothesis profiles are
chosen by the environment and print how to reproduce a failure."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

CONFTEST = (Path(__file__).parents[1] / "conftest.py").read_text()

SKIPPING = """
import os
import pytest

def test_plain_skip():
    pytest.skip("no reason at all")

def test_opted_out():
    pytest.skip("PostgreSQL unreachable and FORGE_SKIP_POSTGRES=1: refused")

@pytest.mark.xfail(strict=True, reason="known")
def test_known_failure():
    assert False

def test_passes():
    assert True
"""


@pytest.fixture
def suite(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    for var in ("FORGE_ALLOW_SKIPS", "FORGE_SKIP_POSTGRES", "CI", "HYPOTHESIS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_skipping=SKIPPING)
    return pytester


def test_a_skip_without_an_opt_out_fails_the_run(suite: pytest.Pytester) -> None:
    result = suite.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=2, xfailed=1)
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*skipped without an opt-out: no reason at all*"])


def test_a_skip_naming_a_set_opt_out_variable_is_allowed(
    suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FORGE_SKIP_POSTGRES", "1")
    result = suite.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1, skipped=1, xfailed=1)


def test_forge_allow_skips_allows_every_skip(
    suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FORGE_ALLOW_SKIPS", "1")
    result = suite.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, skipped=2, xfailed=1)
    assert result.ret == 0


def test_a_module_level_skip_fails_the_run(pytester: pytest.Pytester, monkeypatch) -> None:
    monkeypatch.delenv("FORGE_ALLOW_SKIPS", raising=False)
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_gone="import pytest\npytest.importorskip('no_such_module_xyz')\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*skipped without an opt-out*no_such_module_xyz*"])


HYPO = """
from hypothesis import given, strategies as st, settings

def test_profile_in_force():
    print("PROFILE", settings.get_current_profile_name(), settings.default.derandomize)

@given(st.integers())
def test_property(x):
    assert isinstance(x, int)
"""


def test_ci_selects_the_derandomized_profile_and_says_so(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HYPOTHESIS_PROFILE", raising=False)
    monkeypatch.setenv("CI", "true")
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_h=HYPO)
    result = pytester.runpytest_subprocess("-s", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        ["forge: hypothesis profile 'ci' (derandomized*", "*PROFILE ci True"]
    )


def test_a_local_run_is_random_and_prints_a_seed_that_can_be_forced(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HYPOTHESIS_PROFILE", raising=False)
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("FORGE_HYPOTHESIS_SEED", raising=False)
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_h=HYPO)
    result = pytester.runpytest_subprocess("-s", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        ["forge: hypothesis profile 'dev' (seed *: reproduce with `pytest --hypothesis-seed=*"]
    )
    result.stdout.fnmatch_lines(["*PROFILE dev False"])
    forced = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--hypothesis-seed=1234")
    forced.stdout.fnmatch_lines(["*seed 1234: reproduce with `pytest --hypothesis-seed=1234*"])


MUTATIONS = sorted((Path(__file__).parents[1] / "mutations").glob("*.patch"))


@pytest.mark.parametrize("patch", MUTATIONS, ids=lambda p: p.stem)
def test_every_mutation_still_applies_and_names_its_tests(patch: Path) -> None:
    import subprocess

    from tests.mutations.run import ROOT, Mutation

    m = Mutation.load(patch)
    assert m.tests and all(not t.startswith("tests/") or (ROOT / t).exists() for t in m.tests)
    check = subprocess.run(
        ["git", "apply", "--check", str(patch)], cwd=ROOT, capture_output=True, text=True
    )
    assert check.returncode == 0, f"{patch.name} no longer applies: {check.stderr}"


def test_a_quiet_run_still_prints_the_seed(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HYPOTHESIS_PROFILE", raising=False)
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setenv("FORGE_HYPOTHESIS_SEED", "77")
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_h=HYPO)
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["forge: hypothesis profile 'dev' (seed 77: *"])
