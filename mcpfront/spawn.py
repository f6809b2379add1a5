"""Autospawn: a front-end that reaches no daemon starts one for its data dir, detached.

Two front-ends may do this at the same moment; the daemon's data-dir lock lets one of the two
daemons run and makes the other exit at once, so the front-ends need no coordination of their own:
each just pings until a daemon answers.
"""
from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import time

from protocol.config import pid_path

from .client import DaemonClient, ipc_path

log = logging.getLogger(__name__)

READY_TIMEOUT_S = 20.0
PING_INTERVAL_S = 0.05
LOG_NAME = "storaged.log"
# The daemon's exit status when another daemon already holds the data dir's lock.
EXIT_LOCKED = 3


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

    def invalidate(self) -> None:
        """The daemon stopped answering: check (and maybe spawn) again before the next request."""
        self._ok = False

    def _looks_up(self) -> bool:
        path = ipc_path(self.endpoint)
        return self._ok and (path is None or os.path.exists(path))

    async def ensure(self) -> bool:
        """Make sure a daemon answers; start one if none does. Never raises; True if one answered."""
        if self._looks_up():
            return True
        async with self._lock:
            if self._looks_up():
                return True
            try:
                self._ok = await self._ensure()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("could not start the storage daemon")
                self._ok = False
            return self._ok

    async def _ensure(self) -> bool:
        self._reap()
        state = await self.client.probe()
        if state == "ready":
            return True
        proc = self._spawn() if state == "down" else None  # a loading daemon is ours to wait for
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            if await self.client.ping():
                return True
            code = proc.poll() if proc is not None else None
            if code is not None and code != EXIT_LOCKED:
                log.error("the storage daemon exited with status %s; see %s", code,
                          os.path.join(self.data_dir, LOG_NAME))
                return False
            await asyncio.sleep(PING_INTERVAL_S)
        log.error("the storage daemon did not become ready within %.0fs", self.ready_timeout)
        return False

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
            with open(pid_path(self.data_dir)) as f:
                pid = int(f.read().strip())
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
        os.makedirs(self.data_dir, mode=0o700, exist_ok=True)
        cmd = [*daemon_command(), "--data-dir", self.data_dir, "--endpoint", self.endpoint]
        fd = os.open(os.path.join(self.data_dir, LOG_NAME), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "ab") as err:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                                    start_new_session=True, close_fds=True)
        log.info("started storage daemon pid %d for %s", proc.pid, self.data_dir)
        self._children.append(proc)
        return proc

    def _reap(self) -> None:
        """Collect spawned daemons that have exited (the loser of a spawn race, or a dead one)."""
        self._children = [p for p in self._children if p.poll() is None]
