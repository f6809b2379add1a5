"""Helpers and fixtures for the MCP front-end tests: real daemon, real front-end processes, real SDK client.

Every process a test starts is ended by PID in teardown (SIGKILL + wait). Data dirs are short temp
dirs (an ipc socket path must fit in 107 bytes); HOME and XDG_DATA_HOME of every spawned process
point into the test's temp dir, so the real data dir is never touched.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from protocol.config import read_pid
from tests.support import ROOT
from tests.support.daemon_proc import Daemon

PYTHON = sys.executable


def frontend_env(home: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a front-end process (also what a daemon it spawns inherits)."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "XDG_DATA_HOME": str(home / "xdg"),
        "PYTHONPATH": str(ROOT) + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else ""),
        "PYTHONUNBUFFERED": "1",
    }
    if extra:
        env.update(extra)
    return env


def frontend_cmd(data_dir: Path | str, *extra: str) -> list[str]:
    return [PYTHON, "-m", "mcpfront", "--data-dir", str(data_dir), *extra]


def stdio_params(data_dir: Path | str, home: Path, *extra: str) -> Any:
    from mcp import StdioServerParameters

    cmd = frontend_cmd(data_dir, *extra)
    return StdioServerParameters(command=cmd[0], args=cmd[1:], env=frontend_env(home), cwd=str(ROOT))


def result_obj(r: Any) -> dict[str, Any]:
    """The contract object of a tool result; checks text == structuredContent and isError == ERROR."""
    assert len(r.content) == 1 and r.content[0].type == "text"
    obj = json.loads(r.content[0].text)
    assert obj == r.structured_content
    assert r.is_error == (obj.get("status") == "ERROR")
    return obj


async def call(client: Any, name: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
    return result_obj(await client.call_tool(name, args or {}))


def daemon_pids(data_dir: Path | str) -> list[int]:
    """PIDs of every live ``storaged`` process whose command line names ``data_dir``."""
    needle = str(data_dir)
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            with open(f"/proc/{entry}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if state == b"Z":
            continue
        args = [a.decode(errors="replace") for a in argv]
        started_as_daemon = "storaged" in args or any(os.path.basename(a) == "convmem-storaged" for a in args[:2])
        if started_as_daemon and needle in args:
            pids.append(int(entry))
    return pids


def pid_file(data_dir: Path | str) -> int | None:
    try:
        return read_pid(str(data_dir))
    except (OSError, ValueError):
        return None


def kill_pid(pid: int, timeout: float = 10.0) -> None:
    """SIGKILL a process by PID and wait until it is gone (reaping it if it is our child)."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done:
                return
        except ChildProcessError:  # not our child: wait until /proc says it is gone or a zombie
            try:
                with open(f"/proc/{pid}/stat", "rb") as f:
                    if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                        return
            except OSError:
                return
        time.sleep(0.01)


def kill_daemons_of(data_dir: Path | str) -> None:
    for pid in daemon_pids(data_dir):
        kill_pid(pid)


def read_http_token(data_dir: Path | str) -> str:
    """The bearer token an HTTP front-end on ``data_dir`` created (DATA_DIR/http-token)."""
    from protocol.config import http_token_path

    return Path(http_token_path(str(data_dir))).read_text().strip()


@contextlib.asynccontextmanager
async def _http_transport(url: str, token: str | None) -> Any:
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    headers = {"Authorization": f"Bearer {token}"} if token is not None else None
    async with create_mcp_http_client(headers=headers) as http:
        async with streamable_http_client(url, http_client=http) as streams:
            yield streams


def http_client(url: str, token: str | None, **kw: Any) -> Any:
    """The SDK's MCP client over streamable HTTP, sending ``Authorization: Bearer <token>``."""
    from mcp import Client

    return Client(_http_transport(url, token), **kw)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(host: str, port: int, proc: subprocess.Popen, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"front-end exited with {proc.returncode} before listening")
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.2):
            return
        time.sleep(0.02)
    raise TimeoutError(f"nothing listening on {host}:{port}")


class Procs:
    """Raw front-end processes started by a test; all killed by PID in teardown."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.procs: list[subprocess.Popen] = []
        self.data_dirs: list[Path] = []

    def start(self, cmd: list[str], env: dict[str, str], **kw: Any) -> subprocess.Popen:
        kw.setdefault("stdin", subprocess.DEVNULL)
        kw.setdefault("stdout", subprocess.DEVNULL)
        kw.setdefault("stderr", subprocess.DEVNULL)
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, **kw)
        self.procs.append(proc)
        return proc

    def watch_data_dir(self, data_dir: Path) -> None:
        """Kill any daemon on this data dir at teardown (the ones front-ends spawned)."""
        self.data_dirs.append(data_dir)

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                kill_pid(proc.pid)
            with contextlib.suppress(Exception):
                proc.wait(5)
        for d in self.data_dirs:
            kill_daemons_of(d)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("h")


@pytest.fixture
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("d")


@pytest.fixture
def procs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Procs]:
    p = Procs(tmp_path_factory.mktemp("p"))
    try:
        yield p
    finally:
        p.close()


@pytest.fixture
def daemon(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """A real ``python -m storaged`` on ``data_dir``, ready (pinged), killed by PID at the end."""
    d = Daemon(data_dir, log_dir=tmp_path_factory.mktemp("logs"))
    try:
        d.start(timeout=30)
        yield d
    finally:
        d.close()
        kill_daemons_of(data_dir)
