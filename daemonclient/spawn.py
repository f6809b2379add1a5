"""Autospawn: a client (front-end, CLI, ingester) that reaches no daemon starts one for its data dir, detached.

Two clients may do this at the same moment; the daemon's data-dir lock lets one of the two daemons
run and makes the other exit at once, so the clients need no coordination of their own: each just
pings until a daemon answers. A daemon that cannot start at all says why on its stderr, which comes
to us through a pipe; that one line is then every caller's answer for a moment (``FAILURE_HOLD_S``)
instead of a new attempt per call.
"""
from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import time
from typing import Any

from protocol import errors as E
from protocol.config import DAEMON_EXIT_LOCKED, DAEMON_FAIL_PREFIX, DAEMON_LOG_NAME, read_pid

from .transport import DaemonClient, ipc_path

log = logging.getLogger(__name__)

READY_TIMEOUT_S = 20.0
PING_INTERVAL_S = 0.05
# After a daemon could not start, calls in the next seconds get that failure at once (no new attempt).
FAILURE_HOLD_S = 2.0
OUTPUT_MAX = 64 * 1024


class _Output:
    """What a starting daemon writes to stderr, read without blocking and kept bounded."""

    def __init__(self, pipe: Any) -> None:
        self.pipe = pipe
        self.buf = bytearray()
        if pipe is not None:
            os.set_blocking(pipe.fileno(), False)

    def drain(self) -> None:
        while self.pipe is not None:
            try:
                chunk = os.read(self.pipe.fileno(), 65536)
            except BlockingIOError:
                return
            except OSError:
                chunk = b""
            if not chunk:
                self.close()
                return
            self.buf += chunk
            del self.buf[:-OUTPUT_MAX]

    def cause(self) -> str | None:
        """The daemon's own one-line reason (without a traceback, without its prefix)."""
        lines = [ln.strip() for ln in self.buf.decode("utf-8", "replace").splitlines() if ln.strip()]
        for line in reversed(lines):
            if line.startswith(DAEMON_FAIL_PREFIX):
                return line[len(DAEMON_FAIL_PREFIX):]
        return None

    def close(self) -> None:
        if self.pipe is not None:
            self.pipe.close()
            self.pipe = None


def daemon_command() -> list[str]:
    """How to start the daemon: its console script when it is installed beside this Python, so that `ps`
    and `pgrep convmem-storaged` show it by name; else the module (a source checkout)."""
    script = os.path.join(os.path.dirname(sys.executable), "convmem-storaged")
    if os.access(script, os.X_OK):
        return [script]
    return [sys.executable, "-m", "storaged"]


