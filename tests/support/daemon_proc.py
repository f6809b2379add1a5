"""Shared helpers for the daemon-process tests: real ``python -m storaged`` processes, real sockets.

- ``Daemon``: starts the daemon on a data directory, waits for readiness by pinging it (never a
  fixed sleep), stops it by PID (SIGTERM, SIGKILL) and always kills what it started in teardown.
- ``Client``: a small synchronous REQ client with Lazy-Pirate retries. A retry after a timeout
  drops the socket, opens a new one and resends the *same* request id, so a mutation that was
  applied before the daemon died is answered with its first result instead of being applied twice.
"""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import msgpack
import ulid
import zmq

from protocol import wire
from protocol.config import default_endpoint, run_dir

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable


def pid_alive(pid: int) -> bool:
    """Running (not gone, not a zombie)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def pids_mentioning(needle: str) -> list[int]:
    """Live processes whose command line contains ``needle`` (our temp dir is unique)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if needle in cmdline and pid_alive(int(entry)):
            out.append(int(entry))
    return out


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


def run_storaged(args: list[str], timeout: float = 60.0) -> subprocess.CompletedProcess:
    """Run ``python -m storaged ARGS`` to completion (salvage, refused starts)."""
    return subprocess.run([PYTHON, "-m", "storaged", *args], cwd=ROOT, env=daemon_env(), capture_output=True,
                          text=True, timeout=timeout)


class DaemonExited(RuntimeError):
    pass


class Daemon:
    """One daemon process at a time on ``data_dir``; ``start`` again after a kill restarts it."""

    def __init__(self, data_dir: str | os.PathLike, endpoint: str | None = None, extra_args: list[str] | None = None,
                 log_dir: str | os.PathLike | None = None, curve_server_public: bytes | None = None,
                 curve_client_keys: tuple[bytes, bytes] | None = None) -> None:
        self.data_dir = str(data_dir)
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
        cmd = [PYTHON, "-m", "storaged", "--data-dir", self.data_dir]
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


