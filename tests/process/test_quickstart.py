"""The README's quick start works with the installed console scripts on their defaults.

Every process runs with HOME set to a temp dir and no CONVMEM_* / XDG_DATA_HOME variables, so the
defaults resolve to TMP_HOME/.local/share/convmem; the test checks that the real HOME is untouched.
Every process a test starts (or that a front-end autospawns) is ended by PID in teardown.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import pytest

import ulid

from tests.support.daemon_proc import Client as ZClient
from tests.support.daemon_proc import pid_alive as _alive, pids_mentioning as _pids_mentioning
from tests.support.mcp_fixtures import anyio_backend, call, kill_pid  # noqa: F401  (fixture)

from mcp import Client, StdioServerParameters
from protocol import wire
from protocol.config import default_endpoint

pytestmark = pytest.mark.timeout(120)

BIN_DIR = os.path.dirname(sys.executable)
STORAGED = os.path.join(BIN_DIR, "convmem-storaged")
MCP = os.path.join(BIN_DIR, "convmem-mcp")
REAL_DATA_DIR = Path(os.path.expanduser("~")) / ".local" / "share" / "convmem"


def clean_env(home: Path) -> dict[str, str]:
    """The environment of a fresh shell with the venv activated, HOME pointing at ``home``."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("CONVMEM_") and k not in ("XDG_DATA_HOME", "PYTHONPATH")}
    env["HOME"] = str(home)
    env["PATH"] = BIN_DIR + os.pathsep + os.environ.get("PATH", "/usr/bin:/bin")
    env["PYTHONUNBUFFERED"] = "1"
    return env




def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while _alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _real_data_dir_state() -> object:
    if not REAL_DATA_DIR.exists():
        return None
    return sorted((p.name, p.stat().st_size) for p in REAL_DATA_DIR.iterdir() if p.name != "run")


@pytest.fixture
def home() -> Iterator[Path]:
    """A short temp HOME (the default ipc socket path inside it must fit in 107 bytes).

    Teardown kills, by PID, every process still running whose command line names this HOME
    (an autospawned daemon is started with ``--data-dir HOME/.local/share/convmem``).
    """
    h = Path(tempfile.mkdtemp(prefix="cmqs-", dir="/tmp" if os.path.isdir("/tmp") else None))
    real_before = _real_data_dir_state()
    try:
        yield h
    finally:
        for pid in _pids_mentioning(str(h)):
            kill_pid(pid)
        shutil.rmtree(h, ignore_errors=True)
    assert _real_data_dir_state() == real_before, "the real HOME's data dir was touched"


def test_console_scripts_start(home: Path) -> None:
    for script in (STORAGED, MCP):
        assert os.access(script, os.X_OK), f"{script} is not installed next to {sys.executable}"
        r = subprocess.run([script, "--help"], cwd=home, env=clean_env(home), capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith("usage: " + os.path.basename(script)), r.stdout
        assert "--data-dir" in r.stdout
    assert not (home / ".local").exists()  # --help creates nothing


@pytest.mark.anyio
async def test_stdio_on_defaults_autospawns_a_daemon_under_home(home: Path) -> None:
    data_dir = home / ".local" / "share" / "convmem"
    env = clean_env(home)
    # The stdio client passes HOME/PATH/... of this process plus ``env``; ``env`` wins.
    params = StdioServerParameters(command=MCP, args=[], env=env, cwd=str(home))
    daemon_pid = None
    try:
        async with Client(params, mode="legacy") as c:
            token = f"quickstart{ulid.ULID()}".lower()
            w = await call(c, "write_message", {"session_id": "qs", "role": "user",
                                                "content": f"the quick start works: {token}"})
            assert w["status"] == "OK", w
            mid = w["message"]["message_id"]
            hits = await call(c, "search_messages", {"query": token})
            assert "results" in hits, hits
            assert [h["message_id"] for h in hits["results"]] == [mid]
            health = await call(c, "get_system_health")
            assert health["status"] == "OK", health
        # The data dir is the default one under the temp HOME.
        assert (data_dir / "log").is_file()
        assert (data_dir / "run").stat().st_mode & 0o777 == 0o700
        daemon_pid = int((data_dir / "run" / "storaged.pid").read_text().strip())
        assert _alive(daemon_pid), "the autospawned daemon should outlive its front-end"
        with open(f"/proc/{daemon_pid}/cmdline", "rb") as f:
            assert str(data_dir).encode() in f.read()
    finally:
        if daemon_pid is None:
            with contextlib.suppress(OSError, ValueError):
                daemon_pid = int((data_dir / "run" / "storaged.pid").read_text().strip())
        if daemon_pid is not None and _alive(daemon_pid):
            os.kill(daemon_pid, signal.SIGTERM)
            if not _wait_gone(daemon_pid, 30):
                kill_pid(daemon_pid)
    assert not _alive(daemon_pid)


def test_storaged_on_defaults_pings_and_stops_on_sigterm(home: Path) -> None:
    data_dir = home / ".local" / "share" / "convmem"
    endpoint = default_endpoint(str(data_dir), {})
    err_path = home / "storaged.stderr"
    with open(err_path, "wb") as err:
        proc = subprocess.Popen([STORAGED], cwd=home, env=clean_env(home), stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=err)
    try:
        deadline = time.monotonic() + 30
        with ZClient(endpoint, timeout_ms=250, retries=0) as c:
            while True:
                assert proc.poll() is None, err_path.read_text(errors="replace")
                rep = c.send_frames([wire.encode_request("ping", {}, str(ulid.ULID()))])
                if isinstance(rep, dict) and rep.get("status") == "OK" and not rep.get("loading"):
                    break
                assert time.monotonic() < deadline, "convmem-storaged did not answer a ping"
                if rep is None:
                    c.reset()
        assert rep.get("pid") == proc.pid, rep
        assert (data_dir / "log").is_file()
        assert int((data_dir / "run" / "storaged.pid").read_text().strip()) == proc.pid
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, err_path.read_text(errors="replace")
        assert not (data_dir / "run" / "storaged.pid").exists()  # a clean stop removes it
    finally:
        if proc.poll() is None:
            kill_pid(proc.pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
