"""The daemon's forked children: a background snapshot's writer and a rebuild's worker.

Why a forked child rather than a thread: the child sees a frozen copy-on-write image of the state
(the way Redis writes its snapshots), runs on a core of its own and never takes the request loop's
GIL. A rebuild's worker in a thread tokenised a whole store beside the loop, and every request
waited behind its turns of the GIL (pings p50 21 ms, holds up to 0.5 s at 200k messages).

A child never touches the sockets, never logs through the parent's handlers' state beyond what
Python re-initialises at a fork, and leaves by ``os._exit`` (no atexit, no finalisers of objects
it shares with the parent). What it has to say goes in a file (the rebuild's result) or its exit
status.
"""
from __future__ import annotations

import ctypes
import os
import signal
import time
from typing import Callable

from . import datadir

_PR_SET_PDEATHSIG = 1
# A child runs this much nicer than the daemon: on two cores the request loop, a client and a child
# doing a snapshot's catch-up indexing or a rebuild contend, and the loop's slices should win (a
# child gets ~10% of a core it shares with the loop, all of an idle one).
CHILD_NICE = 10


def _detach(parent: int) -> None:
    """In a forked child: let go of the data directory's lock and die with the daemon.

    The child inherits the lock's descriptor, and a flock is held until every copy of it is closed:
    a child still writing when the daemon crashed would keep a restarted daemon out (exit 3).
    Closing the child's copy does not release the parent's lock. PR_SET_PDEATHSIG makes the kernel
    kill the child when the daemon dies; the getppid check covers a daemon that died before the
    prctl took effect."""
    for fd in datadir.held_lock_fds():
        try:
            os.close(fd)
        except OSError:
            pass
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: the lock is released all the same; only an orphan may finish its write
    if os.getppid() != parent:
        os._exit(1)


def start(work: Callable[[], int], delay_env: str | None = None) -> int:
    """Fork a child that runs ``work`` at CHILD_NICE (its return value is the exit status; an
    exception exits 1) and returns its pid; raises OSError when the fork fails. ``delay_env`` names an environment
    variable that, set to seconds, makes the child wait that long first: a fault-injection seam for
    tests (a child that is still at work when the daemon is stopped or killed); set to ``fail``, the
    child exits 1 at once (a child that keeps failing)."""
    parent = os.getpid()
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        _detach(parent)
        os.nice(CHILD_NICE)
        value = os.environ.get(delay_env) if delay_env else None
        if value == "fail":   # (the seam's other use: a child that fails at once)
            raise RuntimeError(f"{delay_env}=fail")
        delay = float(value or 0)
        if delay > 0:
            time.sleep(delay)
        code = work()
    except BaseException:
        pass
    finally:
        os._exit(code)


def reap(pid: int, block: bool, kill: bool = False) -> int | None:
    """The child's exit code once it has ended (-signal if a signal ended it; 1 if it is no longer
    known), None while it runs (``block`` False). ``kill``: end it first (SIGKILL)."""
    if kill:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        block = True
    try:
        done, status = os.waitpid(pid, 0 if block else os.WNOHANG)
    except ChildProcessError:
        return 1
    if done == 0:
        return None
    return os.waitstatus_to_exitcode(status)
