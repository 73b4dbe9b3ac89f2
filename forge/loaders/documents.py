"""YAML and JSON job and node files: safe parsing (no duplicate keys, no Python
objects, bounded size and depth), then validation of each item through
pydantic's JSON mode (see the package docstring for why)."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Hashable, Sequence
from typing import Any, TypeVar

import pydantic
import yaml
from pydantic import BaseModel

from forge.core.models import Job, Node
from forge.core.quota import QueueSpec
from forge.core.taskenv import reserved_env
from forge.loaders.alibaba import GPU_MEMORY_MIB
from forge.loaders.errors import (
    InputError,
    _describe,
    _dotted,
    _Errors,
    _kind,
    _show_name,
)
from forge.loaders.shorthand import GpuShorthand

try:  # libyaml's parser is ~10x faster; fall back to pure Python if it is missing.
    from yaml import CSafeLoader as _SafeLoader
except ImportError:  # pragma: no cover - depends on how PyYAML was built
    from yaml import SafeLoader as _SafeLoader  # type: ignore[assignment]

__all__ = ["MAX_VALUES", "job_documents", "node_documents", "queue_documents"]

#: A parsed document may hold at most this many values (after YAML aliases are
#: expanded), so a "billion laughs" file of nested aliases cannot eat the machine.
MAX_VALUES = 2_000_000

_M = TypeVar("_M", bound=BaseModel)


# --------------------------------------------------------------------- YAML / JSON


class _UniqueKeyLoader(_SafeLoader):
    """``yaml.safe_load``'s loader (same safe constructors, no Python objects) that
    also refuses duplicate mapping keys: plain PyYAML keeps the last one silently,
    so ``{cpu: 500, cpu: 5000}`` would be a setting that quietly does nothing."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Hashable, yaml.Mark] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # `<<: *base` keys may legitimately be overridden
                key = self.construct_object(key_node, deep=True)
                if not isinstance(key, Hashable):
                    continue  # the base class reports unhashable keys
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None,
                        None,
                        f"duplicate key {key!r} (first on line {seen[key].line + 1})",
                        key_node.start_mark,
                    )
                seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


def _documents(text: str, fmt: str, source: str) -> list[object]:
    """The non-empty top-level documents of YAML or JSON text."""
    try:
        docs = _load_yaml(text, source) if fmt == "yaml" else [_load_json(text, source)]
    except RecursionError:
        raise InputError(f"{source}: nested too deeply") from None
    docs = [d for d in docs if d is not None]
    if not docs:
        raise InputError(f"{source}: file is empty")
    for doc in docs:
        _check_tree(doc, source)
    return docs


def _load_yaml(text: str, source: str) -> list[object]:
    # Equivalent to yaml.safe_load_all with the duplicate-key check added.
    loader = _UniqueKeyLoader(text)
    try:
        docs: list[object] = []
        while loader.check_data():  # type: ignore[no-untyped-call]  # untyped in the stubs
            docs.append(loader.get_data())
        return docs
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        what = e.problem or e.context or "syntax error"
        raise InputError(f"{source}: {where}invalid YAML: {what}") from None
    except yaml.reader.ReaderError as e:
        raise InputError(
            f"{source}: invalid YAML: character {chr(e.character)!r} at offset {e.position} "
            f"is not allowed ({e.reason})"
        ) from None
    except yaml.YAMLError as e:
        raise InputError(f"{source}: invalid YAML: {e}") from None
    finally:
        loader.dispose()


class _JsonProblem(ValueError):
    pass


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _JsonProblem(f"duplicate key {key!r} in an object")
        result[key] = value
    return result


def _no_constant(name: str) -> float:
    raise _JsonProblem(f"{name} is not a number JSON allows")


def _load_json(text: str, source: str) -> object:
    try:
        return json.loads(text, object_pairs_hook=_unique_pairs, parse_constant=_no_constant)
    except json.JSONDecodeError as e:
        raise InputError(
            f"{source}: line {e.lineno}, column {e.colno}: invalid JSON: {e.msg}"
        ) from None
    except _JsonProblem as e:
        raise InputError(f"{source}: invalid JSON: {e}") from None


