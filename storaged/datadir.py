"""Claiming a data directory: the exclusive lock, the private run directory, the pid file.

The lock is taken before the socket is bound: an ``ipc://`` bind alone would silently steal the
endpoint of a live daemon (libzmq unlinks the old socket file), leaving two writers on one log.
The kernel drops the lock when the process dies, however it dies — and when every copy of its
file descriptor is closed: a forked child (the background snapshot) inherits the copy, so it must
close it (``held_lock_fds``) or a crashed daemon's child would keep its successor from starting.

The data directory and its ``run/`` must belong to this user and be writable by no one else
(``check_private``): a directory others can write to lets them plant or swap files the daemon
then trusts.
"""
from __future__ import annotations

import errno
import fcntl
import os
import stat

from protocol.config import pid_path, read_pid, run_dir, standard_data_dir

from . import layout
from .fileio import create_private


class AlreadyRunning(Exception):
    pass


class NotPrivate(Exception):
    """The data directory (or its run/) is owned by another user or writable by group or others."""


# file descriptors of the data-directory locks this process holds (a forked child closes them)
_HELD: set[int] = set()


def held_lock_fds() -> list[int]:
    return sorted(_HELD)


def note_held(fd: int, held: bool = True) -> None:
    """Another lock of this process that a forked child must let go of (the endpoint's beside-lock)."""
    if held:
        _HELD.add(fd)
    else:
        _HELD.discard(fd)


def _check_dir(path: str, what: str, st: os.stat_result) -> None:
    if not stat.S_ISDIR(st.st_mode):
        raise NotPrivate(f"{what} {path} is not a directory")
    if st.st_uid != os.geteuid():
        raise NotPrivate(f"{what} {path} is owned by another user (uid {st.st_uid}); it must belong to uid "
                         f"{os.geteuid()}")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise NotPrivate(f"{what} {path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o}); "
                         f"make it private: chmod 700 {path}")


def check_private(data_dir: str) -> None:
    """Refuse a data directory, or its run/, that another user owns or that group or others can
    write to. The data directory itself may be reached through a symlink (its target is checked);
    run/ is checked without following one (a symlinked run/ is refused)."""
    try:
        st = os.stat(data_dir)
    except FileNotFoundError:
        return  # created 0700 by the lock
    _check_dir(data_dir, "the data directory", st)
    path = run_dir(data_dir)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise NotPrivate(f"the run directory {path} is a symbolic link; remove it (it is recreated)")
    _check_dir(path, "the run directory", st)


class DataDirMissing(Exception):
    """The data directory does not exist and may not be created here."""


def create_data_dir(data_dir: str) -> bool:
    """Create the data directory (0700) if it does not exist; True if it was created. Only its last
    component is created — except at the standard location, whose parents a fresh account may lack —
    so that a mistyped --data-dir is refused instead of silently becoming a new, empty store."""
    if os.path.lexists(data_dir):
        return False
    parent = os.path.dirname(data_dir)
    if not os.path.isdir(parent):
        if os.path.abspath(data_dir) != standard_data_dir():
            raise DataDirMissing(f"the data directory {data_dir} does not exist, nor does its parent {parent}; "
                                 f"check --data-dir (or $CONVMEM_DATA_DIR), or create the parent first")
        os.makedirs(parent, mode=0o700, exist_ok=True)
    try:
        os.mkdir(data_dir, 0o700)
    except FileExistsError:  # another daemon (or a front-end) made it meanwhile
        return False
    return True


class DataDirLock:
    def __init__(self, data_dir: str) -> None:
        self.data_dir = os.path.abspath(data_dir)
        self.fd: int | None = None

    def acquire(self) -> None:
        path = os.path.join(self.data_dir, layout.LOCK)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                try:
                    holder: int | None = read_pid(self.data_dir)
                except (OSError, ValueError):
                    holder = None
                who = f" (pid {holder})" if holder else ""
                raise AlreadyRunning(
                    f"another convmem-storaged{who} already owns the data directory {self.data_dir}") from None
            raise
        self.fd = fd
        _HELD.add(fd)

    def release(self) -> None:
        if self.fd is not None:
            _HELD.discard(self.fd)
            os.close(self.fd)
            self.fd = None


def prepare_run_dir(data_dir: str) -> str:
    """The directory of the ipc socket and pid file: only this user may enter it."""
    path = run_dir(data_dir)
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or st.st_uid != os.geteuid():  # planted after check_private
        raise NotPrivate(f"the run directory {path} is a symbolic link or owned by another user")
    os.chmod(path, 0o700)
    return path


def write_pid(data_dir: str) -> None:
    path = pid_path(data_dir)
    tmp = path + layout.TMP_SUFFIX
    fd = create_private(tmp)
    with os.fdopen(fd, "w") as f:
        f.write(f"{os.getpid()}\n")
    os.replace(tmp, path)


def remove_pid(data_dir: str) -> None:
    try:
        os.unlink(pid_path(data_dir))
    except FileNotFoundError:
        pass

