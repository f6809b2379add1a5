"""Ship it: the repository's own ``supervisord.conf`` runs the service, and survives a daemon kill.

It also runs the transcript ingester: a Claude Code transcript placed in the temp HOME before the
start is searchable through the HTTP front-end, a line appended after the daemon was killed and
restarted shows up too, and ``get_ingest_status`` reports the ingester healthy.

supervisord (from the ``supervisor`` package) runs a copy of ``supervisord.conf`` in a temp dir (so
``%(here)s`` and ``var/`` are there), with a temp data dir, a free HTTP port and a temp HOME. The
test writes through the HTTP front-end with the SDK's client, SIGKILLs the daemon, watches
supervisord restart it and the front-end recover on its own, reads every acknowledged write back,
then shuts supervisord down and checks that nothing it started is left running.
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
from typing import Any, Iterator

import anyio
import pytest

from tests.support import ROOT
from tests.support.daemon_proc import pid_alive as _alive, pids_mentioning as _pids_mentioning
from tests.support.mcp_fixtures import (  # noqa: F401
    anyio_backend, call, free_port, http_client, kill_pid, read_http_token,
)

# The data dir supervisord's programs use (the HTTP front-end keeps its bearer token there).
_DATA_DIRS: dict[str, Path] = {}


def Client(url: str) -> Any:  # noqa: N802  (the SDK's client, with the HTTP front-end's token)
    return http_client(url, read_http_token(_DATA_DIRS[url]))

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

CONF = ROOT / "supervisord.conf"
INGEST_EXEC = "exec convmem-ingest"
BIN_DIR = os.path.dirname(sys.executable)
N_MESSAGES = 20
SESSION = "deploy"
CC_SESSION = "9a8b7c6d-0000-4000-8000-000000000001"


def _claude_line(uuid: str, text: str) -> str:
    import json

    return json.dumps({"type": "user", "uuid": uuid, "sessionId": CC_SESSION, "cwd": "/srv/app",
                       "timestamp": "2026-11-30T10:00:00.000Z", "message": {"role": "user", "content": text}})


async def _found(url: str, query: str) -> bool:
    try:
        with anyio.fail_after(10):
            async with Client(url) as c:
                r = await c.call_tool("search_sessions", {"query": query})
    except Exception:
        return False
    return not r.is_error and r.structured_content["data"]["result_count"] > 0


def _tool(name: str, module: str) -> list[str]:
    """The console script next to sys.executable, else ``python -m module``."""
    path = os.path.join(BIN_DIR, name)
    return [path] if os.access(path, os.X_OK) else [sys.executable, "-m", module]




def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


class Supervisor:
    """supervisord on a copy of the repository's supervisord.conf; every process it started is tracked."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.conf = base / "supervisord.conf"
        # the repository's file, but the ingester scans every second instead of every 10 s: the test
        # waits for a line it appends to be ingested, and that wait is all the interval changes
        conf = CONF.read_text()
        assert INGEST_EXEC in conf, "supervisord.conf no longer starts the ingester as the test expects"
        self.conf.write_text(conf.replace(INGEST_EXEC, INGEST_EXEC + " --interval 1"))
        (base / "var").mkdir()
        self.data_dir = base / "data"
        self.home = base / "home"
        self.home.mkdir()
        self.transcript = self.home / ".claude" / "projects" / "-srv-app" / f"{CC_SESSION}.jsonl"
        self.transcript.parent.mkdir(parents=True)
        self.transcript.write_text(_claude_line("u1", "why does the deploy fail with tokendeployzq?") + "\n")
        self.port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("CONVMEM_")}
        env.update({
            "PATH": BIN_DIR + os.pathsep + os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.home),
            "XDG_DATA_HOME": str(self.home / "xdg"),
            "CONVMEM_DATA_DIR": str(self.data_dir),
            "CONVMEM_HTTP_HOST": "127.0.0.1",
            "CONVMEM_HTTP_PORT": str(self.port),
            "PYTHONUNBUFFERED": "1",
        })
        # the console scripts of the installed package, as in a deployment; PYTHONPATH only makes them
        # import this checkout's code (an editable install may point at another checkout)
        env["PYTHONPATH"] = str(ROOT)
        self.env = env
        self.proc: subprocess.Popen | None = None
        self.seen: set[int] = set()   # every pid supervisord was seen to run for us

    @property
    def url(self) -> str:
        url = f"http://127.0.0.1:{self.port}/mcp"
        _DATA_DIRS[url] = self.data_dir
        return url

    def start(self) -> None:
        cmd = _tool("supervisord", "supervisor.supervisord") + ["-c", str(self.conf), "-n"]
        with open(self.base / "supervisord.out", "wb") as out:
            self.proc = subprocess.Popen(cmd, cwd=self.base, env=self.env, stdin=subprocess.DEVNULL,
                                         stdout=out, stderr=subprocess.STDOUT)

    def ctl(self, *args: str, timeout: float = 30.0) -> subprocess.CompletedProcess:
        cmd = _tool("supervisorctl", "supervisor.supervisorctl") + ["-c", str(self.conf), *args]
        return subprocess.run(cmd, cwd=self.base, env=self.env, capture_output=True, text=True, timeout=timeout)

    def pid_of(self, program: str) -> int:
        """supervisord's pid for ``program`` (0 when it is not running)."""
        r = self.ctl("pid", program)
        try:
            pid = int(r.stdout.strip())
        except ValueError:
            return 0
        if pid:
            self.seen.add(pid)
        return pid

    def status(self, program: str) -> str:
        return self.ctl("status", program).stdout

    def track(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.seen.update(_descendants(self.proc.pid))

    def logs(self) -> str:
        out = []
        for name in ("supervisord.out", "var/supervisord.log", "var/storaged.log", "var/mcp-http.log",
                     "var/ingest.log"):
            p = self.base / name
            if p.exists():
                out.append(f"--- {name}\n{p.read_text(errors='replace')[-3000:]}")
        return "\n".join(out)

    def close(self) -> None:
        """Fallback teardown: SIGKILL supervisord and everything it started, by PID."""
        self.track()
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)
        for pid in sorted(self.seen | set(_pids_mentioning(str(self.base)))):
            kill_pid(pid)


