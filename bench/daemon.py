"""A real daemon process and a raw client for it, shared by the tests and the benchmarks that kill it.

- ``Daemon``: starts ``python -m storaged`` on a data directory, waits for readiness by pinging it (never
  a fixed sleep), stops it by PID (SIGTERM, SIGKILL) and always kills what it started in ``close``.
- ``Client``: a small synchronous REQ client with Lazy-Pirate retries. A retry after a timeout drops
  the socket, opens a new one and resends the *same* request id, so a mutation that was applied before
  the daemon died is answered with its first result instead of being applied twice.
- ``DaemonPool``: every ``Daemon`` one run made, so one teardown kills the survivors.

It lives in ``bench/`` because the crash-loop benchmark (``bench/crash_loop.py``) drives it and the
benchmarks must run without ``tests/``; the test suite imports it through ``tests/support/daemon_proc.py``.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgpack
import ulid
import zmq

from protocol import wire
from protocol.config import default_endpoint, run_dir

from .common import REPO

ROOT = Path(REPO)
PYTHON = sys.executable


def new_rid() -> str:
    return str(ulid.ULID())


def daemon_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("CONVMEM_ENDPOINT", None)
    env.pop("CONVMEM_DATA_DIR", None)
    env.pop("CONVMEM_CURVE_SECRET_KEY_FILE", None)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    if extra:
        env.update(extra)
    return env



class DaemonExited(RuntimeError):
    pass


class Daemon:
    """One daemon process at a time on ``data_dir``; ``start`` again after a kill restarts it."""

    def __init__(self, data_dir: str | os.PathLike, endpoint: str | None = None, extra_args: list[str] | None = None,
                 log_dir: str | os.PathLike | None = None, curve_server_public: bytes | None = None,
                 curve_client_keys: tuple[bytes, bytes] | None = None, command: list[str] | None = None) -> None:
        self.data_dir = str(data_dir)
        # what runs the daemon; a test may put a launcher in front of the module (a shifted clock)
        self.command = list(command or [PYTHON, "-m", "storaged"])
        self.curve_client_keys = curve_client_keys  # (public, secret) of an allow-listed client
        self.endpoint = endpoint or default_endpoint(self.data_dir, {})
        self.extra_args = list(extra_args or [])
        self.log_dir = Path(log_dir) if log_dir is not None else Path(self.data_dir).parent / "daemon-logs"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.curve_server_public = curve_server_public
        self.proc: subprocess.Popen | None = None
        self.started: list[subprocess.Popen] = []
        self.runs = 0
        self.stdout_path: Path | None = None
        self.stderr_path: Path | None = None

    # ------------------------------------------------------------------ starting
    def spawn(self, *extra: str) -> subprocess.Popen:
        """Start a daemon process without waiting for it."""
        self.runs += 1
        name = Path(self.data_dir).name
        self.stdout_path = self.log_dir / f"{name}-{self.runs}.stdout"
        self.stderr_path = self.log_dir / f"{name}-{self.runs}.stderr"
        cmd = [*self.command, "--data-dir", self.data_dir]
        if self.endpoint != default_endpoint(self.data_dir, {}):
            cmd += ["--endpoint", self.endpoint]
        cmd += self.extra_args + list(extra)
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            proc = subprocess.Popen(cmd, cwd=ROOT, env=daemon_env(), stdout=out, stderr=err,
                                    stdin=subprocess.DEVNULL)
        self.proc = proc
        self.started.append(proc)
        return proc

    def start(self, timeout: float = 60.0) -> "Daemon":
        self.spawn()
        self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 60.0) -> float:
        """Ping until this process answers; returns the seconds it took. Raises if it exits."""
        assert self.proc is not None
        t0 = time.monotonic()
        deadline = t0 + timeout
        with self.client(timeout_ms=250, retries=0) as c:
            while True:
                if self.proc.poll() is not None:
                    raise DaemonExited(f"daemon exited with {self.proc.returncode} before it was ready:\n"
                                       f"{self.stderr()[-4000:]}")
                rep = c.try_call("ping", {})
                if isinstance(rep, dict) and rep.get("status") == "OK" and rep.get("pid") == self.proc.pid \
                        and not rep.get("loading"):
                    return time.monotonic() - t0
                if time.monotonic() > deadline:
                    raise TimeoutError(f"daemon not ready after {timeout} s:\n{self.stderr()[-4000:]}")
                if rep is None:
                    c.reset()

    # ------------------------------------------------------------------ stopping (by PID)
    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self, timeout: float = 30.0) -> int | None:
        """SIGKILL the current process and reap it."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        return self.proc.wait(timeout)

    def terminate(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        """Ask the current process to stop (SIGTERM/SIGINT); returns its exit status."""
        assert self.proc is not None
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
        return self.proc.wait(timeout)

    def close(self) -> None:
        """Teardown: kill every process this object started that is still running, by PID."""
        for proc in self.started:
            if proc.poll() is None:
                try:
                    os.kill(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    pass

    def __enter__(self) -> "Daemon":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------ logs and clients
    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace") if self.stderr_path and self.stderr_path.exists() else ""

    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace") if self.stdout_path and self.stdout_path.exists() else ""

    def client(self, **kw: Any) -> "Client":
        if self.curve_server_public is not None and "curve_server_public" not in kw:
            kw["curve_server_public"] = self.curve_server_public
            kw.setdefault("curve_keys", self.curve_client_keys)
        return Client(self.endpoint, **kw)

    def run_dir(self) -> str:
        return run_dir(self.data_dir)


class NoReply(RuntimeError):
    """No reply within the client's retries."""


class Client:
    """Synchronous REQ client with Lazy-Pirate retries (new socket, same request id)."""

    def __init__(self, endpoint: str, timeout_ms: int = 5000, retries: int = 3,
                 curve_server_public: bytes | None = None, ctx: zmq.Context | None = None,
                 curve_keys: tuple[bytes, bytes] | None = None) -> None:
        self.endpoint = endpoint
        self.timeout_ms = timeout_ms
        self.retries = retries
        self.curve_server_public = curve_server_public
        self.curve_keys = (curve_keys or zmq.curve_keypair()) if curve_server_public is not None else None
        self.ctx = ctx or zmq.Context.instance()
        self.sock: zmq.Socket | None = None
        self.resets = 0

    def _open(self) -> zmq.Socket:
        if self.sock is None:
            s = self.ctx.socket(zmq.REQ)
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.RECONNECT_IVL, 20)
            s.setsockopt(zmq.RECONNECT_IVL_MAX, 100)
            if self.curve_keys is not None:
                public, secret = self.curve_keys
                s.curve_publickey = public
                s.curve_secretkey = secret
                s.curve_serverkey = self.curve_server_public
            s.connect(self.endpoint)
            self.sock = s
        return self.sock

    def reset(self) -> None:
        """Drop the socket (LINGER 0): the Lazy-Pirate way out of a REQ that lost its reply."""
        if self.sock is not None:
            self.sock.close(linger=0)
            self.sock = None
            self.resets += 1

    def close(self) -> None:
        self.reset()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def send_frames(self, frames: list[bytes], timeout_ms: int | None = None) -> Any:
        """One attempt with raw frames; the decoded reply, or None on timeout (the socket is then reset)."""
        sock = self._open()
        sock.send_multipart(frames, copy=len(frames[0]) < 65536 if frames else True)
        if sock.poll(self.timeout_ms if timeout_ms is None else timeout_ms, zmq.POLLIN):
            raw = sock.recv()
            return msgpack.unpackb(raw, raw=False, strict_map_key=False)
        self.reset()
        return None

    def try_call(self, op: str, args: dict[str, Any] | None = None, rid: str | None = None,
                 timeout_ms: int | None = None) -> Any:
        """One attempt; None on timeout."""
        return self.send_frames([wire.encode_request(op, args or {}, rid or new_rid())], timeout_ms)

    def call(self, op: str, args: dict[str, Any] | None = None, rid: str | None = None,
             retries: int | None = None, timeout_ms: int | None = None, deadline: float | None = None,
             busy_retry: bool = False) -> dict[str, Any]:
        """Send with retries (same request id every time). ``busy_retry`` also waits out BUSY replies.

        Retries ``retries`` times after timeouts, or until ``deadline`` (time.monotonic()) if given.
        """
        rid = rid or new_rid()
        frame = wire.encode_request(op, args or {}, rid)
        attempts = 0
        left = self.retries if retries is None else retries
        while True:
            rep = self.send_frames([frame], timeout_ms)
            if rep is not None:
                if busy_retry and _is_busy(rep):
                    if deadline is not None and time.monotonic() > deadline:
                        return rep
                    time.sleep(min(1.0, rep["error"].get("retry_after_ms", 100) / 1000))
                    continue
                return rep
            attempts += 1
            if deadline is not None:
                if time.monotonic() > deadline:
                    raise NoReply(f"{op}: no reply before the deadline ({attempts} attempts)")
            elif attempts > left:
                raise NoReply(f"{op}: no reply after {attempts} attempts")

    # ------------------------------------------------------------------ conveniences
    def write(self, session_id: str, content: str, role: str = "user", metadata: dict[str, Any] | None = None,
              **kw: Any) -> dict[str, Any]:
        args: dict[str, Any] = {"session_id": session_id, "role": role, "content": content}
        if metadata is not None:
            args["metadata_json"] = json.dumps(metadata)
        rep = self.call("write_message", args, **kw)
        assert rep.get("status") == "OK", rep
        return rep["message"]

    def health(self, **kw: Any) -> dict[str, Any]:
        return self.call("get_system_health", {}, **kw)

    def _pages(self, view: str, **args: Any) -> list[dict[str, Any]]:
        """Every item of a paged read_messages view, following nextCursor to the end."""
        out: list[dict[str, Any]] = []
        cursor = None
        while True:
            req: dict[str, Any] = {"view": view, "limit": 1000, **args}
            if cursor:
                req["cursor"] = cursor
            rep = self.call("read_messages", req)
            assert view in rep, rep
            out.extend(rep[view])
            cursor = rep.get("nextCursor")
            if not cursor:
                return out

    def imports_done(self) -> None:
        """Return once every import the daemon took before this call is stored to its end. The daemon
        stores an import in slices between other requests, one import after another in the order they
        came, even when its client has gone: the reply to this import (of a message already stored, so
        it stores nothing) comes after theirs. The store must hold a message."""
        page = self.call("export_messages", {"limit": 1})
        assert page.get("messages"), page
        rep = self.call("import_messages", {"messages": page["messages"]})
        assert rep.get("status") == "OK" and rep["imported"] == 0, rep

    def sessions(self) -> list[dict[str, Any]]:
        return self._pages("sessions")

    def history(self, session_id: str) -> list[dict[str, Any]]:
        return self._pages("history", session_id=session_id)

    def all_messages(self) -> list[dict[str, Any]]:
        """Every live message, session by session, via sessions and history paging."""
        out: list[dict[str, Any]] = []
        for s in self.sessions():
            out.extend(self.history(s["session_id"]))
        return out

    def rebuild(self, deadline_s: float = 300.0, poll_s: float = 0.05) -> dict[str, Any]:
        """rebuild_index, then poll rebuild_status until the final figures."""
        rep = self.call("rebuild_index", {})
        if rep.get("status") != wire.REBUILDING:
            return rep
        rid = rep["rebuild_id"]
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            rep = self.call("rebuild_status", {"rebuild_id": rid})
            if rep.get("status") != wire.REBUILDING:
                return rep
            time.sleep(poll_s)
        raise TimeoutError("rebuild did not finish")


def _is_busy(rep: Any) -> bool:
    return isinstance(rep, dict) and rep.get("status") == "ERROR" and rep.get("error", {}).get("code") == "BUSY"



class DaemonPool:
    """Every Daemon a test made; ``close_all`` (the fixture's teardown) kills the survivors by PID."""

    def __init__(self, base: Path) -> None:
        self.base = Path(base)
        self.daemons: list[Daemon] = []

    def new(self, name: str = "d", **kw: Any) -> Daemon:
        data_dir = self.base / name
        kw.setdefault("log_dir", self.base / "logs")
        d = Daemon(data_dir, **kw)
        path = d.endpoint[len("ipc://"):] if d.endpoint.startswith("ipc://") else ""
        assert len(path.encode()) <= 107, f"ipc path too long for the test: {path}"
        self.daemons.append(d)
        return d

    def close_all(self) -> None:
        for d in self.daemons:
            d.close()
