"""The first hour of a new user, at process level: a daemon that dies or cannot start is noticed at once
and said plainly, not turned into a retry-forever BUSY after a long wait.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
from mcp import Client

from mcp_fixtures import (  # noqa: F401  (fixtures)
    anyio_backend, call, data_dir, home, kill_daemons_of, kill_pid, pid_file, stdio_params,
)

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]


def _client(data_dir: Path | str, home: Path, *extra: str) -> Client:
    return Client(stdio_params(data_dir, home, *extra), mode="legacy")  # type: ignore[arg-type]


async def _wait_pid(data_dir: Path, other_than: int | None = None, timeout: float = 30) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pid = pid_file(data_dir)
        if pid is not None and pid != other_than:
            return pid
        import anyio
        await anyio.sleep(0.02)
    raise AssertionError("no daemon wrote its pid file")


async def test_a_spawned_daemon_that_died_is_replaced_by_the_first_call_after(data_dir: Path, home: Path) -> None:
    """SIGKILL the auto-started daemon between calls: the very next call is answered (by a new daemon the
    front-end starts on noticing the pid is gone), well within one attempt's timeout, with nothing lost."""
    try:
        async with _client(data_dir, home, "--timeout", "5") as c:
            w = await call(c, "write_message", {"session_id": "s", "role": "user", "content": "before"})
            assert w["status"] == "OK", w
            first = await _wait_pid(data_dir)
            script = Path(sys.executable).with_name("convmem-storaged")
            if script.exists():  # installed: ps and pgrep show the daemon by name
                with open(f"/proc/{first}/cmdline", "rb") as f:
                    assert any(a.endswith(b"/convmem-storaged") for a in f.read().split(b"\0")[:2])
            kill_pid(first)
            t0 = time.monotonic()
            w2 = await call(c, "write_message", {"session_id": "s", "role": "user", "content": "after"})
            elapsed = time.monotonic() - t0
            assert w2["status"] == "OK", w2
            assert elapsed < 5 * 3, elapsed  # never the whole three attempts of a timeout
            second = await _wait_pid(data_dir, other_than=first)
            assert second != first
            hist = await call(c, "read_messages", {"session_id": "s"})
            assert [m["content"] for m in hist["history"]] == ["before", "after"]
    finally:
        kill_daemons_of(data_dir)
