"""The ``forge`` command: plan offline, drive a cluster, run a worker or a dev setup.

Why the pieces look the way they do:

- **argparse, exit codes 0 / 1 / 2.** argparse exits 2 on a usage error; Forge
  extends that to every input problem the user can fix (an invalid job file, a bad
  flag value, an update the workflow's validator refused, an unusable ``FORGE_*``
  setting). Failures of the environment (no server, an RPC error) exit 1. Both
  print one message to stderr, never a traceback: a traceback says "bug in Forge",
  and these are not bugs.
- **Input is checked before any connection.** ``node add --gpu nonsense`` fails
  the same way whether or not a server is up, and fails fast.
- **Temporal is imported lazily.** ``forge plan`` and ``forge job validate`` never
  talk to a server, so they do not pay for importing the SDK.
- **Flags win over the environment.** ``--address``, ``--namespace``,
  ``--cluster`` and ``--task-queue`` override ``FORGE_TEMPORAL_ADDRESS``,
  ``FORGE_NAMESPACE``, ``FORGE_CLUSTER`` and ``FORGE_TASK_QUEUE``
  (:meth:`forge.settings.Settings.from_env`).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import re
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from functools import partial
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import pydantic

from forge.cli import output
from forge.core.models import MAX_MEMORY, MAX_REPLICAS, Job, Node, is_valid_name
from forge.core.placement.scorers import ALGORITHMS
from forge.core.reconcile import ReconcileOptions, reconcile
from forge.loaders import GPU_MEMORY_MIB, InputError, format_validation_error, load_jobs, load_nodes
from forge.settings import Settings, SettingsError

if TYPE_CHECKING:
    from temporalio.client import Client
    from temporalio.service import RPCError

    from forge.client.client import ForgeClient
    from forge.stores import Store
    from forge.wire.contract import JobResult

__all__ = [
    "CONNECT_TIMEOUT",
    "MANY_JOBS",
    "SUBMIT_SLICE",
    "CommandError",
    "build_parser",
    "main",
]

#: Seconds to wait for a Temporal connection before giving up (``--connect-timeout``).
CONNECT_TIMEOUT = 10.0
#: ``job run`` hands the client this many jobs at a time (it batches them into
#: updates and keeps those within the server's in-flight limit); between slices a
#: terminal shows progress.
SUBMIT_SLICE = 1000
#: Above this many jobs, ``job run`` prints a summary instead of a line per job.
MANY_JOBS = 20

_NAME_HELP = "1-63 of A-Z a-z 0-9 . _ - (starting with a letter or digit)"
_LABEL_KEY_RE = re.compile(
    r"^([A-Za-z0-9]([-A-Za-z0-9.]{0,251}[A-Za-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
_MAX_LABEL_VALUE = 4096

Handler = Callable[[argparse.Namespace], int]
_T = TypeVar("_T")


class CommandError(Exception):
    """A failure with a message for the user and the exit code to leave with
    (2: the input was wrong, 1: the environment failed)."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


# ===================================================================== entry point


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``forge`` command; returns the exit code (the console script exits
    with it). Never raises for user or environment errors."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        handler: Handler = args.handler
        return handler(args)
    except SystemExit as exit_:  # argparse: usage errors exit 2, --help exits 0
        code = exit_.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    except CommandError as err:
        _error(str(err))
        return err.code
    except InputError as err:  # already "FILE: where: what", one problem a line
        print(err, file=sys.stderr)
        return 2
    except SettingsError as err:
        _error(str(err))
        return 2
    except KeyboardInterrupt:
        _error("interrupted")
        return 130
    except BrokenPipeError:  # `forge plan ... | head`: the reader left; not an error
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    finally:
        if "temporalio.client" in sys.modules:
            # Free the Temporal client's Rust-backed objects now, while the interpreter
            # is fully alive. Left to interpreter shutdown, their clean-up can run on a
            # Rust thread during finalisation and abort the process ("PyGILState_Release:
            # thread state must be current"), turning exit 0 into 134 about half the
            # time (temporalio/sdk-python#300).
            gc.collect()


def _error(message: str) -> None:
    print(f"forge: {message}", file=sys.stderr)


# ========================================================================== parser


