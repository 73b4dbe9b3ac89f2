"""Reading user files (jobs, nodes) into models, with errors a user can act on.

Every problem with a user's file becomes one :class:`InputError` whose message
names the file and each bad field as a dotted path (or a CSV line and column), so
the CLI can print ``str(err)`` and exit 2 without a traceback. All problems of a
file are reported at once (capped), because fixing a file one error per run is
miserable.

Formats are chosen by file extension:

- ``.yaml`` / ``.yml`` / ``.json`` -- jobs: one job mapping, a list of jobs, or (YAML)
  a multi-document stream; nodes: a list of nodes, ``{nodes: [...]}``, or one node.
  Nodes may use a short GPU form, ``gpus: {model: T4, count: 2}`` (or ``gpu:``),
  expanded into devices ``gpu0..gpuN-1``.
- ``.csv`` -- the Alibaba GPU trace (cluster-trace-gpu-v2023): node lists
  (``sn,cpu_milli,memory_mib,gpu,model``) and pod lists
  (``name,cpu_milli,memory_mib,num_gpu,...``), so the scheduler can be driven by a
  real production cluster.

Why YAML/JSON data is validated through pydantic's JSON mode: the models are strict,
and strict *Python* validation rejects a list for a tuple field, while strict *JSON*
validation takes arrays for tuples and strings for enums yet still refuses ``"500"``
for an int. So parsed documents are re-serialised (cheap at job-file sizes) and
validated with ``model_validate_json``; CSV rows are built as tuples in code and
validated with ``model_validate`` directly, which is faster.
"""

from __future__ import annotations

import os
from pathlib import Path

import pydantic  # noqa: F401  (format_validation_error's argument type, re-exported)

from forge.core.models import Job, Node
from forge.core.quota import QueueSpec
from forge.loaders.alibaba import (
    DEFAULT_GPU_MEMORY_MIB,
    GPU_MEMORY_MIB,
    parse_node_csv,
    parse_pod_csv,
)
from forge.loaders.documents import MAX_VALUES, job_documents, node_documents, queue_documents
from forge.loaders.errors import MAX_ERROR_LINES, InputError, format_validation_error

__all__ = [
    "DEFAULT_GPU_MEMORY_MIB",
    "GPU_MEMORY_MIB",
    "MAX_ERROR_LINES",
    "MAX_INPUT_BYTES",
    "MAX_VALUES",
    "SUPPORTED_EXTENSIONS",
    "InputError",
    "format_validation_error",
    "load_jobs",
    "load_nodes",
    "load_queues",
    "parse_jobs",
    "parse_nodes",
]

#: Files above this size are refused before parsing: a job or node file this big is
#: a mistake (or an attack), and parsing it would take memory and minutes.
MAX_INPUT_BYTES = 16 * 1024 * 1024

_EXTENSIONS = {".yaml": "yaml", ".yml": "yaml", ".json": "json", ".csv": "csv"}
SUPPORTED_EXTENSIONS: tuple[str, ...] = tuple(_EXTENSIONS)
_FORMATS = ("yaml", "json", "csv")


# --------------------------------------------------------------------------- public


def load_jobs(path: str | Path) -> list[Job]:
    """Read a job file (YAML, JSON, or an Alibaba pod-list CSV) into jobs."""
    source, fmt, text = _read(path)
    return parse_jobs(text, fmt=fmt, source=source)


def load_nodes(path: str | Path) -> list[Node]:
    """Read a node file (YAML, JSON, or an Alibaba node-list CSV) into nodes."""
    source, fmt, text = _read(path)
    return parse_nodes(text, fmt=fmt, source=source)


def load_queues(path: str | Path) -> list[QueueSpec]:
    """Read a queue file (YAML or JSON: ``queues: [...]``) into queue specs."""
    source, fmt, text = _read(path)
    if fmt == "csv":
        raise InputError(f"{source}: a queue file is YAML or JSON, not CSV")
    return queue_documents(_prepare(text, fmt, source), fmt, source)


def parse_jobs(text: str, *, fmt: str, source: str) -> list[Job]:
    """Parse job text in ``fmt`` ("yaml" | "json" | "csv"); ``source`` names it in errors.

    Job ids must be unique within the text. CSV jobs come back in arrival order
    (creation_time, then row order) when the trace gives creation times.
    """
    text = _prepare(text, fmt, source)
    if fmt == "csv":
        return parse_pod_csv(text, source)
    return job_documents(text, fmt, source)


def parse_nodes(text: str, *, fmt: str, source: str) -> list[Node]:
    """Parse node text in ``fmt`` ("yaml" | "json" | "csv"); ``source`` names it in errors.

    Node ids must be unique within the text.
    """
    text = _prepare(text, fmt, source)
    if fmt == "csv":
        return parse_node_csv(text, source)
    return node_documents(text, fmt, source)


# --------------------------------------------------------------------- reading text


def _read(path: str | Path) -> tuple[str, str, str]:
    """(source name, format, text) of a file, refusing bad extensions and big files."""
    source = os.fspath(path)
    suffix = Path(source).suffix
    fmt = _EXTENSIONS.get(suffix.lower())
    if fmt is None:
        kind = f"extension {suffix!r}" if suffix else "no extension"
        raise InputError(
            f"{source}: unsupported file type ({kind}); "
            f"supported extensions: {', '.join(SUPPORTED_EXTENSIONS)}"
        )
    try:
        with open(source, "rb") as f:
            if os.fstat(f.fileno()).st_size > MAX_INPUT_BYTES:
                raise InputError(_too_big(source))
            data = f.read(MAX_INPUT_BYTES + 1)  # the file may grow after fstat
    except FileNotFoundError:
        raise InputError(f"{source}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{source}: is a directory, not a file") from None
    except PermissionError:
        raise InputError(f"{source}: permission denied") from None
    except OSError as e:
        raise InputError(f"{source}: cannot read: {e.strerror or e}") from None
    if len(data) > MAX_INPUT_BYTES:
        raise InputError(_too_big(source))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{source}: not UTF-8 text (bad byte at offset {e.start})") from None
    return source, fmt, text


def _too_big(source: str) -> str:
    return f"{source}: file is larger than the {MAX_INPUT_BYTES // (1024 * 1024)} MiB limit"


def _prepare(text: str, fmt: str, source: str) -> str:
    """Check the format name and size, drop a byte-order mark, refuse empty text."""
    if fmt not in _FORMATS:
        raise InputError(f"{source}: unsupported format {fmt!r}; supported: {', '.join(_FORMATS)}")
    # len(text) <= bytes <= 4 * len(text): encode only when it can matter.
    if len(text) > MAX_INPUT_BYTES // 4 and len(text.encode("utf-8")) > MAX_INPUT_BYTES:
        raise InputError(_too_big(source))
    text = text.removeprefix("\ufeff")
    if not text.strip():
        raise InputError(f"{source}: file is empty")
    return text
