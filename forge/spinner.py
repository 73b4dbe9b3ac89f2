"""A one-line progress indicator for a command whose work may be slow (``forge
plan`` on a large cluster): kept apart from :mod:`forge.render`, which turns data
into text and never writes to a terminal itself."""

from __future__ import annotations

import sys
import threading
import time
from types import TracebackType
from typing import TextIO

__all__ = ["Spinner"]


class Spinner:
    """A one-line progress indicator on a terminal, shown only if the work is slow.

    Nothing is written during the first ``delay`` seconds, so fast runs print
    nothing; after that a spinner turns until the block ends and the line is
    completed with the elapsed time. Disabled (a no-op) when ``enabled`` is false,
    e.g. when stderr is not a terminal, so logs and pipes never get ``\\r`` noise.
    """

    _FRAMES = "|/-\\"

    def __init__(
        self, message: str, *, enabled: bool, stream: TextIO | None = None, delay: float = 0.3
    ) -> None:
        self.message = message
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.delay = delay
        self._done = threading.Event()
        self._shown = False
        self._thread: threading.Thread | None = None
        self._start = 0.0

    def __enter__(self) -> Spinner:
        self._start = time.perf_counter()
        if self.enabled:
            self._thread = threading.Thread(target=self._spin, daemon=True)
            self._thread.start()
        return self

    def _spin(self) -> None:
        if self._done.wait(self.delay):
            return
        self._shown = True
        i = 0
        while not self._done.is_set():
            self.stream.write(f"\r{self.message} {self._FRAMES[i % len(self._FRAMES)]}")
            self.stream.flush()
            i += 1
            self._done.wait(0.1)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()
        if self._shown:
            elapsed = time.perf_counter() - self._start
            outcome = "done" if exc_type is None else "interrupted"
            self.stream.write(f"\r{self.message} {outcome} in {elapsed:.1f} s\n")
            self.stream.flush()
