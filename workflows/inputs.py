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
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    import pydantic

    from forge.core.models import Job
    from forge.wire import errors

__all__ = ["busy", "json_size", "parse", "refuse", "update_arg"]

Payload = TypeVar("Payload", bound=pydantic.BaseModel)


def parse(model: type[Payload], args: tuple[Any, ...]) -> Payload | str:
    """The one argument of a signal or update as ``model`` (validated in JSON mode,
    as a typed handler would), or what is wrong with it, field errors first."""
    if len(args) != 1:
        return f"expected one argument, got {len(args)}"
    try:
        return model.model_validate_json(json.dumps(args[0]))
    except pydantic.ValidationError as err:
        shown = [
            f"{'.'.join(map(str, e['loc'])) or '(payload)'}: {e['msg']}" for e in err.errors()[:3]
        ]
        more = f" (+{err.error_count() - 3} more)" if err.error_count() > 3 else ""
        return "; ".join(shown) + more
    except (TypeError, ValueError) as err:  # not JSON data at all
        return f"not a {model.__name__}: {type(err).__name__}"


def update_arg(model: type[Payload], raw: Any) -> Payload:
    """An update's argument, or a refusal a plain client can act on: non-retryable,
    naming the fields (raised in a validator, nothing enters history)."""
    parsed = parse(model, (raw,))
    if isinstance(parsed, str):
        raise refuse(f"{model.__name__}: {parsed}")
    return parsed


def refuse(message: str) -> ApplicationError:
    return ApplicationError(message[:1000], type=errors.INVALID_INPUT, non_retryable=True)


def busy() -> ApplicationError:
    """The refusal of an update while the run is due to continue as new: the client
    matches its type and retries, reaching the next run."""
    return ApplicationError(
        "the cluster workflow is continuing as new; retry shortly", type=errors.BUSY
    )


def json_size(job: Job) -> int:
    return len(job.model_dump_json())
