"""The ``forge`` command: plan offline, drive a cluster, run a worker or a dev setup.

Why it looks the way it does:

- **Click, one module per noun** (:mod:`forge.cli.job`, :mod:`~forge.cli.node` ...),
  gathered in :mod:`forge.cli.root`. Flags are checked by the types in
  :mod:`forge.cli.params`, so bad input fails before any connection, the same way
  whether or not a server is up.
- **Exit codes 0 / 1 / 2, decided here and only here.** A usage error (Click) and
  every :class:`~forge.errors.InvalidInput` (an invalid job file, an update the
  workflow's validator refused, an unusable ``FORGE_*`` setting) exit 2; any other
  :class:`~forge.errors.ForgeError` (no server, an RPC error, a store down, a
  :class:`~forge.errors.NotFound` job or node) exits 1. Both print one message to
  stderr, never a traceback: a traceback says "bug in Forge", and these are not bugs.
- **Flags win over the environment.** ``--address``, ``--namespace``,
  ``--cluster`` and ``--task-queue`` override ``FORGE_TEMPORAL_ADDRESS``,
  ``FORGE_NAMESPACE``, ``FORGE_CLUSTER`` and ``FORGE_TASK_QUEUE``, which only
  :mod:`forge.settings` reads.
"""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Sequence

import click

from forge.errors import ForgeError

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``forge`` command; returns the exit code (the console script exits
    with it). Never raises for user or environment errors."""
    from forge.cli.root import forge

    args = list(sys.argv[1:] if argv is None else argv)
    try:
        with forge.make_context("forge", args) as ctx:
            return int(forge.invoke(ctx) or 0)
    except click.exceptions.Exit as exit_:  # --help, --version
        return exit_.exit_code
    except click.ClickException as err:  # usage errors: usage line + message, exit 2
        err.show()
        return err.exit_code
    except ForgeError as err:
        print(f"forge: {err}" if err.prefixed else str(err), file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("forge: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `forge plan ... | head`: the reader left; not an error
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    finally:
        if "temporalio.service" in sys.modules:  # (the gRPC client; temporalio.client too)
            # Free the Temporal client's Rust-backed objects now, while the interpreter
            # is fully alive. Left to interpreter shutdown, their clean-up can run on a
            # Rust thread during finalisation and abort the process ("PyGILState_Release:
            # thread state must be current"), turning exit 0 into 134 about half the
            # time (temporalio/sdk-python#300). Frozen objects (the worker freezes)
            # are never collected: unfreeze them first.
            gc.unfreeze()
            gc.collect()
