"""Progress of long work on a terminal (count, rate, ETA); silence when output is not a terminal.

The progress line is redrawn in place with ``\\r``. Anything else written to the same terminal while it
is shown (a skipped line, a log warning) must first clear it and then draw it again below, or the two
overwrite each other: ``say`` does that, and ``ProgressLogHandler`` sends log records through it.
"""
from __future__ import annotations

import logging
import sys
import time
from typing import TextIO

CLEAR = "\r\033[K"


class Progress:
    active: "Progress | None" = None  # the line currently drawn, if any (one at a time)

    def __init__(self, label: str, total: int | None = None, stream: TextIO = sys.stderr,
                 interval: float = 0.25, total_bytes: int | None = None) -> None:
        """``total``: the count at the end, when known (ETA from the count). ``total_bytes``: the size of
        the input when only that is known (an import file): the ETA then comes from ``bytes_done``."""
        self.label = label
        self.total = total
        self.total_bytes = total_bytes or None
        self.bytes_done = 0
        self.stream = stream
        self.enabled = stream.isatty()
        self.interval = interval
        self.count = 0
        self.start = time.monotonic()
        self._last = 0.0
        self._drawn = False

    def advance(self, n: int = 1) -> None:
        self.count += n
        now = time.monotonic()
        if self.enabled and now - self._last >= self.interval:
            self._last = now
            self._draw(now)

    def _draw(self, now: float | None = None) -> None:
        self.stream.write("\r" + self.line(now) + "\033[K")
        self.stream.flush()
        self._drawn = True
        Progress.active = self

    def line(self, now: float | None = None) -> str:
        elapsed = max(1e-9, (now or time.monotonic()) - self.start)
        rate = self.count / elapsed
        text = f"{self.label}: {self.count:,}"
        if self.total:
            text += f" / {self.total:,}"
        text += f" ({rate:,.0f}/s"
        if self.total and rate > 0 and self.count < self.total:
            text += f", ETA {format_seconds((self.total - self.count) / rate)}"
        elif not self.total and self.total_bytes and 0 < self.bytes_done < self.total_bytes:
            share = self.bytes_done / self.total_bytes
            text += f", {share:.0%} of the file, ETA {format_seconds(elapsed * (1 - share) / share)}"
        return text + ")"

    def say(self, text: str) -> None:
        """Write one line of text without breaking the progress line: clear it, write, redraw it."""
        if self.enabled and self._drawn:
            self.stream.write(CLEAR + text + "\n")
            self._draw()
        else:
            self.stream.write(text + "\n")
            self.stream.flush()

    def clear(self) -> None:
        """Take the line off the terminal (before a final error message)."""
        if self.enabled and self._drawn:
            self.stream.write(CLEAR)
            self.stream.flush()
            self._drawn = False
        if Progress.active is self:
            Progress.active = None

    def done(self) -> None:
        if self.enabled:
            self.stream.write("\r" + self.line() + "\033[K\n")
            self.stream.flush()
        self._drawn = False
        if Progress.active is self:
            Progress.active = None


def say(text: str, stream: TextIO | None = None) -> None:
    """A message line on stderr that keeps an active progress line intact."""
    if Progress.active is not None and stream in (None, Progress.active.stream):
        Progress.active.say(text)
    else:
        s = stream or sys.stderr
        s.write(text + "\n")
        s.flush()


class ProgressLogHandler(logging.Handler):
    """Log records (the daemon client's and the ingester's warnings) as bare lines on stderr, like
    Python's last-resort handler, but through ``say`` so they never overwrite the progress line."""

    def __init__(self, level: int = logging.WARNING) -> None:
        super().__init__(level)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            say(self.format(record))
        except Exception:
            self.handleError(record)


def format_seconds(s: float) -> str:
    s = int(round(s))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def format_bytes(n: int | float) -> str:
    """A size in the unit that fits: 512 B, 3.4 KiB, 12.0 MiB, 1.50 GiB."""
    n = float(n)
    if n < 1024:
        return f"{int(n)} B"
    for unit in ("KiB", "MiB", "GiB"):
        n /= 1024
        if n < 1024 or unit == "GiB":
            return f"{n:,.2f} {unit}" if unit == "GiB" else f"{n:,.1f} {unit}"
    raise AssertionError("unreachable")
