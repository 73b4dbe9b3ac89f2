"""Size limits as a ratchet: no module over 400 lines, no function over 60.

A long module or function is where the next kind of work gets wedged in beside the
last one (issue 36). The ones over the limit today are listed with their size; they
may shrink (then lower the number, or drop the entry once under the limit) but not
grow, and nothing new may cross a limit. The tables are the work left: split what is
listed rather than raising a number.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_MODULE = 400
MAX_FUNCTION = 60

#: Modules over MAX_MODULE lines today, and their size when listed.
LONG_MODULES: dict[str, int] = {
    "forge/agent/agent.py": 406,
    "forge/core/models.py": 427,
    "forge/core/placement/select.py": 436,
    "forge/core/placing.py": 529,
    "workflows/cluster.py": 569,
    "workflows/handlers.py": 563,
}

#: Functions over MAX_FUNCTION lines today (``module::name``), and their length.
LONG_FUNCTIONS: dict[str, int] = {
    "forge/agent/config.py::build_config": 63,
    "forge/agent/supervisor.py::start": 72,
    "forge/client/status_rows.py::_read": 78,
    "forge/client/watchdog.py::diagnose": 91,
    "forge/client/watchdog.py::watch": 72,
    "forge/core/placement/scan.py::best_in_window": 72,
    "forge/core/placement/searches.py::place_with": 84,
    "forge/core/placement/searches.py::place_gang": 62,
    "forge/core/placement/searches.py::_open": 65,
    "forge/core/placement/select.py::_rebase": 61,
    "forge/core/placing.py::_group": 70,
    "forge/core/preemption.py::_on_node": 69,
    "forge/core/rollout.py::step": 79,
    "forge/core/spread_down.py::spread_moves": 103,
    "forge/loaders/alibaba.py::parse_pod_csv": 63,
    "forge/services/codec_server.py::run": 66,
    "forge/services/dev.py::_session": 79,
}


def _sources() -> list[Path]:
    found = [p for d in ("forge", "workflows", "activities") for p in (ROOT / d).rglob("*.py")]
    return sorted([*found, ROOT / "worker.py"])


def module_sizes(paths: list[Path], root: Path = ROOT) -> dict[str, int]:
    return {p.relative_to(root).as_posix(): len(p.read_text().splitlines()) for p in paths}


def function_sizes(paths: list[Path], root: Path = ROOT) -> dict[str, int]:
    """Every function's length in lines (decorators excluded), by ``module::name``;
    two of one name in a module keep the longer."""
    out: dict[str, int] = {}
    for p in paths:
        rel = p.relative_to(root).as_posix()
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                end = node.end_lineno or node.lineno
                key = f"{rel}::{node.name}"
                out[key] = max(out.get(key, 0), end - node.lineno + 1)
    return out


def over(sizes: dict[str, int], limit: int, listed: dict[str, int]) -> list[str]:
    """What breaks the ratchet: unlisted entries over ``limit``, listed ones grown."""
    bad = []
    for name, size in sorted(sizes.items()):
        allowed = listed.get(name, limit)
        if size > allowed:
            was = f"listed at {allowed}" if name in listed else f"the limit is {limit}"
            bad.append(f"{name}: {size} lines ({was})")
    return bad


def test_no_module_grows_past_the_limit() -> None:
    assert over(module_sizes(_sources()), MAX_MODULE, LONG_MODULES) == []


def test_no_function_grows_past_the_limit() -> None:
    assert over(function_sizes(_sources()), MAX_FUNCTION, LONG_FUNCTIONS) == []


def test_the_lists_name_only_what_is_still_over() -> None:
    """An entry split below the limit is dropped, so the list stays the work left."""
    modules, functions = module_sizes(_sources()), function_sizes(_sources())
    stale = [m for m in LONG_MODULES if modules.get(m, 0) <= MAX_MODULE]
    stale += [f for f in LONG_FUNCTIONS if functions.get(f, 0) <= MAX_FUNCTION]
    assert stale == []


def test_the_ratchet_sees_growth_and_newcomers(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text(
        "@decorated\ndef f():\n"
        + "    x = 1\n" * 5
        + "\n\nclass C:\n    def g(self):\n        pass\n"
    )
    assert module_sizes([src], tmp_path) == {"m.py": 12}
    sizes = function_sizes([src], tmp_path)
    assert sizes == {"m.py::f": 6, "m.py::g": 2}
    assert over(sizes, 5, {}) == ["m.py::f: 6 lines (the limit is 5)"]
    assert over(sizes, 5, {"m.py::f": 6}) == []
    assert over(sizes, 5, {"m.py::f": 5}) == ["m.py::f: 6 lines (listed at 5)"]