def build_parser() -> argparse.ArgumentParser:
    """The whole command tree (exposed for tests and for generated docs)."""
    from forge.services import dev

    parser = argparse.ArgumentParser(
        prog="forge",
        description="Forge: a durable cluster reconciler (one Temporal workflow per cluster).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=(
            "environment: FORGE_TEMPORAL_ADDRESS, FORGE_NAMESPACE, FORGE_CLUSTER,\n"
            "FORGE_TASK_QUEUE (flags win), FORGE_STORE / FORGE_DATA_DIR (the store).\n"
            "exit codes: 0 ok, 1 failure (no server, RPC error), 2 bad input."
        ),
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    temporal = argparse.ArgumentParser(add_help=False)
    g = temporal.add_argument_group("Temporal connection (flags win over FORGE_* variables)")
    g.add_argument("--address", type=_address, help="host:port (FORGE_TEMPORAL_ADDRESS)")
    g.add_argument("--namespace", type=_nonempty, help="namespace (FORGE_NAMESPACE)")
    g.add_argument("--cluster", type=_name, help="cluster name (FORGE_CLUSTER, default 'default')")
    g.add_argument("--task-queue", type=_nonempty, help="task queue (FORGE_TASK_QUEUE)")
    g.add_argument(
        "--connect-timeout",
        type=_positive_float,
        default=CONNECT_TIMEOUT,
        metavar="SECONDS",
        help=f"give up connecting after this long (default {CONNECT_TIMEOUT:g})",
    )
    store = argparse.ArgumentParser(add_help=False)
    store.add_argument(
        "--store",
        metavar="URL",
        help="store URL (default: FORGE_STORE, else sqlite in FORGE_DATA_DIR, default .forge)",
    )

    # -- plan ----------------------------------------------------------------------
    p = sub.add_parser(
        "plan",
        help="dry-run one placement pass offline (no server)",
        description=(
            "Plan one reconcile pass offline with exactly the code the cluster workflow "
            "runs (forge.core.reconcile): every replica of the jobs against the nodes, no "
            "existing bindings.\n\n--json prints one object: {placements: [{workload_id, "
            "node, gpu_ids}], pending: [{workload_id, reasons}], summary: {placed, pending, "
            "nodes_used, gpus_used, gpu_milli_used, seconds}}; seconds is the planning time "
            "only; a shared GPU's placement adds gpu_milli, gpus_used counts devices "
            "holding anything."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--nodes", required=True, metavar="FILE", help="nodes: YAML, JSON or trace CSV")
    p.add_argument("--jobs", required=True, metavar="FILE", help="jobs: YAML, JSON or trace CSV")
    p.add_argument("--algorithm", choices=ALGORITHMS, default="binpack")
    p.add_argument(
        "--placement-version",
        type=int,
        choices=(1, 2),
        default=2,
        help="1: as recorded workflow histories place; 2 (default): GPU reservation, "
        "GPU jobs first within a priority, binpack fills nodes in use first",
    )
    p.add_argument(
        "--gpu-reserve",
        type=_permille,
        default=None,
        metavar="PERMILLE",
        help="share of each free GPU's cpu/memory kept from GPU-less work, 0-1000 "
        "(default: the placement version's)",
    )
    p.add_argument(
        "--candidates",
        type=_nonnegative_int,
        default=ReconcileOptions().candidates,
        metavar="N",
        help="feasible nodes scored per replica; 0 scores all (default %(default)s)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=cmd_plan)

    # -- job -----------------------------------------------------------------------
    job = sub.add_parser("job", help="validate, run, scale, stop and list jobs")
    jsub = job.add_subparsers(dest="job_command", required=True, metavar="COMMAND")

    p = jsub.add_parser("validate", help="check a job file without submitting it")
    p.add_argument("file", metavar="FILE")
    p.set_defaults(handler=cmd_job_validate)

    p = jsub.add_parser(
        "run",
        parents=[temporal],
        help="submit the jobs of a file (starts the cluster workflow if needed)",
        description=(
            "Submit every job of FILE (the first by update-with-start, so the cluster "
            "workflow is started when it is not running; the rest in batched updates, a "
            f"few in flight at once). Above {MANY_JOBS} jobs a summary replaces the "
            "per-job lines."
        ),
    )
    p.add_argument("file", metavar="FILE")
    p.add_argument(
        "--no-wait", action="store_true", help="return once stored, before the pass that plans it"
    )
    p.set_defaults(handler=cmd_job_run)

    p = jsub.add_parser("scale", parents=[temporal], help="set a group's desired replica count")
    p.add_argument("job_id", metavar="JOB", type=_name)
    p.add_argument("group", metavar="GROUP", type=_name)
    p.add_argument("count", metavar="COUNT", type=_replicas)
    p.set_defaults(handler=cmd_job_scale)

    p = jsub.add_parser("stop", parents=[temporal], help="stop a job (release its replicas)")
    p.add_argument("job_id", metavar="JOB", type=_name)
    p.set_defaults(handler=cmd_job_stop)

    p = jsub.add_parser(
        "list",
        parents=[store],
        help="list the jobs of a cluster (reads the store)",
        description=(
            "List the cluster's jobs with desired and bound replica counts, read from the "
            "store the worker persists to (FORGE_STORE, else FORGE_DATA_DIR/forge.db, or "
            "--store): the workflow's status query carries counts, not a job list, and "
            "the store holds exactly what the workflow persisted after each pass."
        ),
    )
    p.add_argument("--cluster", type=_name, help="cluster name (FORGE_CLUSTER, default 'default')")
    p.add_argument("--json", action="store_true", help="print a JSON list")
    p.set_defaults(handler=cmd_job_list)

    # -- node ----------------------------------------------------------------------
    node = sub.add_parser("node", help="add, remove, drain nodes; report loss and heartbeats")
    nsub = node.add_subparsers(dest="node_command", required=True, metavar="COMMAND")

    p = nsub.add_parser(
        "add",
        parents=[temporal],
        help="register nodes: one from flags, or many from --file",
        description=(
            "Register one node from flags (--id, --cpu, --memory, optional --gpu and "
            "--label), or the nodes of a file (--file: YAML/JSON list or the Alibaba node "
            "CSV). Nodes are signalled in batches; the next pass places onto them."
        ),
    )
    p.add_argument("--file", metavar="FILE", help="node file (YAML, JSON or trace CSV)")
    p.add_argument("--id", dest="node_id", type=_name, help=f"node id ({_NAME_HELP})")
    p.add_argument("--cpu", type=_nonnegative_int, metavar="MILLICORES")
    p.add_argument("--memory", type=_nonnegative_int, metavar="MIB")
    p.add_argument(
        "--gpu",
        action="append",
        type=_gpu,
        default=[],
        metavar="MODEL:MEMORY_MIB",
        help="one GPU device per use (ids gpu0, gpu1, ...); MODEL alone for known models "
        f"({', '.join(sorted(GPU_MEMORY_MIB))})",
    )
    p.add_argument(
        "--label", action="append", type=_label, default=[], metavar="KEY=VALUE", help="node label"
    )
    p.set_defaults(handler=cmd_node_add, parser=p)

    for name, help_text, func in (
        ("remove", "unregister a node (its replicas move)", cmd_node_remove),
        ("lost", "report a node lost (its replicas move now)", cmd_node_lost),
        ("drain", "drain a node and wait for the pass that moves its replicas", cmd_node_drain),
    ):
        p = nsub.add_parser(name, parents=[temporal], help=help_text)
        p.add_argument("node_id", metavar="ID", type=_name)
        p.set_defaults(handler=func)

    p = nsub.add_parser(
        "heartbeat",
        parents=[store],
        help="record a node heartbeat in the store",
        description=(
            "Write a heartbeat for node ID straight into the store (not a signal: "
            "heartbeats are high-rate traffic, read in batches by the workflow's watch)."
        ),
    )
    p.add_argument("node_id", metavar="ID", type=_name)
    p.add_argument("--cluster", type=_name, help="cluster name (FORGE_CLUSTER, default 'default')")
    p.set_defaults(handler=cmd_node_heartbeat)

    # -- cluster, status, explain ---------------------------------------------------
    cluster = sub.add_parser("cluster", help="manage the cluster workflow")
    csub = cluster.add_subparsers(dest="cluster_command", required=True, metavar="COMMAND")
    p = csub.add_parser("start", parents=[temporal], help="start the cluster workflow if needed")
    p.set_defaults(handler=cmd_cluster_start)

    p = sub.add_parser(
        "status",
        parents=[temporal, store],
        help="show counts, nodes and pending replicas",
        description=(
            "Show the cluster's summary, nodes and pending replicas grouped by reason, as "
            "the last pass published them: read from the store the worker persists to, "
            "never by querying the workflow.\n\n"
            "--json prints one object: {summary: {desired, bound, pending, ...}, nodes: "
            "[{id, state, cpu: {capacity, allocated}, memory: {capacity, allocated}, gpus: "
            "{total, allocated}}], assignments: [{workload_id, node, gpu_ids, status}], "
            "pending: [{workload_id, reasons}]}. Units: millicores, MiB."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "-a", "--assignments", action="store_true", help="also list every binding (human output)"
    )
    p.set_defaults(handler=cmd_status)

    p = sub.add_parser(
        "explain",
        parents=[temporal, store],
        help="why a replica is where it is, or not placed (reads the store)",
    )
    p.add_argument("workload_id", metavar="WORKLOAD_ID", help="job/group/ordinal, e.g. web/api/0")
    p.set_defaults(handler=cmd_explain)

    # -- store, worker, dev ----------------------------------------------------------
    st = sub.add_parser("store", help="store maintenance")
    ssub = st.add_subparsers(dest="store_command", required=True, metavar="COMMAND")
    p = ssub.add_parser("migrate", parents=[store], help="create or upgrade the store's schema")
    p.set_defaults(handler=cmd_store_migrate)

    p = sub.add_parser(
        "worker",
        parents=[temporal, store],
        help="run a worker in this process (like `python -m worker`)",
        description="Run the worker that hosts the cluster workflow and its activities.",
    )
    p.set_defaults(handler=cmd_worker)

    # -- agent, logs (the node agent: option handling lives in forge.agent) ------------
    p = sub.add_parser(
        "agent",
        parents=[temporal, store],
        help="run a node agent: register this machine, run the replicas bound to it",
        description=(
            "Register node ID (capacity detected from the machine unless given), heartbeat "
            "through the store and run the replicas bound to it as processes. Tasks keep "
            "running when the agent exits; a restarted agent adopts them."
        ),
    )
    p.add_argument("--node-id", required=True, type=_name, metavar="ID")
    p.add_argument("--cpu", type=_nonnegative_int, metavar="MILLICORES")
    p.add_argument("--memory", type=_nonnegative_int, metavar="MIB")
    p.add_argument("--gpu", action="append", metavar="MODEL:MEMORY_MIB")
    p.add_argument("--label", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--data-dir", metavar="DIR", help="default: FORGE_DATA_DIR/agent-ID")
    p.add_argument("--logs-address", default="127.0.0.1:0", metavar="HOST:PORT")
    p.add_argument("--token", default="", help="log server token (FORGE_AGENT_TOKEN)")
    p.add_argument("--poll", type=_positive_float, default=0.5, metavar="SECONDS")
    p.add_argument("--heartbeat-every", type=_positive_float, default=5.0, metavar="SECONDS")
    p.add_argument("--usage-every", type=_positive_float, default=10.0, metavar="SECONDS")
    p.add_argument("--stop-tasks-on-exit", action="store_true")
    p.set_defaults(handler=cmd_agent)

    p = sub.add_parser("logs", parents=[store], help="print a replica's task log")
    p.add_argument("workload_id", metavar="JOB/GROUP/ORDINAL")
    p.add_argument("--task", default="", help="task name (default: the first)")
    p.add_argument("-f", "--follow", action="store_true")
    p.add_argument("--token", default="", help="the agent's token (FORGE_AGENT_TOKEN)")
    p.add_argument("--cluster", type=_name, help="cluster name (FORGE_CLUSTER, default 'default')")
    p.set_defaults(handler=cmd_logs)

    p = sub.add_parser(
        "dev",
        help="run a local Temporal dev server + worker (+ --demo)",
        description=dev.DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    dev.add_arguments(p)
    p.set_defaults(handler=dev.run)

    from forge.services import codec_server

    p = sub.add_parser(
        "codec-server",
        help="serve Temporal's codec protocol so the Web UI and CLI read Forge's payloads",
        description=codec_server.DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    codec_server.add_arguments(p)
    p.set_defaults(handler=codec_server.run)
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("forge-reconciler")
    except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        return "unknown"


# ---------------------------------------------------------------- argument types


def _name(text: str) -> str:
    if not is_valid_name(text):
        raise argparse.ArgumentTypeError(f"{text!r}: must be {_NAME_HELP}")
    return text


def _nonempty(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def _address(text: str) -> str:
    problem = _address_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return text


def _address_problem(text: str) -> str | None:
    host, sep, port = text.rpartition(":")
    if not sep or not host or any(c.isspace() for c in text):
        return f"{text!r} is not host:port"
    if not port.isdigit() or not 0 < int(port) < 65536:
        return f"{text!r}: port must be 1-65535"
    return None


def _permille(text: str) -> int:
    value = _nonnegative_int(text)
    if value > 1000:
        raise argparse.ArgumentTypeError(f"{text!r} must be 0..1000 (per mille)")
    return value


def _nonnegative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 0")
    return value


def _replicas(text: str) -> int:
    value = _nonnegative_int(text)
    if value > MAX_REPLICAS:
        raise argparse.ArgumentTypeError(f"{text!r} must be <= {MAX_REPLICAS}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive number")
    return value


def _gpu(text: str) -> tuple[str, int]:
    """``MODEL:MEMORY_MIB`` (or a known ``MODEL``) -> (model, memory MiB)."""
    model, sep, memory = text.partition(":")
    if not is_valid_name(model):
        raise argparse.ArgumentTypeError(f"{text!r}: GPU model must be {_NAME_HELP}")
    if not sep:
        if model in GPU_MEMORY_MIB:
            return model, GPU_MEMORY_MIB[model]
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected MODEL:MEMORY_MIB (memory is known only for "
            f"{', '.join(sorted(GPU_MEMORY_MIB))})"
        )
    if not memory.isdigit() or not 0 < int(memory) <= MAX_MEMORY:
        raise argparse.ArgumentTypeError(
            f"{text!r}: GPU memory must be a whole number of MiB, 1-{MAX_MEMORY}"
        )
    return model, int(memory)


def _label(text: str) -> tuple[str, str]:
    """``KEY=VALUE`` with a Kubernetes-style key (``[prefix/]name``)."""
    key, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"{text!r}: expected KEY=VALUE")
    if not _LABEL_KEY_RE.match(key):
        raise argparse.ArgumentTypeError(
            f"{text!r}: label key must be [prefix/]name, name 1-63 of A-Z a-z 0-9 - _ . "
            "starting and ending with a letter or digit"
        )
    if len(value) > _MAX_LABEL_VALUE or not value.isprintable():
        raise argparse.ArgumentTypeError(
            f"{text!r}: label value must be printable, at most {_MAX_LABEL_VALUE} characters"
        )
    return key, value


# ========================================================================= helpers


def _settings(args: argparse.Namespace) -> Settings:
    """``FORGE_*`` environment overridden by the flags this command has."""
    s = Settings.from_env().override(
        address=getattr(args, "address", None),
        namespace=getattr(args, "namespace", None),
        cluster=getattr(args, "cluster", None),
        task_queue=getattr(args, "task_queue", None),
        store=getattr(args, "store", None),
    )
    if not is_valid_name(s.cluster):
        raise SettingsError(f"FORGE_CLUSTER={s.cluster!r}: a cluster name must be {_NAME_HELP}")
    problem = _address_problem(s.address)
    if problem:
        raise SettingsError(f"FORGE_TEMPORAL_ADDRESS: {problem}")
    if not s.task_queue.strip() or not s.namespace.strip():
        raise SettingsError("FORGE_TASK_QUEUE and FORGE_NAMESPACE must not be empty")
    return s


def _print_json(obj: object) -> None:
    """One JSON document: indented on a terminal, one compact line for pipes."""
    indent = 2 if sys.stdout.isatty() else None
    print(json.dumps(obj, indent=indent))


def _replica_count(jobs: Sequence[Job]) -> int:
    return sum(g.scaling.desired for j in jobs for g in j.groups)


def _web_ui_hint(settings: Settings) -> str:
    """Where to see the workflow; a dev server's UI is the gRPC port + 1000."""
    wid = f"forge-cluster-{settings.cluster}"
    host, _, port = settings.address.rpartition(":")
    if host in ("localhost", "127.0.0.1", "[::1]") and port.isdigit():
        return (
            f"Web UI (dev server): http://{host}:{int(port) + 1000}/namespaces/"
            f"{settings.namespace}/workflows/{wid}"
        )
    return f"Web UI: open workflow {wid} in namespace {settings.namespace}"


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _connect_problem(err: BaseException) -> str:
    """The useful part of the SDK's connect error (a Rust debug dump)."""
    text = str(err)
    messages = re.findall(r'message: "([^"]+)"', text)
    if messages:
        return str(messages[-1]).lower()
    return _one_line(text.removeprefix("Failed client connect: "))


async def _connect(settings: Settings, timeout: float) -> Client:
    try:
        client: Client = await asyncio.wait_for(settings.connect(), timeout)
    except TimeoutError:
        raise CommandError(
            f"cannot connect to Temporal at {settings.address}: no answer within {timeout:g} s"
        ) from None
    except SettingsError:
        raise  # an unreadable TLS file: bad input (exit 2), not a connection failure
    except (RuntimeError, OSError, ValueError) as err:
        raise CommandError(
            f"cannot connect to Temporal at {settings.address}: {_connect_problem(err)}"
        ) from None
    return client


def _rpc_message(err: RPCError, settings: Settings) -> str:
    from temporalio.service import RPCStatusCode

    msg = _one_line(err.message or str(err))
    wid = f"forge-cluster-{settings.cluster}"
    if err.status == RPCStatusCode.NOT_FOUND and "workflow" in msg.lower():
        return (
            f"cluster {settings.cluster!r} is not running (no workflow {wid} in namespace "
            f"{settings.namespace!r}); start it with `forge cluster start` or `forge job run`"
        )
    if err.status == RPCStatusCode.DEADLINE_EXCEEDED or "timeout expired" in msg.lower():
        return (
            f"the cluster workflow {wid} did not answer in time: is a worker (`forge worker`) "
            f"polling task queue {settings.task_queue!r} at {settings.address}?"
        )
    if err.status == RPCStatusCode.UNAVAILABLE:
        return f"Temporal at {settings.address} is unavailable: {msg}"
    return f"Temporal at {settings.address}: {err.status.name.lower()}: {msg}"


def _remote(
    args: argparse.Namespace,
    action: Callable[[ForgeClient], Awaitable[int]],
    *,
    reads_store: bool = False,
) -> int:
    """Connect with the command's settings, run ``action``, map SDK errors to exits.
    ``reads_store``: the command reads what the loop published to the store."""
    settings = _settings(args)
    return asyncio.run(_run_remote(settings, args.connect_timeout, action, reads_store))


async def _run_remote(
    settings: Settings,
    timeout: float,
    action: Callable[[ForgeClient], Awaitable[int]],
    reads_store: bool = False,
) -> int:
    from temporalio.client import (
        WorkflowQueryFailedError,
        WorkflowQueryRejectedError,
        WorkflowUpdateRPCTimeoutOrCancelledError,
    )
    from temporalio.service import RPCError

    from forge.client.client import ForgeClient, ForgeError

    asyncio.get_running_loop().set_exception_handler(_quiet_sdk_orphans)
    client = await _connect(settings, timeout)
    store = _open_existing_store(settings.store_url) if reads_store else None
    fc = ForgeClient(client, cluster=settings.cluster, task_queue=settings.task_queue, store=store)
    try:
        return await action(fc)
    except ForgeError as err:
        raise CommandError(_one_line(str(err)), 2 if err.bad_input else 1) from None
    except RPCError as err:
        raise CommandError(_rpc_message(err, settings)) from None
    except (WorkflowQueryFailedError, WorkflowQueryRejectedError) as err:
        raise CommandError(f"query refused by {fc.workflow_id}: {_one_line(str(err))}") from None
    except WorkflowUpdateRPCTimeoutOrCancelledError:
        raise CommandError(
            f"no answer from {fc.workflow_id} in time: is a worker polling task queue "
            f"{settings.task_queue!r}?"
        ) from None
    finally:
        if store is not None:
            store.close()


def _quiet_sdk_orphans(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """Drop asyncio's "Future exception was never retrieved" for Temporal errors.

    A failed update-with-start also fails the start operation's workflow-handle
    future, which nobody awaits; asyncio then prints that error again, with a
    traceback, when the future is collected. The failure itself has already been
    reported as one line; anything else goes to the default handler.
    """
    from temporalio.exceptions import TemporalError

    orphan = str(context.get("message", "")).startswith("Future exception was never retrieved")
    if orphan and isinstance(context.get("exception"), TemporalError):
        return
    loop.default_exception_handler(context)


def _safe_url(url: str) -> str:
    """A store URL without its password (``user:PASSWORD@`` or ``?password=``), for
    messages."""
    url = re.sub(r"(://[^:/@]*):[^@/]*@", r"\1:***@", url)
    return re.sub(r"(?i)([?&](?:ssl)?password=)[^&#]*", r"\1***", url)


def _open_existing_store(url: str) -> Store:
    """Open the store a worker already writes: refuse to create an empty one by
    accident (a wrong FORGE_DATA_DIR would otherwise look like an empty cluster)."""
    from forge.stores import open_store, store_kind
    from forge.stores.sqlite import sqlite_path

    try:
        kind = store_kind(url)
        if kind == "memory":
            raise CommandError(
                "memory:// lives inside the worker process; pass the worker's sqlite or "
                "postgres store with --store or FORGE_STORE",
                2,
            )
        if kind == "sqlite" and not os.path.exists(sqlite_path(url)):
            raise CommandError(
                f"no store at {sqlite_path(url)}: point --store, FORGE_STORE or "
                "FORGE_DATA_DIR at the store the worker uses"
            )
    except ValueError as err:
        raise CommandError(str(err), 2) from None
    return _store_call(lambda: open_store(url), url)


def _store_call(fn: Callable[[], _T], url: str) -> _T:
    """Run a store operation; database failures become exit 1 with the URL named."""
    import sqlite3

    from forge.stores import StoreError

    try:
        return fn()
    except Exception as err:
        # psycopg is imported by fn itself (when it opens a PostgreSQL store), so its
        # error class can only be looked up now
        pg = sys.modules.get("psycopg")
        errors: tuple[type[BaseException], ...] = (StoreError, OSError, sqlite3.Error)
        if not (isinstance(err, errors) or (pg is not None and isinstance(err, pg.Error))):
            raise
        raise CommandError(f"store {_safe_url(url)}: {_one_line(str(err))}") from None


# ======================================================================== commands


def cmd_plan(args: argparse.Namespace) -> int:
    nodes = load_nodes(args.nodes)
    jobs = load_jobs(args.jobs)
    replicas = _replica_count(jobs)
    options = ReconcileOptions(
        algorithm=args.algorithm,
        candidates=args.candidates,
        max_placements=max(1, replicas),
        placement_version=args.placement_version,
        gpu_reserve=args.gpu_reserve,
    )
    show = sys.stderr.isatty() and not (args.json and not sys.stdout.isatty())
    message = f"planning {replicas:,} replicas on {len(nodes):,} nodes..."
    with output.Spinner(message, enabled=show):
        start = time.perf_counter()
        plan = reconcile(
            jobs={j.id: j for j in jobs},
            nodes={n.id: n for n in nodes},
            bindings={},
            pending={},
            failures={},
            now=0.0,
            options=options,
        )
        seconds = time.perf_counter() - start
    if args.json:
        _print_json(output.plan_json(plan, seconds))
    else:
        print(
            output.plan_text(
                plan, nodes, seconds, algorithm=args.algorithm, candidates=args.candidates
            )
        )
    return 0


def cmd_job_validate(args: argparse.Namespace) -> int:
    jobs = load_jobs(args.file)
    print(f"ok: {len(jobs)} jobs ({_replica_count(jobs)} replicas)")
    return 0


def cmd_job_run(args: argparse.Namespace) -> int:
    jobs = load_jobs(args.file)  # before connecting: bad input fails fast, offline
    wait = not args.no_wait

    async def action(fc: ForgeClient) -> int:
        results = await _submit_all(fc, jobs, wait=wait)
        if len(jobs) <= MANY_JOBS:
            for r in results:
                if wait:
                    print(output.job_result_line(r))
                else:
                    print(
                        f"{r.job_id}: submitted (revision {r.revision}; not waiting for placement)"
                    )
        elif wait:
            print(
                f"submitted {len(results):,} jobs: {sum(r.desired for r in results):,} desired, "
                f"{sum(r.bound for r in results):,} bound, {sum(r.pending for r in results):,} "
                "pending (as of the pass that planned them; see forge status)"
            )
        else:
            print(f"submitted {len(results):,} jobs (not waiting for placement; see forge status)")
        return 0

    return _remote(args, action)


async def _submit_all(fc: ForgeClient, jobs: Sequence[Job], *, wait: bool) -> list[JobResult]:
    """Submit in batched updates (``ForgeClient.submit_jobs``: one update per
    ``MAX_JOBS_PER_UPDATE`` jobs, within the server's in-flight update limit).

    One update per job would hit Temporal's per-run cap on distinct updates (2,000
    by default) on the Alibaba trace's 8,152 jobs, and cost a workflow round trip
    each. The jobs go in slices of SUBMIT_SLICE so a terminal can show progress.
    """
    progress = sys.stderr.isatty() and len(jobs) > MANY_JOBS
    results: list[JobResult] = []
    try:
        for i in range(0, len(jobs), SUBMIT_SLICE):
            results += await fc.submit_jobs(jobs[i : i + SUBMIT_SLICE], wait=wait)
            if progress:
                sys.stderr.write(f"\rsubmitting jobs: {len(results):,}/{len(jobs):,}")
                sys.stderr.flush()
    except BaseException:
        if results:  # say what did go in: a rerun resubmits them, harmlessly
            first = "\n" if progress else ""  # end the progress line first
            print(
                f"{first}forge: {len(results):,} of {len(jobs):,} jobs were submitted",
                file=sys.stderr,
            )
        raise
    if progress:
        sys.stderr.write("\n")
    return results


def cmd_job_scale(args: argparse.Namespace) -> int:
    async def action(fc: ForgeClient) -> int:
        r = await fc.scale(args.job_id, args.group, args.count)
        print(f"{args.job_id}/{args.group} scaled to {args.count}; {output.job_result_line(r)}")
        return 0

    return _remote(args, action)


def cmd_job_stop(args: argparse.Namespace) -> int:
    async def action(fc: ForgeClient) -> int:
        r = await fc.stop_job(args.job_id)
        print(f"{r.job_id}: stopped (revision {r.revision})")
        return 0

    return _remote(args, action)


def cmd_job_list(args: argparse.Namespace) -> int:
    settings = _settings(args)
    url = settings.store_url
    store = _open_existing_store(url)
    try:
        jobs = _store_call(lambda: store.list_jobs(settings.cluster), url)
        bound: Counter[str] = Counter()
        after = ""
        while True:
            page = _store_call(partial(store.assignments, settings.cluster, after, 5000), url)
            bound.update(a.job for a in page)
            if len(page) < 5000:
                break
            after = page[-1].workload_id
    finally:
        store.close()
    if args.json:
        _print_json(
            [
                {
                    "id": j.id,
                    "priority": j.priority,
                    "desired": sum(g.scaling.desired for g in j.groups),
                    "bound": bound.get(j.id, 0),
                    "groups": {g.name: g.scaling.desired for g in j.groups},
                }
                for j in jobs
            ]
        )
    elif not jobs:
        print(f"no jobs in cluster {settings.cluster} (store {_safe_url(url)})")
    else:
        print(output.jobs_table(jobs, bound))
    return 0


def _usage(args: argparse.Namespace, message: str) -> NoReturn:
    parser: argparse.ArgumentParser = args.parser
    parser.error(message)  # prints usage, exits 2 (caught in main)


def cmd_node_add(args: argparse.Namespace) -> int:
    single = (args.node_id, args.cpu, args.memory)
    if args.file is not None:
        if any(v is not None for v in single) or args.gpu or args.label:
            _usage(args, "--file cannot be combined with --id/--cpu/--memory/--gpu/--label")
        nodes = load_nodes(args.file)
    else:
        if any(v is None for v in single):
            _usage(args, "give --file FILE, or --id, --cpu and --memory")
        nodes = [_node_from_flags(args)]

    async def action(fc: ForgeClient) -> int:
        count = await fc.register_nodes(nodes)
        what = nodes[0].id if count == 1 else f"{count:,} nodes"
        print(f"registered {what} in cluster {fc.cluster} (placed onto from the next pass)")
        return 0

    return _remote(args, action)


def _node_from_flags(args: argparse.Namespace) -> Node:
    labels: dict[str, str] = {}
    for key, value in args.label:
        if key in labels:
            raise CommandError(f"--label {key} given twice", 2)
        labels[key] = value
    data = {
        "id": args.node_id,
        "cpu": args.cpu,
        "memory": args.memory,
        "gpus": [
            {"id": f"gpu{i}", "model": model, "memory": memory}
            for i, (model, memory) in enumerate(args.gpu)
        ],
        "labels": labels,
    }
    try:
        return Node.model_validate_json(json.dumps(data))
    except pydantic.ValidationError as err:
        raise CommandError(format_validation_error(err, "node add"), 2) from None


def cmd_node_remove(args: argparse.Namespace) -> int:
    async def action(fc: ForgeClient) -> int:
        await fc.remove_node(args.node_id)
        print(f"node {args.node_id}: removal signalled; its replicas move on the next pass")
        return 0

    return _remote(args, action)


def cmd_node_lost(args: argparse.Namespace) -> int:
    async def action(fc: ForgeClient) -> int:
        await fc.node_lost(args.node_id)
        print(f"node {args.node_id}: reported lost; its replicas move on the next pass")
        return 0

    return _remote(args, action)


def cmd_node_drain(args: argparse.Namespace) -> int:
    async def action(fc: ForgeClient) -> int:
        moved = await fc.drain_node(args.node_id)
        print(f"node {args.node_id}: draining; {moved} replicas moved off it")
        return 0

    return _remote(args, action)


def cmd_node_heartbeat(args: argparse.Namespace) -> int:
    settings = _settings(args)
    url = settings.store_url
    store = _open_existing_store(url)
    now = time.time()
    try:
        _store_call(lambda: store.heartbeat(settings.cluster, args.node_id, now), url)
    finally:
        store.close()
    stamp = datetime.fromtimestamp(now, UTC).isoformat(timespec="seconds")
    print(f"heartbeat: node {args.node_id} in cluster {settings.cluster} at {stamp}")
    return 0


def cmd_cluster_start(args: argparse.Namespace) -> int:
    settings = _settings(args)

    async def action(fc: ForgeClient) -> int:
        run_id = await fc.start()
        print(f"cluster {fc.cluster}: workflow {fc.workflow_id} running (run {run_id})")
        print(_web_ui_hint(settings))
        return 0

    return _remote(args, action)


def cmd_status(args: argparse.Namespace) -> int:
    async def action(fc: ForgeClient) -> int:
        status = await fc.status()
        if args.json:
            _print_json(output.status_json(status, await fc.assignments()))
            return 0
        print(output.status_text(fc.cluster, status))
        if args.assignments:
            rows = [
                (a.workload_id, a.node, ",".join(a.gpu_ids) or "-", a.status)
                for a in await fc.assignments()
            ]
            print()
            print(output.table(("WORKLOAD", "NODE", "GPUS", "STATUS"), rows))
        return 0

    return _remote(args, action, reads_store=True)


def cmd_explain(args: argparse.Namespace) -> int:
    async def action(fc: ForgeClient) -> int:
        print(output.explain_text(await fc.explain(args.workload_id)))
        return 0

    return _remote(args, action, reads_store=True)


def cmd_store_migrate(args: argparse.Namespace) -> int:
    from forge.stores import migrate_url

    url = _settings(args).store_url
    try:
        version = _store_call(lambda: migrate_url(url), url)
    except ValueError as err:
        raise CommandError(str(err), 2) from None
    print(f"store {_safe_url(url)}: schema version {version}")
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    settings = _settings(args)  # validates flags and environment first
    for var, value in (
        ("FORGE_TEMPORAL_ADDRESS", settings.address),
        ("FORGE_NAMESPACE", settings.namespace),
        ("FORGE_CLUSTER", settings.cluster),
        ("FORGE_TASK_QUEUE", settings.task_queue),
        ("FORGE_STORE", settings.store),
    ):
        if value:
            os.environ[var] = value  # the worker reads its settings from the environment
    import worker  # lazily: forge must not depend on the worker module at import time

    try:
        code: Any = worker.main()
    except RuntimeError as err:  # the SDK's connect failure; anything else is a bug
        if not str(err).startswith("Failed client connect"):
            raise
        raise CommandError(
            f"cannot connect to Temporal at {settings.address}: {_connect_problem(err)}"
        ) from None
    return int(code or 0)


def cmd_agent(args: argparse.Namespace) -> int:
    from pathlib import Path

    from forge.agent.config import AgentConfigError, build_config
    from forge.agent.run import run_agent

    settings = _settings(args)
    data_dir = Path(args.data_dir) if args.data_dir else settings.data_dir / f"agent-{args.node_id}"
    try:
        config = build_config(
            node_id=args.node_id,
            data_dir=data_dir,
            cluster=settings.cluster,
            store_url=settings.store_url,
            cpu=args.cpu,
            memory=args.memory,
            gpus=args.gpu,
            labels=args.label,
            logs_address=args.logs_address,
            token=args.token or os.environ.get("FORGE_AGENT_TOKEN", ""),
            poll=args.poll,
            heartbeat_every=args.heartbeat_every,
            usage_every=args.usage_every,
        )
    except AgentConfigError as err:
        raise CommandError(str(err), 2) from None
    return run_agent(config, settings, stop_tasks_on_exit=args.stop_tasks_on_exit)


def cmd_logs(args: argparse.Namespace) -> int:
    from forge.agent.run import LogsError, fetch_logs

    settings = _settings(args)
    url = settings.store_url
    store = _open_existing_store(url)
    try:
        return fetch_logs(
            store,
            settings.cluster,
            args.workload_id,
            task=args.task,
            follow=args.follow,
            token=args.token or os.environ.get("FORGE_AGENT_TOKEN", ""),
        )
    except LogsError as err:
        raise CommandError(str(err)) from None
    finally:
        store.close()
