"""``forge``'s public surface (as httpx's ``tests/test_exported_members.py``): exactly
these names, each one resolving to the object its module defines, and ``import
forge`` itself loading none of them."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import forge

EXPECTED = {
    # the client, and what it connects with
    "ForgeClient",
    "Settings",
    # what a cluster is made of
    "Assignment",
    "AssignmentStatus",
    "GpuDevice",
    "GpuRequest",
    "Job",
    "Node",
    "NodeState",
    "Resources",
    "ScalingPolicy",
    "Task",
    "TaskGroup",
    # job and node files
    "InputError",
    "load_jobs",
    "load_nodes",
    # what the client answers
    "Explanation",
    "JobResult",
    "StatusView",
    "Summary",
    # what it raises
    "Busy",
    "Conflict",
    "ForgeError",
    "InvalidInput",
    "NotFound",
    "Unavailable",
}


def test_all_is_exactly_the_public_surface() -> None:
    assert set(forge.__all__) == EXPECTED
    assert len(forge.__all__) == len(EXPECTED)  # no name twice
    assert forge.__all__ == sorted(forge.__all__)


def test_each_exported_name_resolves_to_its_modules_object() -> None:
    from forge import errors
    from forge.client import client
    from forge.core import models

    for name in forge.__all__:
        value = getattr(forge, name)
        assert value is not None, name
        module = sys.modules[value.__module__] if hasattr(value, "__module__") else None
        assert module is not None and module.__name__.startswith("forge."), (name, module)
    assert forge.ForgeClient is client.ForgeClient
    assert forge.Job is models.Job and forge.GpuDevice is models.GpuDevice
    assert forge.NotFound is errors.NotFound
    assert issubclass(forge.NotFound, forge.ForgeError)
    assert set(forge.__all__) <= set(dir(forge))


def test_an_unknown_name_is_an_attribute_error() -> None:
    try:
        getattr(forge, "NoSuchThing")  # noqa: B009
    except AttributeError as err:
        assert "NoSuchThing" in str(err)
    else:
        raise AssertionError("forge.NoSuchThing resolved")


def test_importing_forge_loads_nothing_until_a_name_is_used() -> None:
    code = textwrap.dedent(
        """
        import sys
        import forge
        heavy = ("forge.", "pydantic", "temporalio")
        before = sorted(m for m in sys.modules if m.startswith(heavy))
        from forge import NotFound
        after_error = sorted(m for m in sys.modules if m.startswith(("pydantic", "temporalio")))
        from forge import Job
        print(before, after_error, "pydantic" in sys.modules, "temporalio" in sys.modules)
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["[]", "[]", "True", "False"]
