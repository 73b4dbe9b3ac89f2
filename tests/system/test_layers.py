"""The package layout is the architecture: these tests keep its arrows pointing down.

``forge.core`` is the pure core (no temporalio, no I/O, nothing from the layers
above it); ``forge.wire`` may use the core; stores, client and CLI sit above.
Each check imports in a fresh interpreter so one test's imports cannot hide
another's.
"""

from __future__ import annotations

import pkgutil
import subprocess
import sys
import textwrap
from pathlib import Path

import forge

ROOT = Path(forge.__file__).resolve().parent.parent


def _modules(package: str) -> list[str]:
    path = ROOT / Path(*package.split("."))
    names = [package]
    for info in pkgutil.walk_packages([str(path)], prefix=package + "."):
        names.append(info.name)
    return sorted(names)


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_core_imports_without_temporalio_and_without_the_upper_layers() -> None:
    modules = _modules("forge.core")
    assert "forge.core.reconcile" in modules and "forge.core.placement.select" in modules
    result = _run(
        f"""
        import importlib, sys

        class Block:
            def find_spec(self, name, path=None, target=None):
                if name == "temporalio" or name.startswith("temporalio."):
                    raise ImportError("the core must not import " + name)
                return None

        sys.meta_path.insert(0, Block())
        for name in {modules!r}:
            importlib.import_module(name)
        upper = sorted(
            m for m in sys.modules
            if m.startswith(("forge.wire", "forge.stores", "forge.client", "forge.cli",
                             "forge.services", "forge.loaders", "sqlite3", "psycopg"))
        )
        assert not upper, upper
        print("ok", len({modules!r}))
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok")


def test_the_block_would_catch_a_core_module_that_imports_temporalio() -> None:
    """The guard above is only worth something if it fails when the rule is broken."""
    result = _run(
        """
        import sys

        class Block:
            def find_spec(self, name, path=None, target=None):
                if name == "temporalio" or name.startswith("temporalio."):
                    raise ImportError("the core must not import " + name)
                return None

        sys.meta_path.insert(0, Block())
        import forge.wire.codec
        """
    )
    assert result.returncode != 0
    assert "the core must not import temporalio" in result.stderr


def test_the_workflow_side_of_the_wire_loads_no_store_backend() -> None:
    """The workflow imports the activity contract; that must not pull SQLite or psycopg in."""
    result = _run(
        """
        import sys
        import forge.wire.activity_contract, forge.wire.contract, forge.wire.views
        loaded = sorted(m for m in sys.modules
                        if m in ("sqlite3", "psycopg", "forge.stores.sqlite",
                                 "forge.stores.postgres", "forge.stores.migrations"))
        assert not loaded, loaded
        """
    )
    assert result.returncode == 0, result.stderr
