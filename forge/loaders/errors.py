"""Error messages a user can act on: every problem of a file as one line that names
the file and the bad field (a dotted path, or a CSV line and column), capped, in
one :class:`InputError`."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import get_args

import pydantic
from pydantic import BaseModel

from forge.core import models
from forge.core.models import NAME_PATTERN
from forge.errors import InvalidInput
from forge.loaders.shorthand import GpuShorthand

__all__ = ["MAX_ERROR_LINES", "InputError", "format_validation_error"]

#: An error message lists at most this many problems, then "... and N more".
MAX_ERROR_LINES = 20


class InputError(InvalidInput):
    """Bad user input. ``str(err)`` is the whole message, one problem per line, each
    starting with the file name; the CLI prints it to stderr as it is and exits 2."""

    prefixed = False


def format_validation_error(err: pydantic.ValidationError, source: str) -> str:
    """Render every error of ``err`` as ``"<source>: <dotted.path>: <message>"`` lines.

    At most MAX_ERROR_LINES lines, then ``"... and N more"``. Follow-on errors pydantic
    adds (a list "too short" only because its items failed) are dropped, unknown
    fields get a "did you mean" from the model's field names, and type errors show
    the offending value.
    """
    errors = _Errors(source)
    for loc, msg in _describe(err):
        errors.add("", _dotted(loc), msg)
    return errors.render()


# ------------------------------------------------------------------ error messages


class _Errors:
    """Problem lines of one file, capped at MAX_ERROR_LINES when rendered."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.lines: list[str] = []
        self.count = 0

    def add(self, item: str, where: str, msg: str) -> None:
        self.count += 1
        if len(self.lines) < MAX_ERROR_LINES:
            subject = " ".join(p for p in (item, where) if p)
            self.lines.append(
                f"{self.source}: {subject}: {msg}" if subject else f"{self.source}: {msg}"
            )

    def render(self) -> str:
        more = self.count - len(self.lines)
        tail = [f"{self.source}: ... and {more} more"] if more > 0 else []
        return "\n".join(self.lines + tail)

    def raise_if_any(self) -> None:
        if self.count:
            raise InputError(self.render())


_NAME_RULE = "must be 1-63 of A-Z a-z 0-9 . _ - (starting with a letter or digit)"
# Errors whose message is clearer with the offending value appended.
_SHOW_INPUT = {"enum", "literal_error", "string_pattern_mismatch"}


def _describe(
    err: pydantic.ValidationError, prefix: tuple[str | int, ...] = ()
) -> list[tuple[tuple[str | int, ...], str]]:
    """(prefix + loc, message) for each error worth showing, messages made actionable."""
    root = _model_named(err.title)
    out: list[tuple[tuple[str | int, ...], str]] = []
    for e in err.errors(include_url=False):
        kind, loc, msg, value = e["type"], tuple(e["loc"]), e["msg"], e.get("input")
        ctx = e.get("ctx") or {}
        if (
            kind == "too_short"
            and isinstance(value, list | tuple)
            and len(value) >= int(ctx.get("min_length", 0))
        ):
            continue  # pydantic's echo of failed items: the list was long enough
        if kind == "value_error":
            msg = msg.removeprefix("Value error, ")
        elif kind in ("too_short", "too_long"):  # users write lists; they see no tuples
            msg = msg.replace("Tuple should", "List should").replace(" after validation", "")
        elif kind in ("tuple_type", "list_type"):  # "array" in JSON mode, "tuple" in Python
            msg = f"Input should be a list, got {_got(value)}"
        elif kind == "string_pattern_mismatch" and ctx.get("pattern") == NAME_PATTERN:
            msg = f"{_NAME_RULE}, got {_got(value)}"
        elif kind == "extra_forbidden":
            msg = _unknown_field(root, loc)
        elif kind.endswith(("_type", "_parsing")) or kind in _SHOW_INPUT:
            msg = f"{msg}, got {_got(value)}"
        out.append(((*prefix, *loc), msg))
    return out


def _got(value: object) -> str:
    return _kind(value) if isinstance(value, dict | list) else _short_repr(value)


def _model_named(title: str) -> type[BaseModel] | None:
    found = getattr(models, title, None) or (GpuShorthand if title == "GpuShorthand" else None)
    return found if isinstance(found, type) and issubclass(found, BaseModel) else None


def _unknown_field(root: type[BaseModel] | None, loc: tuple[str | int, ...]) -> str:
    """ "unknown field", with the closest real field name of that model when one exists."""
    model = root
    for part in loc[:-1]:
        if model is None:
            break
        if isinstance(part, str):
            field = model.model_fields.get(part)
            model = _model_in(field.annotation) if field is not None else None
    if model is None or not loc or not isinstance(loc[-1], str):
        return "unknown field"
    fields = sorted(model.model_fields)
    close = difflib.get_close_matches(loc[-1], fields, n=1, cutoff=0.6)
    if close:
        return f"unknown field; did you mean {close[0]!r}?"
    return f"unknown field; expected one of: {', '.join(fields)}"


def _model_in(annotation: object) -> type[BaseModel] | None:
    """The model inside an annotation such as ``tuple[TaskGroup, ...]`` or ``X | None``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _dotted(loc: Sequence[str | int]) -> str:
    return ".".join(_show_name(p) if isinstance(p, str) else str(p) for p in loc)


def _show_name(text: str) -> str:
    """A user-supplied name as is when harmless, else quoted (no raw control chars)."""
    if text and len(text) <= 64 and text.isprintable() and not any(c.isspace() for c in text):
        return text
    return _short_repr(text)


def _short_repr(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _kind(value: object) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "nothing"
    return f"{type(value).__name__} {_short_repr(value)}"
