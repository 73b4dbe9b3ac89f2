"""Placement reasons as text: the one place a :class:`Rejection` or a
:class:`Diagnosis` becomes a sentence, and the one place such a sentence is read
back.

The text is part of what the cluster workflow keeps and publishes (a pending
replica's reasons, ``forge explain``'s verdicts, the store's loop status), so it
must stay byte for byte what recorded histories hold: change a sentence here only
under ``workflow.patched``. What crosses the wire is that text, so a reader (the
CLI grouping pending replicas by cause) uses :func:`read_diagnosis`, the inverse
of :func:`diagnosis_text`, instead of a pattern of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from forge.core.placement.diagnosis import Diagnosis, Rejection, Rule

__all__ = [
    "ReadDiagnosis",
    "cause_text",
    "diagnosis_text",
    "read_diagnosis",
    "rejection_text",
]

_AVAILABLE = " nodes available"

_PLAIN = {
    Rule.GPU_MODEL: "gpu model",
    Rule.GPU_MEMORY: "insufficient gpu memory",
    Rule.GPU: "insufficient gpu",
    Rule.GPU_SHARE: "insufficient gpu share",
    Rule.CPU: "insufficient cpu",
    Rule.MEMORY: "insufficient memory",
    Rule.TAINT: "untolerated taint",
    Rule.CPU_RESERVED: "cpu reserved for free gpus",
    Rule.MEMORY_RESERVED: "memory reserved for free gpus",
    Rule.RESERVED: "cpu or memory reserved for free gpus",
    Rule.DISTINCT_HOSTS: "distinct hosts (holds a replica of the group)",
}


def rejection_text(r: Rejection) -> str:
    """One node's verdict: ``insufficient cpu``, ``draining``, ``insufficient gpu
    share (gpu3: 300 free < 500 asked)`` (per-node detail in parentheses)."""
    if r.rule is Rule.STATE:
        return r.state
    if r.rule is Rule.CONSTRAINT:
        c = r.constraint
        return (
            "constraint"
            if c is None
            else f"constraint {c.label} {c.op} {','.join(c.values)}".rstrip()
        )
    if r.rule is Rule.SPREAD:
        return f"spread on {r.label} would pass max_skew"
    if r.rule is Rule.SPREAD_LABEL:
        return f"no {r.label} label (spread)"
    text = _PLAIN[r.rule]
    if r.rule is Rule.TAINT and r.taint is not None:
        t = r.taint
        return f"{text} ({t.key}={t.value}:{t.effect})"
    if r.rule is Rule.GPU_SHARE and r.asked:
        shown = ", ".join(f"{dev}: {free} free < {r.asked} asked" for dev, free in r.devices)
        more = f", +{r.more} more" if r.more else ""
        return f"{text} ({shown}{more})"
    if r.rule is Rule.CPU_RESERVED and r.reserved:
        return f"{text} ({r.free}m free, {r.reserved}m reserved < {r.asked}m asked)"
    if r.rule is Rule.MEMORY_RESERVED and r.reserved:
        return f"{text} ({r.free}MiB free, {r.reserved}MiB reserved < {r.asked}MiB asked)"
    return text


def cause_text(r: Rejection) -> str:
    """A verdict without its per-node detail: what a diagnosis counts nodes by."""
    return rejection_text(r.cause)


def diagnosis_text(d: Diagnosis) -> str:
    """Kubernetes-style: ``0/1523 nodes available: 812 insufficient gpu, 3 draining``
    (most nodes first, then by name). Each entry is written as counted: a
    diagnosis counts by cause, except for the detail a rule keeps (a taint)."""
    counts: dict[str, int] = {}
    for r, n in d.rejected:
        text = rejection_text(r)
        counts[text] = counts.get(text, 0) + n
    parts = [f"{n} {t}" for t, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]
    head = f"{d.fit}/{d.total}{_AVAILABLE}"
    return f"{head}: {', '.join(parts)}" if parts else head


@dataclass(frozen=True, slots=True)
class ReadDiagnosis:
    """A diagnosis read back from its text: the causes as the text names them."""

    total: int
    fit: int
    causes: tuple[tuple[str, int], ...]


def read_diagnosis(text: str) -> ReadDiagnosis | None:
    """The inverse of :func:`diagnosis_text`; None for a reason of another kind
    (a reschedule delay, a deferral)."""
    head, sep, tail = text.partition(": ")
    counts, available, rest = head.partition(_AVAILABLE)
    fit, slash, total = counts.partition("/")
    if not available or rest or not slash or not (_number(fit) and _number(total)):
        return None
    causes: list[tuple[str, int]] = []
    if sep:
        for part in tail.split(", "):
            n, _, cause = part.partition(" ")
            # a part that is not "<count> <cause>" (a constraint value with ", " in
            # it) is kept whole
            causes.append((cause, int(n)) if _number(n) and cause else (part, 0))
    return ReadDiagnosis(int(total), int(fit), tuple(causes))


def _number(text: str) -> bool:
    return text.isascii() and text.isdigit()