_SCALARS = (str, int, float, bool, type(None), dt.date)  # dt.datetime is a dt.date


def _check_tree(doc: object, source: str) -> None:
    """Refuse values JSON cannot carry and trees that explode through YAML aliases."""
    count = 0
    stack: list[tuple[object, tuple[str | int, ...]]] = [(doc, ())]
    while stack:
        value, loc = stack.pop()
        count += 1
        if count > MAX_VALUES:
            raise InputError(
                f"{source}: more than {MAX_VALUES:,} values (are YAML aliases nested too deep?)"
            )
        if isinstance(value, dict):
            for key, item in value.items():
                if not isinstance(key, str):
                    where = f"{_dotted(loc)}: " if loc else ""
                    raise InputError(f"{source}: {where}key {key!r} must be a string (quote it)")
                stack.append((item, (*loc, key)))
        elif isinstance(value, list):
            stack.extend((item, (*loc, i)) for i, item in enumerate(value))
        elif not isinstance(value, _SCALARS):
            where = f"{_dotted(loc)}: " if loc else ""
            raise InputError(f"{source}: {where}unsupported value of type {type(value).__name__}")


def _json_default(value: object) -> object:
    # YAML reads an unquoted 2024-01-01 as a date; the user wrote the text, so pass it on.
    if isinstance(value, dt.date):
        return value.isoformat()
    raise TypeError(f"unsupported value of type {type(value).__name__}")  # pragma: no cover


def _job_items(docs: list[object], source: str) -> tuple[list[object], bool]:
    """Jobs of the documents, and whether the file held a collection (one or more)."""
    if len(docs) == 1 and isinstance(docs[0], dict):
        return [docs[0]], False
    items: list[object] = []
    for n, doc in enumerate(docs, 1):
        if isinstance(doc, list):
            items.extend(doc)
        elif isinstance(doc, dict):
            items.append(doc)
        else:
            where = f"document {n}: " if len(docs) > 1 else ""
            raise InputError(
                f"{source}: {where}expected a job (a mapping) or a list of jobs, got {_kind(doc)}"
            )
    if not items:
        raise InputError(f"{source}: contains no jobs")
    return items, True


def _node_items(docs: list[object], source: str, key: str = "nodes") -> tuple[list[object], bool]:
    """Nodes (or queues: ``key``) of the documents: a list, ``{nodes: [...]}``, one
    node, or a YAML stream."""
    items: list[object] = []
    for n, doc in enumerate(docs, 1):
        where = f"document {n}: " if len(docs) > 1 else ""
        if isinstance(doc, dict) and key in doc:
            extra = sorted(k for k in doc if k != key)
            if extra:
                raise InputError(
                    f"{source}: {where}unknown key(s) beside {key!r}: {', '.join(extra)}"
                )
            doc = doc[key]
            if not isinstance(doc, list):
                raise InputError(f"{source}: {where}{key}: expected a list, got {_kind(doc)}")
        if isinstance(doc, list):
            items.extend(doc)
        elif isinstance(doc, dict):
            items.append(doc)
        else:
            raise InputError(
                f"{source}: {where}expected a list of {key} (or {{{key}: [...]}}), got {_kind(doc)}"
            )
    if not items:
        raise InputError(f"{source}: contains no {key}")
    single = len(docs) == 1 and isinstance(docs[0], dict) and key not in docs[0]
    return items, not single


