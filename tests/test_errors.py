"""One root, a few kinds: every error Forge raises on purpose says whose fault it is
(and so the exit code) through the kind it subclasses, whatever module raised it."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from forge import errors
from forge.client.client import ForgeError as ClientForgeError
from forge.loaders import InputError
from forge.services.dev import DevError
from forge.settings import SettingsError
from forge.stores import StaleFenceError, StoreError


@pytest.mark.parametrize(
    ("cls", "kind", "exit_code"),
    [
        (InputError, errors.InvalidInput, 2),
        (SettingsError, errors.InvalidInput, 2),
        (errors.NotFound, errors.InvalidInput, 2),
        (StoreError, errors.ForgeError, 1),
        (StaleFenceError, errors.Conflict, 1),
        (DevError, errors.Unavailable, 1),
    ],
)
def test_each_module_error_has_a_kind_and_its_exit_code(
    cls: type[errors.ForgeError], kind: type[errors.ForgeError], exit_code: int
) -> None:
    assert issubclass(cls, kind) and issubclass(cls, errors.ForgeError)
    err = cls("x")
    assert err.exit_code == exit_code
    assert err.bad_input is (exit_code == 2)


def test_old_names_still_catch_what_they_caught() -> None:
    """Code written against the module classes keeps working: ``except ValueError``
    for settings, ``except StoreError`` for a stale fence, the client's ForgeError."""
    assert issubclass(SettingsError, ValueError)
    assert issubclass(StaleFenceError, StoreError)
    assert ClientForgeError is errors.ForgeError


def test_only_loader_messages_are_printed_without_the_forge_prefix() -> None:
    """A loader's message is already ``FILE: where: what`` lines; others get ``forge:``."""
    assert InputError.prefixed is False
    assert all(c.prefixed for c in (errors.InvalidInput, StoreError, SettingsError, DevError))


def test_errors_import_without_temporalio_so_the_core_may_raise_them() -> None:
    code = textwrap.dedent(
        """
        import sys

        class Block:
            def find_spec(self, name, path=None, target=None):
                if name == "temporalio" or name.startswith("temporalio."):
                    raise ImportError("forge.errors must not import " + name)
                return None

        sys.meta_path.insert(0, Block())
        import forge.errors
        print(sorted(m for m in sys.modules if m.startswith("forge.")))
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "['forge.errors']"
