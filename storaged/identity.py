"""Who this daemon is, and keeping its ipc endpoint its own.

- The store id: a random id written once into the data dir at the first start. Ping reports it with
  the data dir's real path, so a front-end can tell its own daemon from one serving another data dir
  on the same endpoint.
- Before binding an ipc:// endpoint whose socket file exists, ask whether something listens on it.
  The data-dir lock only protects one data dir; a daemon of *another* data dir given the same
  ``--endpoint`` would otherwise unlink the live socket (libzmq's bind does that too) and take the
  clients of the first. A lock file beside the socket closes the window between that check and
  the bind for two daemons starting at once.
- At a clean stop the socket file is removed, but only if it is still the one we bound (same
  inode): a successor that already bound the path keeps its socket.
"""
from __future__ import annotations

import errno
import fcntl
import os
import secrets
import socket
from typing import Any

import msgpack
import ulid
import zmq

from protocol import wire
from protocol.config import store_id_path

from . import datadir, layout

PROBE_TIMEOUT_S = 1.0


class EndpointInUse(Exception):
    """The endpoint is served by another live process (the message names it)."""


def load_or_create_store_id(data_dir: str) -> str:
    """The data dir's store id, created (O_EXCL, 0600) at the first start."""
    path = store_id_path(data_dir)
    try:
        with open(path, encoding="ascii") as f:
            sid = f.read().strip()
        if sid:
            return sid
        os.unlink(path)  # a start that crashed between create and write: make a new one
    except FileNotFoundError:
        pass
    sid = secrets.token_hex(16)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, (sid + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    return sid


def identity(data_dir: str, store_id: str) -> dict[str, Any]:
    """What ping says about the store served."""
    return {"store_id": store_id, "data_dir": os.path.realpath(data_dir)}


class EndpointClaim:
    """Holds an ipc endpoint for this process: the beside-lock, then the live check, then the inode."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.path = endpoint[len("ipc://"):] if endpoint.startswith("ipc://") else None
        self.lock_fd: int | None = None
        self.inode: tuple[int, int] | None = None

    def claim(self) -> None:
        """Before bind. Raises EndpointInUse if a live process serves the endpoint; removes a stale
        socket file of a dead one."""
        if self.path is None:
            return
        fd = os.open(self.path + layout.LOCK_SUFFIX, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise EndpointInUse(f"the endpoint {self.endpoint} is in use by another convmem-storaged"
                                    f"{describe(probe(self.endpoint))}; give this daemon another --endpoint") from None
            raise
        self.lock_fd = fd
        datadir.note_held(fd)  # a background-snapshot child closes it, like the data directory's lock
        if not os.path.lexists(self.path):
            return
        if listening(self.path):
            raise EndpointInUse(f"the endpoint {self.endpoint} is in use by a live process"
                                f"{describe(probe(self.endpoint))}; give this daemon another --endpoint")
        os.unlink(self.path)  # a stale socket of a dead daemon

    def bound(self) -> None:
        """After bind: remember which socket file is ours."""
        if self.path is not None:
            try:
                st = os.stat(self.path)
                self.inode = (st.st_dev, st.st_ino)
            except OSError:
                self.inode = None

    def release(self) -> None:
        """At a clean stop (after the socket is closed): remove our socket file if it is still ours."""
        if self.path is not None and self.inode is not None:
            try:
                st = os.stat(self.path)
                if (st.st_dev, st.st_ino) == self.inode:
                    os.unlink(self.path)
            except OSError:
                pass
        if self.lock_fd is not None:
            datadir.note_held(self.lock_fd, False)
            os.close(self.lock_fd)
            self.lock_fd = None


def listening(path: str) -> bool:
    """True if a process accepts connections on the unix socket at ``path`` (refused: stale)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(PROBE_TIMEOUT_S)
    try:
        s.connect(path)
        return True
    except (ConnectionRefusedError, FileNotFoundError):
        return False
    except OSError as exc:
        # not a socket, or no permission: not ours to remove either
        return exc.errno not in (errno.ECONNREFUSED, errno.ENOENT)
    finally:
        s.close()


def probe(endpoint: str, timeout: float = PROBE_TIMEOUT_S) -> dict[str, Any] | None:
    """A ping's reply from whatever serves ``endpoint``, or None without one in time."""
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.REQ)
    s.setsockopt(zmq.LINGER, 0)
    try:
        s.connect(endpoint)
        s.send(wire.encode_request("ping", {}, str(ulid.ULID())))
        if s.poll(int(timeout * 1000), zmq.POLLIN):
            reply = msgpack.unpackb(s.recv(), raw=False)
            return reply if isinstance(reply, dict) else None
    except (zmq.ZMQError, ValueError, msgpack.UnpackException):
        return None
    finally:
        s.close(linger=0)
    return None


def describe(reply: dict[str, Any] | None) -> str:
    if not reply:
        return ""
    parts = []
    if isinstance(reply.get("pid"), int):
        parts.append(f"pid {reply['pid']}")
    if isinstance(reply.get("data_dir"), str):
        parts.append(f"data directory {reply['data_dir']}")
    return f" ({', '.join(parts)})" if parts else ""
