"""Parsing and refusing what signals and updates carry.

Signals cannot be refused, so the handlers take their payload raw (``*args``: the
SDK then decodes it without a type) and validate it here, dropping what does not
match the contract. A typed handler would raise on a null payload, on no payload
or on two (the SDK passes those through), and an exception in a handler fails the
workflow task: the workflow would be stuck retrying it for ever. Updates are
parsed the same way so a validator can refuse them with a message naming fields.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from temporalio import workflow
from temporalio.api.common.v1 import Payload as TemporalPayload
from temporalio.common import RawValue
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    import pydantic

    from forge.core.limits import is_valid_name
    from forge.core.models import Job
    from forge.core.periodic import not_submittable
    from forge.core.quota import DEFAULT_QUEUE, QueueSpec
    from forge.core.taskenv import reserved_env
    from forge.errors import Busy, InvalidInput, NotFound
    from forge.wire import errors

__all__ = [
    "Batch",
    "busy",
    "json_size",
    "not_found",
    "parse",
    "parse_batch",
    "refuse",
    "refuse_bad_jobs",
    "update_arg",
]

Payload = TypeVar("Payload", bound=pydantic.BaseModel)


def _validate(
    model: type[Payload], args: tuple[Any, ...]
) -> Payload | pydantic.ValidationError | str:
    if len(args) != 1:
        return f"expected one argument, got {len(args)}"
    arg = args[0]
    try:
        if isinstance(arg, RawValue):
            text = _json_text(arg.payload)
            if text is not None:  # the JSON as sent: parsed once, straight into the model
                return model.model_validate_json(text)
            arg = workflow.payload_converter().from_payload(arg.payload)
        return model.model_validate_json(json.dumps(arg))
    except pydantic.ValidationError as err:
        return err
    except (TypeError, ValueError) as err:  # not JSON data at all
        return f"not a {model.__name__}: {type(err).__name__}"


def _json_text(payload: TemporalPayload) -> bytes | None:
    """A payload's JSON text when it is plain JSON (or null), else None."""
    encoding = payload.metadata.get("encoding")
    if encoding == b"json/plain":
        return payload.data
    if encoding == b"binary/null":
        return b"null"
    return None


def _errors_text(errs: list[Any], total: int, skip: int = 0) -> str:
    shown = [f"{'.'.join(map(str, e['loc'][skip:])) or '(payload)'}: {e['msg']}" for e in errs[:3]]
    more = f" (+{total - 3} more)" if total > 3 else ""
    return "; ".join(shown) + more


def parse(model: type[Payload], args: tuple[Any, ...]) -> Payload | str:
    """The one argument of a signal or update as ``model`` (validated in JSON mode,
    as a typed handler would), or what is wrong with it, field errors first."""
    out = _validate(model, args)
    if isinstance(out, pydantic.ValidationError):
        return _errors_text(out.errors(), out.error_count())
    return out


def _item_label(index: int, item: object) -> str:
    """An item by its id when it has a readable one, else by its position."""
    value = item.get("id") if isinstance(item, dict) else None
    if type(value) is int:
        value = str(value)
    return value if isinstance(value, str) and is_valid_name(value) else f"[{index}]"


@dataclass(frozen=True)
class Batch(Generic[Payload]):
    """What :func:`parse_batch` made of a signal."""

    value: Payload | None  # None: nothing of it is usable
    #: one line per item left out, by id (or ``[position]`` when it has no readable
    #: id) and field: ``"n5: cpu: Input should be greater than or equal to 0"``
    rejected: list[str] = field(default_factory=list)
    problem: str = ""  # what is wrong with the payload as a whole (value is None)


def parse_batch(model: type[Payload], key: str, args: tuple[Any, ...]) -> Batch[Payload]:
    """A signal's argument as ``model`` keeping only the valid items of its list
    field ``key``: one bad node must not drop a batch of them. When the envelope
    itself is wrong (not a mapping, unknown keys, too many items, a rule across the
    items), nothing is used."""
    out = _validate(model, args)
    if isinstance(out, str):
        return Batch(None, problem=out)
    if not isinstance(out, pydantic.ValidationError):
        return Batch(out)
    whole = Batch[Payload](None, problem=_errors_text(out.errors(), out.error_count()))
    raw = args[0]
    items = raw.get(key) if isinstance(raw, dict) else None
    if not isinstance(items, list):
        return whole
    by_item: dict[int, list[Any]] = {}
    for e in out.errors():
        loc = e["loc"]
        if len(loc) < 2 or loc[0] != key or type(loc[1]) is not int:
            return whole  # the envelope is wrong
        by_item.setdefault(loc[1], []).append(e)
    rejected = [
        f"{_item_label(i, items[i])}: {_errors_text(errs, len(errs), skip=2)}"
        for i, errs in sorted(by_item.items())
    ]
    kept = [item for i, item in enumerate(items) if i not in by_item]
    if not kept:
        return Batch(None, rejected)
    again = _validate(model, ({**raw, key: kept},))
    if isinstance(again, pydantic.ValidationError | str):  # a rule across the items
        return whole
    return Batch(again, rejected)


def update_arg(model: type[Payload], raw: Any) -> Payload:
    """An update's argument, or a refusal a plain client can act on: non-retryable,
    naming the fields (raised in a validator, nothing enters history). Handlers take
    it as a ``RawValue``: a batch of jobs is then parsed from its JSON once, not
    decoded into dicts, dumped again and parsed (a third of the loop's time during a
    big submission went there)."""
    parsed = parse(model, (raw,))
    if isinstance(parsed, str):
        raise refuse(f"{model.__name__}: {parsed}")
    return parsed


def refuse(message: str) -> ApplicationError:
    """An update refused for its input (``InvalidInput``, non-retryable)."""
    return errors.encode(InvalidInput(message))


def not_found(message: str) -> ApplicationError:
    """An update refused because the job, group or node it names does not exist
    (``NotFound``, non-retryable); ``message`` names it."""
    return errors.encode(NotFound(message))


def busy() -> ApplicationError:
    """The refusal of an update while the run is due to continue as new: the client
    matches its type and retries, reaching the next run."""
    return errors.encode(Busy("the cluster workflow is continuing as new; retry shortly"))


def json_size(job: Job) -> int:
    return len(job.model_dump_json())


def refuse_bad_jobs(jobs: Sequence[Job], queues: Mapping[str, QueueSpec]) -> None:
    """Refuse a periodic job (a schedule's template), a task setting a variable Forge
    sets, or a queue the cluster does not have: here, for every client, not in the
    model (a stored job must still load)."""
    for job in jobs:
        problems = reserved_env(job) + not_submittable(job.id, job.schedule)
        if problems:
            where, why = problems[0]
            raise refuse(f"job {job.id}: {where}: {why}")
        if job.queue != DEFAULT_QUEUE and job.queue not in queues:
            known = ", ".join(sorted(queues)[:10]) or "none yet: forge queue apply"
            raise refuse(f"job {job.id}: queue: no queue {job.queue!r} (queues: {known})")