@pytest.fixture
def supervisor() -> Iterator[Supervisor]:
    # A short base path: the data dir's ipc socket and supervisord's unix socket must fit in 107 bytes.
    base = Path(tempfile.mkdtemp(prefix="cmsv-", dir="/tmp" if os.path.isdir("/tmp") else None))
    sv = Supervisor(base)
    try:
        yield sv
    finally:
        sv.close()
        shutil.rmtree(base, ignore_errors=True)


async def _poll(what: str, fn: Any, timeout: float, interval: float = 0.05) -> Any:
    """Call ``fn`` (sync or async) until it returns something truthy; fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        last = fn()
        if hasattr(last, "__await__"):
            last = await last
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what} (last: {last!r})")
        await anyio.sleep(interval)


async def _health_over_http(url: str) -> dict[str, Any] | None:
    try:
        with anyio.fail_after(10):
            async with Client(url) as c:
                h = await call(c, "get_system_health")
    except Exception:
        return None
    return h if h.get("status") == "OK" else None


async def _history(c: Any, session: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    cursor = None
    while True:
        args: dict[str, Any] = {"view": "history", "session_id": session, "limit": 7}
        if cursor:
            args["cursor"] = cursor
        rep = await call(c, "read_messages", args)
        assert "history" in rep, rep
        out.extend(rep["history"])
        cursor = rep.get("nextCursor")
        if not cursor:
            return out


async def test_supervisord_restarts_killed_daemon_and_nothing_is_lost(supervisor: Supervisor) -> None:
    sv = supervisor
    sv.start()
    assert sv.proc is not None
    t0 = time.monotonic()
    try:
        # Up: the HTTP front-end answers MCP (and through it the daemon answers too).
        await _poll("the HTTP front-end to answer MCP", lambda: _health_over_http(sv.url), 30, 0.1)
        storaged_pid = sv.pid_of("storaged")
        http_pid = sv.pid_of("mcp-http")
        ingest_pid = sv.pid_of("ingest")
        assert storaged_pid > 0 and http_pid > 0 and ingest_pid > 0, sv.ctl("status").stdout
        # the ingester found the transcript in HOME
        await _poll("the transcript to be ingested", lambda: _found(sv.url, "tokendeployzq"), 30, 0.2)
        assert int((sv.data_dir / "run" / "storaged.pid").read_text().strip()) == storaged_pid
        assert (sv.base / "var" / "supervisor.sock").exists()
        assert not (sv.base / "var" / "data").exists(), "CONVMEM_DATA_DIR was not honoured"

        acked: dict[str, str] = {}   # message_id → content, every write that was answered OK
        async with Client(sv.url) as c:
            for i in range(N_MESSAGES):
                content = f"deploy message {i} token{i:03d}zq"
                w = await call(c, "write_message", {"session_id": SESSION, "role": "user", "content": content})
                assert w["status"] == "OK", w
                acked[w["message"]["message_id"]] = content

            # SIGKILL the daemon; supervisord must start a new one.
            os.kill(storaged_pid, signal.SIGKILL)
            await _poll("the killed daemon to be gone", lambda: not _alive(storaged_pid), 10, 0.01)

            # Calls during the gap may be BUSY (isError); one must succeed again within a bounded time.
            busy = 0
            k = 0

            async def write_once() -> bool:
                nonlocal busy, k
                k += 1
                content = f"after the kill {k} tokenafter{k:03d}zq"
                r = await call(c, "write_message", {"session_id": SESSION, "role": "assistant", "content": content})
                if r["status"] == "OK":
                    acked[r["message"]["message_id"]] = content
                    return True
                assert r["error"]["code"] == "BUSY", r
                busy += 1
                return False

            await _poll("the front-end to recover", write_once, 45, 0.1)

            new_pid = await _poll("supervisord to restart the daemon",
                                  lambda: (p := sv.pid_of("storaged")) not in (0, storaged_pid) and p, 20)
            await _poll("storaged RUNNING", lambda: "RUNNING" in sv.status("storaged"), 20)
            assert _alive(new_pid)
            assert int((sv.data_dir / "run" / "storaged.pid").read_text().strip()) == new_pid
            # The front-end recovered on its own: supervisord did not have to restart it.
            assert sv.pid_of("mcp-http") == http_pid
            assert "RUNNING" in sv.status("mcp-http")
            # ... and so did the ingester: a line appended now is ingested by the same process
            with open(sv.transcript, "a") as f:
                f.write(_claude_line("u2", "and after the restart tokenlaterzq?") + "\n")
            await _poll("the appended line to be ingested", lambda: _found(sv.url, "tokenlaterzq"), 30, 0.2)
            assert sv.pid_of("ingest") == ingest_pid
            status = await c.call_tool("get_ingest_status", {})
            conds = {x["condition_type"]: x for x in status.structured_content["data"]["conditions"]}
            assert conds["health"]["state"] == "true" and conds["readiness"]["state"] == "true", conds

            # Every acknowledged write is there, in order, once.
            hist = await _history(c, SESSION)
            assert [m["message_id"] for m in hist] == list(acked)
            assert [m["content"] for m in hist] == list(acked.values())
            hits = await call(c, "search_messages", {"query": "token007zq"})
            assert [h["message_id"] for h in hits["results"]][:1] == [list(acked)[7]]
            health = await call(c, "get_system_health")
            assert health["status"] == "OK"
            print(f"after the kill: {busy} BUSY answer(s), then OK", file=sys.stderr)
        sv.track()

        # Shut supervisord down; it stops both programs and exits.
        r = sv.ctl("shutdown")
        assert r.returncode == 0, r.stdout + r.stderr
        assert sv.proc.wait(60) == 0
        started = sv.seen | {storaged_pid, new_pid, http_pid, ingest_pid}
        await _poll("every process supervisord started to be gone",
                    lambda: not [p for p in started if _alive(p)] and not _pids_mentioning(str(sv.base)), 15)
        assert not (sv.data_dir / "run" / "storaged.pid").exists()  # a clean stop removes it
        log = (sv.base / "var" / "supervisord.log").read_text()
        assert "stopped: storaged (exit status 0)" in log and "stopped: ingest (exit status 0)" in log
        assert time.monotonic() - t0 < 60
    except BaseException:
        print(sv.logs(), file=sys.stderr)
        raise