class Spawner:
    def __init__(self, client: DaemonClient, data_dir: str, endpoint: str,
                 ready_timeout: float = READY_TIMEOUT_S) -> None:
        self.client = client
        self.data_dir = os.path.abspath(data_dir)
        self.endpoint = endpoint
        self.ready_timeout = ready_timeout
        self._lock = asyncio.Lock()
        self._ok = False
        self._children: list[subprocess.Popen[bytes]] = []
        # Why the daemon could not be started (its own one-line message), and when: the tool calls of
        # the next moments get it at once as a non-retryable error instead of each trying again.
        self.failure: str | None = None
        self._failed_at = 0.0

    def invalidate(self) -> None:
        """The daemon stopped answering: check (and maybe spawn) again before the next request."""
        self._ok = False

    def _looks_up(self) -> bool:
        path = ipc_path(self.endpoint)
        return self._ok and (path is None or os.path.exists(path))

    async def ensure(self) -> bool:
        """Make sure a daemon answers; start one if none does. Never raises; True if one answered. When
        False, ``failure`` says why if the daemon said (it could not start at all)."""
        if self._looks_up():
            return True
        async with self._lock:
            if self._looks_up():
                return True
            if self.failure is not None and time.monotonic() - self._failed_at < FAILURE_HOLD_S:
                return False
            self.failure = None
            try:
                self._ok = await self._ensure()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.error("could not start the storage daemon: %s", exc)
                self._ok = False
            return self._ok

    async def ensure_or_error(self) -> dict[str, Any] | None:
        """``ensure``, and when the daemon cannot start at all, the error to answer instead of a request:
        not BUSY (no retry helps) but IO_ERROR, in the daemon's own words."""
        if await self.ensure() or self.failure is None:
            return None
        return E.error_reply(E.IO_ERROR, f"the storage daemon cannot start: {self.failure}")

    def _failed(self, why: str) -> bool:
        self.failure, self._failed_at = why, time.monotonic()
        log.error("the storage daemon cannot start: %s", why)
        return False

    async def _ensure(self) -> bool:
        self._reap()
        state = await self.client.probe()
        if state == "ready":
            return True
        try:
            proc = self._spawn() if state == "down" else None  # a loading daemon is ours to wait for
        except OSError as exc:
            return self._failed(f"cannot run {daemon_command()[0]}: {exc.strerror or exc}")
        output = _Output(proc.stderr if proc is not None else None)
        try:
            deadline = time.monotonic() + self.ready_timeout
            while time.monotonic() < deadline:
                if await self.client.ping():
                    return True
                output.drain()
                code = proc.poll() if proc is not None else None
                if code is not None and code < 0:  # killed, not a daemon that cannot start: try again later
                    log.warning("the storage daemon was killed (signal %d) while starting", -code)
                    return False
                if code is not None and code != DAEMON_EXIT_LOCKED:
                    output.drain()
                    return self._failed(output.cause() or f"it exited with status {code}; see "
                                        f"{os.path.join(self.data_dir, DAEMON_LOG_NAME)}")
                await asyncio.sleep(PING_INTERVAL_S)
            log.error("the storage daemon did not become ready within %.0fs", self.ready_timeout)
            return False
        finally:
            output.close()

    async def revive_if_gone(self) -> bool:
        """The client's watch while a reply is awaited: if the daemon is known to be dead, start another
        at once (True once it answers) rather than let the request wait out its whole timeout."""
        if not self._gone():
            return False
        log.warning("the storage daemon of %s is gone; starting another", self.data_dir)
        self.invalidate()
        return await self.ensure()

    def _gone(self) -> bool:
        """True only when no daemon can be serving: the pid it recorded names no live process (or our
        own child that exited), or it stopped cleanly (no pid file, no socket). Unsure means False."""
        try:
            pid = read_pid(self.data_dir)
        except FileNotFoundError:
            path = ipc_path(self.endpoint)
            return path is not None and not os.path.exists(path)
        except (OSError, ValueError):
            return False
        for child in self._children:
            if child.pid == pid:
                return child.poll() is not None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        try:  # a zombie (its parent, another front-end, has not reaped it yet) is dead too
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] == "Z"
        except (OSError, IndexError):
            return False

    def _spawn(self) -> subprocess.Popen[bytes]:
        """Start a daemon, detached. Its start-up goes through a pipe to us, so that a daemon that cannot
        start (a data directory that is a file, unwritable, mistyped) tells us why in its own words; once
        ready it appends its log to DATA_DIR/storaged.log."""
        cmd = [*daemon_command(), "--data-dir", self.data_dir, "--endpoint", self.endpoint,
               "--log-file", os.path.join(self.data_dir, DAEMON_LOG_NAME)]
        if not os.path.isdir(self.data_dir):
            log.warning("no store in %s yet: the storage daemon creates one", self.data_dir)
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                start_new_session=True, close_fds=True)
        log.info("started storage daemon pid %d for %s", proc.pid, self.data_dir)
        self._children.append(proc)
        return proc

    def _reap(self) -> None:
        """Collect spawned daemons that have exited (the loser of a spawn race, or a dead one)."""
        self._children = [p for p in self._children if p.poll() is None]