def _validate_items(
    items: Sequence[object],
    many: bool,
    source: str,
    model: type[_M],
    what: str,
    label_key: str,
    id_attr: str,
    expand: Callable[[dict[str, Any]], dict[str, Any]],
    check: Callable[[_M], list[tuple[str, str]]] = lambda _: [],
) -> list[_M]:
    """Validate every item, gathering all problems (and duplicate ids) into one error;
    ``check`` adds the ``(field, message)`` problems of a valid item."""
    errors = _Errors(source)
    results: list[_M] = []
    first: dict[str, str] = {}
    for i, item in enumerate(items):
        label = _item_label(i, item, label_key) if many else ""
        if not isinstance(item, dict):
            errors.add(label, "", f"expected a {what} (a mapping), got {_kind(item)}")
            continue
        try:
            data = expand(item)
            value = model.model_validate_json(json.dumps(data, default=_json_default))
        except _ItemProblems as e:
            for where, msg in e.problems:
                errors.add(label, where, msg)
            continue
        except pydantic.ValidationError as e:
            # An id defaulted from the name repeats every name error: report the name only.
            derived = id_attr != label_key and not item.get(id_attr)
            for loc, msg in _describe(e):
                if not (derived and loc == (id_attr,)):
                    errors.add(label, _dotted(loc), msg)
            continue
        problems = check(value)
        for where, msg in problems:
            errors.add(label, where, msg)
        if problems:
            continue
        key = str(getattr(value, id_attr))
        if key in first:
            errors.add(label, id_attr, f"duplicate {what} id {key!r} (also {first[key]})")
        else:
            first[key] = label or f"[{i}]"
            results.append(value)
    errors.raise_if_any()
    return results


def _item_label(index: int, item: object, key: str) -> str:
    value = item.get(key) if isinstance(item, dict) else None
    if isinstance(value, str):
        return f"[{index}] ({key}={_show_name(value)})"
    return f"[{index}]"


# ------------------------------------------------------------- node GPU short form


class _ItemProblems(Exception):
    def __init__(self, problems: list[tuple[str, str]]) -> None:
        super().__init__(problems)
        self.problems = problems


def _expand_gpu_shorthand(node: dict[str, Any]) -> dict[str, Any]:
    """Turn ``gpu: {...}`` / ``gpus: {...}`` into the model's list of GpuDevice."""
    if "gpu" in node and "gpus" in node:
        raise _ItemProblems([("gpu", "give either gpu or gpus, not both")])
    key = "gpu" if "gpu" in node else "gpus"
    short = node.get(key)
    if key == "gpus" and not isinstance(short, dict):
        return node  # the long form (or a type error the model reports)
    if not isinstance(short, dict):
        msg = f"expected {{model, count, memory}}, got {_kind(short)}; use gpus: [...] for devices"
        raise _ItemProblems([("gpu", msg)])
    try:
        spec = GpuShorthand.model_validate_json(json.dumps(short, default=_json_default))
    except pydantic.ValidationError as e:
        raise _ItemProblems([(_dotted(loc), msg) for loc, msg in _describe(e, (key,))]) from None
    memory = spec.memory if spec.memory is not None else GPU_MEMORY_MIB.get(spec.model)
    if memory is None:
        known = ", ".join(sorted(GPU_MEMORY_MIB))
        msg = f"required for GPU model {spec.model!r} (memory is known only for {known})"
        raise _ItemProblems([(f"{key}.memory", msg)])
    expanded = {k: v for k, v in node.items() if k != key}
    expanded["gpus"] = [
        {"id": f"gpu{i}", "model": spec.model, "memory": memory} for i in range(spec.count)
    ]
    return expanded


def job_documents(text: str, fmt: str, source: str) -> list[Job]:
    """The jobs of YAML or JSON text; job ids must be unique within it."""
    items, many = _job_items(_documents(text, fmt, source), source)
    return _validate_items(items, many, source, Job, "job", "name", "id", lambda d: d, reserved_env)


def node_documents(text: str, fmt: str, source: str) -> list[Node]:
    """The nodes of YAML or JSON text (GPU short form expanded); ids unique."""
    items, many = _node_items(_documents(text, fmt, source), source)
    return _validate_items(items, many, source, Node, "node", "id", "id", _expand_gpu_shorthand)


def queue_documents(text: str, fmt: str, source: str) -> list[QueueSpec]:
    """The queues of YAML or JSON text (``{queues: [...]}``, a list, or one); names
    unique."""
    items, many = _node_items(_documents(text, fmt, source), source, "queues")
    return _validate_items(items, many, source, QueueSpec, "queue", "name", "name", lambda d: d)