def state_of(messages: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """message_id → the whole Message object: what 'identical state' compares."""
    return {m["message_id"]: m for m in messages}


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


# ---------------------------------------------------------------------------------------------------
# The crash loop (shared by tests/test_daemon_crashloop.py and bench/crash_loop.py)
# ---------------------------------------------------------------------------------------------------
class _Writer(threading.Thread):
    """One client: writes (each with a unique content token), some updates and deletes of its own
    acknowledged messages, every request retried Lazy-Pirate style with its request id until answered."""

    def __init__(self, k: int, endpoint: str, seed: int, stop: threading.Event, timeout_ms: int,
                 pace_s: float, op_deadline_s: float) -> None:
        super().__init__(name=f"writer-{k}", daemon=True)
        self.k = k
        self.endpoint = endpoint
        self.rng = random.Random(seed)
        self.stop = stop
        self.timeout_ms = timeout_ms
        self.pace_s = pace_s
        self.op_deadline_s = op_deadline_s
        self.live: dict[str, tuple[str, str, int]] = {}   # message_id → (session, content, revision)
        self.deleted: set[str] = set()
        self.writes = self.updates = self.deletes = 0
        self.retries = 0
        self.errors: list[str] = []
        self.n = 0

    def token(self) -> str:
        self.n += 1
        return f"tok-{self.k}-{self.n}-{self.rng.getrandbits(48):012x}"

    def _call(self, c: Client, op: str, args: dict[str, Any]) -> dict[str, Any] | None:
        try:
            # BUSY (the restarted daemon still loading) is retried like a timeout, same request id
            return c.call(op, args, rid=new_rid(), deadline=time.monotonic() + self.op_deadline_s, busy_retry=True)
        except NoReply as exc:
            self.errors.append(f"writer {self.k}: {exc}")
            return None

    def run(self) -> None:
        with Client(self.endpoint, timeout_ms=self.timeout_ms, retries=0) as c:
            while not self.stop.is_set() and not self.errors:
                r = self.rng.random()
                if r < 0.12 and self.live:
                    self.update(c)
                elif r < 0.2 and self.live:
                    self.delete(c)
                else:
                    self.write(c)
                if self.pace_s:
                    time.sleep(self.rng.uniform(0, 2 * self.pace_s))
            self.retries = c.resets

    def write(self, c: Client) -> None:
        session = f"cl-{self.k}-{self.rng.randrange(4)}"
        content = self.token()
        rep = self._call(c, "write_message", {"session_id": session, "role": self.rng.choice(["user", "assistant"]),
                                              "content": content})
        if rep is None:
            return
        if rep.get("status") != "OK" or rep["message"]["content"] != content:
            self.errors.append(f"write: unexpected reply {rep!r:.300}")
            return
        m = rep["message"]
        self.live[m["message_id"]] = (session, content, 1)
        self.writes += 1

    def update(self, c: Client) -> None:
        mid = self.rng.choice(list(self.live))
        session, _, rev = self.live[mid]
        content = self.token()
        rep = self._call(c, "update_message", {"message_id": mid, "content": content, "expected_revision": rev})
        if rep is None:
            return
        if rep.get("status") != "OK" or rep.get("changed") is not True or rep["message"]["revision"] != rev + 1 \
                or rep["message"]["content"] != content:
            self.errors.append(f"update: unexpected reply {rep!r:.300}")
            return
        self.live[mid] = (session, content, rev + 1)
        self.updates += 1

    def delete(self, c: Client) -> None:
        mid = self.rng.choice(list(self.live))
        rep = self._call(c, "delete_message", {"message_id": mid})
        if rep is None:
            return
        if rep != {"status": "OK"}:
            self.errors.append(f"delete: unexpected reply {rep!r:.300}")
            return
        del self.live[mid]
        self.deleted.add(mid)
        self.deletes += 1


def crash_loop(base_dir: str | os.PathLike, kills: int, writers: int = 4, seed: int = 1, min_gap_ms: int = 50,
               max_gap_ms: int = 400, timeout_ms: int = 500, pace_s: float = 0.002, op_deadline_s: float = 60.0,
               progress: Any = None) -> dict[str, Any]:
    """SIGKILL the daemon ``kills`` times (50–400 ms after each restart became ready) while writers
    run; then restart once more and check every acknowledged effect against the stored state.

    Returns the figures; ``lost`` and ``duplicated`` must be 0, ``errors`` empty.
    """
    rng = random.Random(seed)
    pool = DaemonPool(Path(base_dir))
    d = pool.new("d")
    t0 = time.monotonic()
    stop = threading.Event()
    ws: list[_Writer] = []
    restarts: list[float] = []
    try:
        d.start()
        ws = [_Writer(k, d.endpoint, seed * 1000 + k, stop, timeout_ms, pace_s, op_deadline_s)
              for k in range(writers)]
        for w in ws:
            w.start()
        done = 0
        while done < kills:
            time.sleep(rng.uniform(min_gap_ms, max_gap_ms) / 1000)
            d.kill()
            done += 1
            restarts.append(_restart(d))
            if any(w.errors for w in ws):
                break
            if progress is not None and done % 25 == 0:
                progress(done, sum(w.writes for w in ws))
        stop.set()
        for w in ws:
            w.join(op_deadline_s + 30)
        # The verdict, after one more clean restart from the crash-loop log (no snapshot yet).
        d.kill()
        _restart(d)
        with d.client(timeout_ms=30_000) as c:
            stored = c.all_messages()
            health = c.health()
        return _verdict(ws, stored, health, done, restarts, time.monotonic() - t0, d)
    finally:
        stop.set()
        pool.close_all()


def _restart(d: Daemon) -> float:
    t = time.monotonic()
    d.start()
    return time.monotonic() - t


def _verdict(ws: list[_Writer], stored: list[dict[str, Any]], health: dict[str, Any], kills: int,
             restarts: list[float], seconds: float, d: Daemon) -> dict[str, Any]:
    expected: dict[str, tuple[str, str, int]] = {}
    deleted: set[str] = set()
    for w in ws:
        expected.update(w.live)
        deleted |= w.deleted
    by_id = {m["message_id"]: m for m in stored}
    tokens = Counter(m["content"] for m in stored)
    lost = [mid for mid, (session, content, rev) in expected.items()
            if mid not in by_id or (by_id[mid]["session_id"], by_id[mid]["content"], by_id[mid]["revision"])
            != (session, content, rev)]
    resurrected = [mid for mid in deleted if mid in by_id]
    duplicated = sum(n - 1 for n in tokens.values() if n > 1) + (len(stored) - len(by_id))
    unexpected = [mid for mid in by_id if mid not in expected and mid not in deleted]
    return {
        "kills": kills,
        "writers": len(ws),
        "acknowledged": sum(w.writes for w in ws),
        "acknowledged_updates": sum(w.updates for w in ws),
        "acknowledged_deletes": sum(w.deletes for w in ws),
        "lost": len(lost) + len(resurrected),
        "duplicated": duplicated + len(unexpected),
        "lost_ids": (lost + resurrected)[:20],
        "unexpected_ids": unexpected[:20],
        "stored_messages": len(stored),
        "expected_messages": len(expected),
        "health_active_messages": health.get("active_messages"),
        "health_status": health.get("status"),
        "retries": sum(w.retries for w in ws),
        "errors": [e for w in ws for e in w.errors][:20],
        "restart_s_max": round(max(restarts), 3) if restarts else 0.0,
        "restart_s_mean": round(sum(restarts) / len(restarts), 3) if restarts else 0.0,
        "log_size": health.get("log_size"),
        "seconds": round(seconds, 1),
        "daemon_runs": d.runs,
    }
