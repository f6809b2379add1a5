"""Run a module with the wall clock set back (or on) to another moment: a stand-in for libfaketime.

    python -m tests.support.clockshift AT_MS -m storaged --data-dir DIR ...

Why: a daemon answers a retried request id from its window only for ``REQUEST_ID_RETENTION_S`` after it
first saw it, by the wall clock. A store kept as a test fixture (``fixtures/store-log2-snap3``) was
written on one day and is opened on later ones; to check that its request ids survive a format change,
the daemon opening it must live on the day the fixture was made. ``time.time``/``time.time_ns`` (what
the daemon's id clock and ingest state read) are offset so that the process starts at ``AT_MS`` and its
time then flows normally; the monotonic clock and everything below Python are left alone.
"""
from __future__ import annotations

import runpy
import sys
import time
from typing import Callable


def shifted_clock(at_ms: int) -> tuple[Callable[[], float], Callable[[], int]]:
    """``time.time`` and ``time.time_ns`` replacements whose now is ``at_ms`` (ms since the epoch)."""
    real_ns = time.time_ns
    offset = at_ms * 1_000_000 - real_ns()

    def time_ns() -> int:
        return real_ns() + offset

    def time_s() -> float:
        return time_ns() / 1e9

    return time_s, time_ns


def command(at_ms: int, module: str = "storaged") -> list[str]:
    """The command line that runs ``python -m MODULE`` with its wall clock starting at ``at_ms``."""
    return [sys.executable, "-m", __name__, str(at_ms), "-m", module]


def main(argv: list[str]) -> None:
    if len(argv) < 3 or argv[1] != "-m":
        sys.exit("usage: python -m tests.support.clockshift AT_MS -m MODULE [ARGS...]")
    time.time, time.time_ns = shifted_clock(int(argv[0]))
    sys.argv = [argv[2], *argv[3:]]
    runpy.run_module(argv[2], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
