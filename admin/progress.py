"""Progress of long work on a terminal (count, rate, ETA); silence when output is not a terminal."""
from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    def __init__(self, label: str, total: int | None = None, stream: TextIO = sys.stderr,
                 interval: float = 0.25) -> None:
        self.label = label
        self.total = total
        self.stream = stream
        self.enabled = stream.isatty()
        self.interval = interval
        self.count = 0
        self.start = time.monotonic()
        self._last = 0.0

    def advance(self, n: int = 1) -> None:
        self.count += n
        now = time.monotonic()
        if self.enabled and now - self._last >= self.interval:
            self._last = now
            self.stream.write("\r" + self.line(now) + "\033[K")
            self.stream.flush()

    def line(self, now: float | None = None) -> str:
        elapsed = max(1e-9, (now or time.monotonic()) - self.start)
        rate = self.count / elapsed
        text = f"{self.label}: {self.count:,}"
        if self.total:
            text += f" / {self.total:,}"
        text += f" ({rate:,.0f}/s"
        if self.total and rate > 0 and self.count < self.total:
            text += f", ETA {format_seconds((self.total - self.count) / rate)}"
        return text + ")"

    def done(self) -> None:
        if self.enabled:
            self.stream.write("\r" + self.line() + "\033[K\n")
            self.stream.flush()


def format_seconds(s: float) -> str:
    s = int(round(s))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"
