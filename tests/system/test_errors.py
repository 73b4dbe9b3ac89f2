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
        (errors.NotFound, errors.NotFound, 1),
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


def test_bad_input_and_not_found_are_the_callers_fault_with_different_exit_codes() -> None:
    """Neither is worth retrying; a name that does not exist exits 1, a malformed
    request 2, so a script can tell "fix the request" from "nothing by that name"."""
    assert errors.InvalidInput("x").bad_input and errors.NotFound("x").bad_input
    assert not issubclass(errors.NotFound, errors.InvalidInput)
    assert (errors.InvalidInput.exit_code, errors.NotFound.exit_code) == (2, 1)
    assert not any(k("x").bad_input for k in (errors.Unavailable, errors.Busy, errors.Conflict))


def test_old_names_still_catch_what_they_caught() -> None:
    """Code written against the module classes keeps working: ``except ValueError``
    for settings, ``except StoreError`` for a stale fence, the client's ForgeError."""
    assert issubclass(SettingsError, ValueError)
    assert issubclass(StaleFenceError, StoreError)
    assert ClientForgeError is errors.ForgeError


def test_each_kind_names_its_wire_type_and_the_table_maps_it_back() -> None:
    kinds = [
        errors.ForgeError,
        errors.InvalidInput,
        errors.NotFound,
        errors.Unavailable,
        errors.Busy,
        errors.Conflict,
    ]
    assert len({k.wire_type for k in kinds}) == len(kinds)
    for kind in kinds:
        assert errors.WIRE_TYPES[kind.wire_type] is kind
        err = errors.from_wire(kind.wire_type, "msg")
        assert type(err) is kind and str(err) == "msg"
    # a module's class travels as its kind (a stale fence) or as its own name
    assert errors.WIRE_TYPES[StaleFenceError.wire_type] is errors.Conflict
    assert type(errors.from_wire(StoreError.wire_type, "m")) is errors.ForgeError
    assert type(errors.from_wire("SomethingNew", "m", errors.InvalidInput)) is errors.InvalidInput


def test_the_wire_names_other_clients_match_on_keep_their_meaning() -> None:
    """Plain-JSON clients (examples/plain_client.py, other SDKs) match these strings."""
    from forge.wire import errors as wire

    assert (wire.INVALID_INPUT, wire.BUSY, wire.STALE_FENCE, wire.STORE_ERROR) == (
        "InvalidInput",
        "Busy",
        "StaleFence",
        "StoreError",
    )
    assert wire.NOT_FOUND == "NotFound"
    assert wire.NON_RETRYABLE_STORE == ("StaleFence", "StoreError", "InvalidInput")
    assert errors.WIRE_TYPES["InvalidInput"] is errors.InvalidInput
    assert errors.WIRE_TYPES["Busy"] is errors.Busy


def test_an_application_error_round_trips_to_its_kind() -> None:
    from temporalio.exceptions import ApplicationError

    from forge.wire import errors as wire

    for err in (errors.InvalidInput("bad"), errors.NotFound("unknown job 'x'")):
        failure = wire.encode(err)
        assert failure.type == err.wire_type and failure.non_retryable
        back = wire.decode(failure)
        assert type(back) is type(err) and str(back) == str(err)
    assert not wire.encode(errors.Busy("later")).non_retryable
    assert type(wire.decode(wire.encode(StaleFenceError("old")))) is errors.Conflict
    assert wire.encode(StoreError("x")).type == "StoreError"
    wrapped = ApplicationError("Failed decoding arguments")
    wrapped.__cause__ = ApplicationError("job.name: too long")
    decoded = wire.decode(wrapped, default=errors.InvalidInput)
    assert type(decoded) is errors.InvalidInput
    assert str(decoded) == "Failed decoding arguments: job.name: too long"


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
