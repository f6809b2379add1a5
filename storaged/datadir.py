"""Claiming a data directory: the exclusive lock, the private run directory, the pid file.

The lock is taken before the socket is bound: an ``ipc://`` bind alone would silently steal the
endpoint of a live daemon (libzmq unlinks the old socket file), leaving two writers on one log.
The kernel drops the lock when the process dies, however it dies.
"""
from __future__ import annotations

import errno
import fcntl
import os

from protocol.config import pid_path, run_dir

LOCK_NAME = "LOCK"


class AlreadyRunning(Exception):
    pass


class DataDirLock:
    def __init__(self, data_dir: str) -> None:
        self.data_dir = os.path.abspath(data_dir)
        self.fd: int | None = None

    def acquire(self) -> None:
        os.makedirs(self.data_dir, mode=0o700, exist_ok=True)
        path = os.path.join(self.data_dir, LOCK_NAME)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                holder = read_pid(self.data_dir)
                who = f" (pid {holder})" if holder else ""
                raise AlreadyRunning(
                    f"another convmem-storaged{who} already owns the data directory {self.data_dir}") from None
            raise
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def prepare_run_dir(data_dir: str) -> str:
    """The directory of the ipc socket and pid file: only this user may enter it."""
    path = run_dir(data_dir)
    os.makedirs(path, mode=0o700, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def write_pid(data_dir: str) -> None:
    path = pid_path(data_dir)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(f"{os.getpid()}\n")
    os.replace(tmp, path)


def remove_pid(data_dir: str) -> None:
    try:
        os.unlink(pid_path(data_dir))
    except FileNotFoundError:
        pass


def read_pid(data_dir: str) -> int | None:
    try:
        with open(pid_path(data_dir)) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None
