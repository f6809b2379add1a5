"""Endpoint identity: a daemon never takes over a live endpoint, says which store it serves, removes its
socket file at a clean stop; a front-end that knows its data dir refuses a daemon serving another one.
Real daemons, real front-ends, real sockets."""
from __future__ import annotations

import os
import socket
import stat
import tempfile
from pathlib import Path
from typing import Iterator

import pytest
from mcp import Client

from tests.support.daemon_proc import Daemon, run_storaged
from tests.support.mcp_fixtures import anyio_backend, call, stdio_params  # noqa: F401  (fixture)

from protocol.config import store_id_path

pytestmark = [pytest.mark.timeout(90)]


@pytest.fixture
def base() -> Iterator[Path]:
    """A short directory (ipc socket paths must fit in 107 bytes)."""
    with tempfile.TemporaryDirectory(prefix="cmid-", dir="/tmp") as d:
        yield Path(d)


@pytest.fixture
def daemons(base: Path) -> Iterator[list[Daemon]]:
    started: list[Daemon] = []
    try:
        yield started
    finally:
        for d in started:
            d.close()


def new_daemon(daemons: list[Daemon], base: Path, name: str, endpoint: str) -> Daemon:
    d = Daemon(base / name, endpoint=endpoint, log_dir=base / "logs")
    daemons.append(d)
    return d


def ping(d: Daemon) -> dict:
    with d.client(timeout_ms=2000) as c:
        return c.call("ping")


# ------------------------------------------------------------------ the daemon side
def test_ping_says_which_store(base: Path, daemons: list[Daemon]) -> None:
    d = new_daemon(daemons, base, "a", f"ipc://{base}/a.sock").start()
    rep = ping(d)
    sid = Path(store_id_path(d.data_dir)).read_text().strip()
    assert rep["store_id"] == sid and len(sid) >= 16
    assert rep["data_dir"] == os.path.realpath(d.data_dir)
    assert stat.S_IMODE(os.stat(store_id_path(d.data_dir)).st_mode) == 0o600
    assert d.terminate() == 0
    d.start()
    assert ping(d)["store_id"] == sid  # persistent


def test_live_endpoint_of_another_data_dir_is_refused(base: Path, daemons: list[Daemon]) -> None:
    endpoint = f"ipc://{base}/shared.sock"
    a = new_daemon(daemons, base, "a", endpoint).start()
    path = endpoint[len("ipc://"):]
    inode = os.stat(path).st_ino
    r = run_storaged(["--data-dir", str(base / "b"), "--endpoint", endpoint], timeout=30)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert endpoint in r.stderr and "in use" in r.stderr
    assert os.stat(path).st_ino == inode  # the live socket was not touched
    rep = ping(a)
    assert rep["pid"] == a.pid and rep["data_dir"] == os.path.realpath(a.data_dir)


def test_stale_socket_file_is_replaced(base: Path, daemons: list[Daemon]) -> None:
    path = f"{base}/stale.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)  # a socket file nobody listens on any more (a daemon that was killed)
    s.close()
    d = new_daemon(daemons, base, "a", f"ipc://{path}").start()
    assert ping(d)["pid"] == d.pid


def test_clean_stop_removes_its_socket_file_only(base: Path, daemons: list[Daemon]) -> None:
    endpoint = f"ipc://{base}/a.sock"
    path = endpoint[len("ipc://"):]
    d = new_daemon(daemons, base, "a", endpoint).start()
    assert stat.S_ISSOCK(os.stat(path).st_mode)
    assert d.terminate() == 0
    assert not os.path.lexists(path)
    # a file that replaced ours while we ran is somebody else's: it stays
    d.start()
    os.unlink(path)
    Path(path).write_text("not the daemon's\n")
    assert d.terminate() == 0
    assert Path(path).read_text() == "not the daemon's\n"


# ------------------------------------------------------------------ the front-end side
@pytest.mark.anyio
async def test_front_end_refuses_the_daemon_of_another_data_dir(base: Path, daemons: list[Daemon]) -> None:
    endpoint = f"ipc://{base}/b.sock"
    b = new_daemon(daemons, base, "b", endpoint).start()
    (base / "a").mkdir()
    home = base / "home"
    params = stdio_params(base / "a", home, "--no-spawn", "--endpoint", endpoint)
    async with Client(params, mode="legacy") as c:
        r = await call(c, "write_message", {"session_id": "s", "role": "user", "content": "wrong store"})
        assert r["status"] == "ERROR" and r["error"]["code"] == "IO_ERROR", r
        assert "another data directory" in r["error"]["message"]
        h = await c.call_tool("list_sessions", {})  # a history tool: its family's code for IO_ERROR
        assert h.is_error and h.structured_content["error"]["code"] == "backend_failure", h.structured_content
        assert "another data directory" in h.structured_content["error"]["message"]
    with b.client() as cb:
        assert cb.call("read_messages", {"view": "sessions"})["sessions"] == []  # nothing landed in B
    # the front-end of B's own data dir uses it
    async with Client(stdio_params(base / "b", home, "--no-spawn", "--endpoint", endpoint), mode="legacy") as c:
        assert (await call(c, "write_message", {"session_id": "s", "role": "user", "content": "ok"}))["status"] == "OK"


@pytest.mark.anyio
async def test_front_end_notices_a_replaced_daemon(base: Path, daemons: list[Daemon]) -> None:
    """Its own daemon stops cleanly, another data dir's daemon takes the (now free) endpoint: the
    front-end, still running, must not write into that store."""
    endpoint = f"ipc://{base}/e.sock"
    a = new_daemon(daemons, base, "a", endpoint).start()
    params = stdio_params(base / "a", base / "home", "--no-spawn", "--endpoint", endpoint, "--timeout", "1")
    async with Client(params, mode="legacy") as c:
        assert (await call(c, "write_message", {"session_id": "s", "role": "user", "content": "a"}))["status"] == "OK"
        assert a.terminate() == 0
        b = new_daemon(daemons, base, "b", endpoint).start()
        r = await call(c, "write_message", {"session_id": "s", "role": "user", "content": "must not land in b"})
        assert r["status"] == "ERROR" and "another data directory" in r["error"]["message"], r
    with b.client() as cb:
        assert cb.call("read_messages", {"view": "sessions"})["sessions"] == []
