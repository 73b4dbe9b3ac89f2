"""Help-text helpers light enough for :mod:`forge.cli.root` (which must import
nothing heavy: ``forge --help`` answers before any noun is loaded)."""

from __future__ import annotations

__all__ = ["verbatim"]


def verbatim(text: str) -> str:
    """Help text laid out by hand (examples, aligned lines): Click keeps a paragraph
    as written when it starts with a ``\\b`` line, and rewraps every other one."""
    return "\n\n".join("\b\n" + p for p in text.strip("\n").split("\n\n"))
