"""A one-line progress indicator on stderr for long command-line work (txlog-dump, txlog-refbroker generate).

Shown only when the stream is a terminal (``isatty()``): piped or captured stderr (tests, CI logs, the
JSON summaries of txlog-dump) stays exactly as without it.  The line is redrawn with ``\\r`` at most every
``interval`` seconds, and the clock is read only every ``check_every`` updates, so a per-record call costs an
integer increment.  ``close()`` erases the line.
"""
from __future__ import annotations

import sys
import time
from typing import Optional, TextIO


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024.0
    return str(n)


class Progress:
    """``update(done)`` / ``advance(step)`` towards ``total`` (``None``: unknown); ``bytes_unit`` formats
    counts as sizes."""

    def __init__(self, label: str, total: Optional[float] = None, *, unit: str = "", bytes_unit: bool = False,
                 stream: Optional[TextIO] = None, interval: float = 0.5, check_every: int = 1024,
                 enabled: Optional[bool] = None):
        self.stream = stream if stream is not None else sys.stderr
        if enabled is None:
            isatty = getattr(self.stream, "isatty", None)
            enabled = bool(isatty and isatty())
        self.enabled = enabled
        self.label, self.total, self.unit, self.bytes_unit = label, total, unit, bytes_unit
        self.interval, self.check_every = interval, max(1, int(check_every))
        self.done = 0.0
        self.note = ""
        self._calls = 0
        self._t0 = time.monotonic()
        self._last = 0.0
        self._width = 0

    def advance(self, step: float = 1, note: Optional[str] = None) -> None:
        self.update(self.done + step, note)

    def update(self, done: float, note: Optional[str] = None) -> None:
        if not self.enabled:
            return
        self.done = done
        if note is not None:
            self.note = note
        self._calls += 1
        if self._calls % self.check_every and note is None:
            return
        now = time.monotonic()
        if now - self._last >= self.interval:
            self._last = now
            self._draw(now)

    def _fmt(self, n: float) -> str:
        return _size(n) if self.bytes_unit else f"{int(n):,}{(' ' + self.unit) if self.unit else ''}"

    def _draw(self, now: float) -> None:
        secs = max(now - self._t0, 1e-9)
        rate = self.done / secs
        text = f"{self.label}: {self._fmt(self.done)}"
        if self.total:
            text += f" / {self._fmt(self.total)} ({100.0 * self.done / self.total:5.1f} %)"
            if rate > 0 and self.done < self.total:
                text += f", ~{(self.total - self.done) / rate:,.0f} s left"
        text += f", {self._fmt(rate)}/s"
        if self.note:
            text += f"  {self.note}"
        pad = max(0, self._width - len(text))
        self._width = len(text)
        self.stream.write("\r" + text + " " * pad)
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
            self._width = 0

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


__all__ = ["Progress"]
