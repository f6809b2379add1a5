"""The first hour of a new user, at process level: a daemon that dies or cannot start is noticed at once
and said plainly, not turned into a retry-forever BUSY after a long wait.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mcp import Client

from tests.support.mcp_fixtures import (  # noqa: F401  (fixtures)
    PYTHON, ROOT, anyio_backend, call, data_dir, frontend_env, home, kill_daemons_of, kill_pid, pid_file,
    stdio_params,
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
        # an auto-started daemon logs where the README says, and is private
        log = (data_dir / "storaged.log").read_text()
        assert "ready on" in log and "Traceback" not in log, log
        assert (data_dir / "storaged.log").stat().st_mode & 0o077 == 0
    finally:
        kill_daemons_of(data_dir)


@pytest.mark.parametrize("case", ["a file", "missing parent"])
async def test_a_daemon_that_cannot_start_is_an_io_error_at_once(tmp_path: Path, home: Path, case: str) -> None:
    """A bad --data-dir behind a front-end that spawns its daemon: initialize and tools/list work (the host
    can show the server), and every call answers at once with a non-retryable IO_ERROR in the daemon's own
    words — not BUSY after a long wait."""
    if case == "a file":
        bad = tmp_path / "notadir"
        bad.write_text("x")
        expect = "is not a directory"
    else:
        bad = tmp_path / "no-such-parent" / "store"
        expect = "does not exist, nor does its parent"
    async with _client(bad, home) as c:
        assert len((await c.list_tools()).tools) == 12
        for _ in range(2):
            t0 = time.monotonic()
            r = await c.call_tool("write_message", {"session_id": "s", "role": "user", "content": "x"})
            obj = __import__("json").loads(r.content[0].text)
            assert r.is_error and obj["error"]["code"] == "IO_ERROR", obj
            assert "retryable" not in obj["error"], obj
            assert expect in obj["error"]["message"] and str(bad) in obj["error"]["message"], obj
            assert "Traceback" not in obj["error"]["message"]
            assert time.monotonic() - t0 < 10
        h = await c.call_tool("search_sessions", {"query": "x"})  # the history family says it too
        assert h.is_error and expect in h.content[0].text, h.content[0].text
    assert not (tmp_path / "no-such-parent").exists()  # a typo never becomes a new, empty store


def _storaged(*args: str, env_extra: dict[str, str] | None = None, home: Path) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "storaged", *args], cwd=ROOT, env=frontend_env(home, env_extra),
                          capture_output=True, text=True, timeout=60)


def test_data_dir_is_created_only_where_its_parent_exists(tmp_path: Path, home: Path) -> None:
    missing = tmp_path / "typo" / "store"
    r = _storaged("--data-dir", str(missing), home=home)
    assert r.returncode == 2, r
    assert r.stderr.strip().count("\n") == 0 and "Traceback" not in r.stderr, r.stderr
    assert "does not exist, nor does its parent" in r.stderr
    assert not missing.parent.exists()
    # the standard location (XDG) is created with its parents: a fresh account may lack ~/.local/share
    from protocol.config import standard_data_dir

    env = frontend_env(home)
    std = Path(standard_data_dir(env))
    assert not std.parent.exists()
    proc = subprocess.Popen([PYTHON, "-m", "storaged"], cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
    try:
        line, created = "", False
        deadline = time.monotonic() + 30
        while "ready on" not in line and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if "created a new, empty store" in line:
                assert str(std) in line
                created = True
        assert "ready on" in line and "convmem stop" in line, line
        assert created
        assert std.is_dir() and (std.stat().st_mode & 0o777) == 0o700
    finally:
        kill_pid(proc.pid)
        proc.stderr.close()
