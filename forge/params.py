"""The values Forge's front ends read from text, checked once for all of them.

Every check is a plain function ``str -> value`` that raises ``ValueError`` with
the message to show. :class:`forge.cli.params.Checked` turns one into a Click type
(Click then names the flag: ``Invalid value for '--gpu': ...``, exit 2); the agent
(:mod:`forge.agent.config`), ``forge dev`` and the codec server use the same ones,
so a flag accepts the same forms and refuses the same text with the same message
wherever it appears. :func:`node_from_flags` is the node such flags describe.

Below the CLI and the agent (core and errors only; the loaders' table of known GPU
models is read lazily, it brings YAML) so both may import it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from forge.core.limits import MAX_MEMORY, MAX_REPLICAS, is_valid_name
from forge.errors import InvalidInput

if TYPE_CHECKING:  # the models load with node_from_flags: the flags' checks need none
    from forge.core.models import Node

__all__ = [
    "NAME_HELP",
    "address",
    "address_problem",
    "gpu",
    "host",
    "label",
    "listen_port",
    "name",
    "node_from_flags",
    "nonempty",
    "nonnegative_int",
    "origin",
    "permille",
    "port",
    "positive_float",
    "replicas",
    "seconds",
]

NAME_HELP = "1-63 of A-Z a-z 0-9 . _ - (starting with a letter or digit)"
_LABEL_KEY_RE = re.compile(
    r"^([A-Za-z0-9]([-A-Za-z0-9.]{0,251}[A-Za-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
_MAX_LABEL_VALUE = 4096


def name(text: str) -> str:
    if not is_valid_name(text):
        raise ValueError(f"{text!r}: must be {NAME_HELP}")
    return text


def nonempty(text: str) -> str:
    if not text.strip():
        raise ValueError("must not be empty")
    return text


def address_problem(text: str) -> str | None:
    host, sep, port = text.rpartition(":")
    if not sep or not host or any(c.isspace() for c in text):
        return f"{text!r} is not host:port"
    if not port.isdigit() or not 0 < int(port) < 65536:
        return f"{text!r}: port must be 1-65535"
    return None


def address(text: str) -> str:
    problem = address_problem(text)
    if problem:
        raise ValueError(problem)
    return text


def nonnegative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{text!r} is not an integer") from None
    if value < 0:
        raise ValueError(f"{text!r} must be >= 0")
    return value


def permille(text: str) -> int:
    value = nonnegative_int(text)
    if value > 1000:
        raise ValueError(f"{text!r} must be 0..1000 (per mille)")
    return value


def replicas(text: str) -> int:
    value = nonnegative_int(text)
    if value > MAX_REPLICAS:
        raise ValueError(f"{text!r} must be <= {MAX_REPLICAS}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number") from None
    if not value > 0 or value == float("inf"):
        raise ValueError(f"{text!r} must be a positive number")
    return value


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise ValueError(f"{text!r} is not a positive number of seconds")
    return value


def gpu(text: str) -> tuple[str, int]:
    """``MODEL:MEMORY_MIB`` (or a known ``MODEL``) -> (model, memory MiB)."""
    from forge.loaders import GPU_MEMORY_MIB  # lazily: the loaders bring YAML

    model, sep, memory = text.partition(":")
    if not is_valid_name(model):
        raise ValueError(f"{text!r}: GPU model must be {NAME_HELP}")
    if not sep:
        if model in GPU_MEMORY_MIB:
            return model, GPU_MEMORY_MIB[model]
        raise ValueError(
            f"{text!r}: expected MODEL:MEMORY_MIB (memory is known only for "
            f"{', '.join(sorted(GPU_MEMORY_MIB))})"
        )
    if not memory.isdigit() or not 0 < int(memory) <= MAX_MEMORY:
        raise ValueError(f"{text!r}: GPU memory must be a whole number of MiB, 1-{MAX_MEMORY}")
    return model, int(memory)


def label(text: str) -> tuple[str, str]:
    """``KEY=VALUE`` with a Kubernetes-style key (``[prefix/]name``)."""
    key, sep, value = text.partition("=")
    if not sep:
        raise ValueError(f"{text!r}: expected KEY=VALUE")
    if not _LABEL_KEY_RE.match(key):
        raise ValueError(
            f"{text!r}: label key must be [prefix/]name, name 1-63 of A-Z a-z 0-9 - _ . "
            "starting and ending with a letter or digit"
        )
    if len(value) > _MAX_LABEL_VALUE or not value.isprintable():
        raise ValueError(
            f"{text!r}: label value must be printable, at most {_MAX_LABEL_VALUE} characters"
        )
    return key, value


def port(text: str) -> int:
    """A port to connect to or serve on (1-65535)."""
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise ValueError(f"{text!r} is not a port (1-65535)")
    return int(text)


def listen_port(text: str) -> int:
    """A port to listen on; 0 asks the system for a free one."""
    if not text.isdigit() or not 0 <= int(text) < 65536:
        raise ValueError(f"{text!r} is not a port (0-65535)")
    return int(text)


def host(text: str) -> str:
    text = text.strip("[]")
    if not text or any(c.isspace() for c in text):
        raise ValueError(f"{text!r} is not a host name or IP address")
    return text


def origin(text: str) -> str:
    """A browser origin as browsers send it (no trailing slash, lower case)."""
    if text == "*":
        return text
    parts = urlsplit(text)
    bad = (
        parts.scheme not in ("http", "https")
        or not parts.hostname
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
    )
    if bad:
        raise ValueError(
            f"{text!r} is not an origin: give scheme://host[:port], e.g. http://localhost:8233"
        )
    return f"{parts.scheme}://{parts.netloc}".lower()


def node_from_flags(
    node_id: str,
    cpu: int,
    memory: int,
    gpus: Sequence[tuple[str, int]],
    labels: Sequence[tuple[str, str]],
    *,
    source: str = "node add",
) -> Node:
    """The node that ``--gpu`` (devices gpu0, gpu1, ... as :func:`gpu` parsed them)
    and ``--label`` (:func:`label`) flags describe, or :class:`InvalidInput` naming
    the field, each line prefixed with ``source``."""
    by_key: dict[str, str] = {}
    for key, value in labels:
        if key in by_key:
            raise InvalidInput(f"--label {key} given twice")
        by_key[key] = value
    data = {
        "id": node_id,
        "cpu": cpu,
        "memory": memory,
        "gpus": [
            {"id": f"gpu{i}", "model": model, "memory": mib} for i, (model, mib) in enumerate(gpus)
        ],
        "labels": by_key,
    }
    import pydantic

    from forge.core.models import Node

    try:
        return Node.model_validate_json(json.dumps(data))
    except pydantic.ValidationError as err:
        from forge.loaders import format_validation_error  # lazily: the loaders bring YAML

        raise InvalidInput(format_validation_error(err, source)) from None
