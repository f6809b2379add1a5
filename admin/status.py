"""Which process is the storage daemon of a data directory, how long it has run, and stopping it.

The daemon writes its pid to ``<data>/run/storaged.pid`` once it listens and removes it at a clean
stop. A pid file can outlive its daemon (a crash, a kill -9) and the pid can since have been given to
another process, so the pid alone is never trusted: ``/proc/<pid>/cmdline`` must show a convmem
storaged whose data directory is this one before we report it as running or signal it. Nothing here
talks to the daemon or starts one (``convmem status`` must never autospawn).
"""
from __future__ import annotations

import os
import select
import signal
import time
from dataclasses import dataclass

from protocol.config import default_data_dir, read_pid


@dataclass
class Found:
    """The outcome of looking for the daemon: ``pid`` is set only when it is really ours and running."""
    pid: int | None
    why_not: str = ""  # when pid is None: a reason fit to show ("no pid file", "stale pid file ...")
    started_at: float | None = None  # epoch seconds


def _proc_read(pid: int, name: str) -> bytes:
    with open(f"/proc/{pid}/{name}", "rb") as f:
        return f.read()


def _state(pid: int) -> str | None:
    """The process's state letter, None if there is no such process."""
    try:
        return _proc_read(pid, "stat").rsplit(b")", 1)[1].split()[0].decode()
    except (OSError, IndexError):
        return None


def running(pid: int) -> bool:
    """Alive: exists and is not a zombie (a dead daemon its parent has not reaped yet is gone)."""
    state = _state(pid)
    return state is not None and state not in ("Z", "X")


def _daemon_data_dir(pid: int) -> str | None:
    """The data directory of a convmem storaged process, None when the process is something else."""
    try:
        argv = [a.decode(errors="surrogateescape") for a in _proc_read(pid, "cmdline").split(b"\0") if a]
    except OSError:
        return None
    at = None
    for i, a in enumerate(argv):
        if os.path.basename(a) == "convmem-storaged" or (a == "storaged" and i > 0 and argv[i - 1] == "-m"):
            at = i + 1
            break
    if at is None:
        return None
    rest = argv[at:]
    if "--salvage" in rest:
        return None  # a repair run, not a daemon
    value = None
    for i, a in enumerate(rest):
        if a == "--data-dir" and i + 1 < len(rest):
            value = rest[i + 1]
        elif a.startswith("--data-dir="):
            value = a.split("=", 1)[1]
    try:
        if value is None:  # from its environment, as the daemon computed it
            raw = _proc_read(pid, "environ").split(b"\0")
            env = dict(x.decode(errors="surrogateescape").split("=", 1) for x in raw if b"=" in x)
            return os.path.realpath(default_data_dir(env))
        if not os.path.isabs(value):
            value = os.path.join(os.readlink(f"/proc/{pid}/cwd"), value)
    except OSError:
        return None
    return os.path.realpath(value)


def _started_at(pid: int) -> float | None:
    """Process start time (field 22 of /proc/<pid>/stat, clock ticks after boot) as epoch seconds."""
    try:
        ticks = int(_proc_read(pid, "stat").rsplit(b")", 1)[1].split()[19])
        with open("/proc/stat", "rb") as f:
            btime = next(int(ln.split()[1]) for ln in f if ln.startswith(b"btime "))
        return btime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def find(data_dir: str) -> Found:
    """The running storaged of ``data_dir``, checked through /proc, or why there is none."""
    try:
        pid = read_pid(data_dir)
    except FileNotFoundError:
        return Found(None, "no pid file")
    except OSError as exc:
        return Found(None, f"cannot read its pid file ({exc.strerror})")
    except ValueError:
        return Found(None, "its pid file is not a pid")
    if pid <= 0 or not running(pid):
        return Found(None, f"stale pid file (pid {pid} has exited)")
    if _daemon_data_dir(pid) != os.path.realpath(data_dir):
        return Found(None, f"stale pid file (pid {pid} is not a convmem storaged of this data directory)")
    return Found(pid, started_at=_started_at(pid))


def stop(found: Found, data_dir: str, wait_s: float) -> tuple[bool, float]:
    """SIGTERM the daemon (it then writes its snapshot, removes its pid file and exits) and wait for it
    to be gone. Returns (gone, seconds waited). Signal and wait go through a pidfd opened before the
    process is checked again, so a pid reused in between is never signalled nor waited for."""
    pid = found.pid
    assert pid is not None
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        fd = None  # no pidfd (old kernel or Python): the re-check below narrows the window to microseconds
    try:
        if _daemon_data_dir(pid) != os.path.realpath(data_dir) or not running(pid):
            return True, 0.0
        try:
            if fd is not None:
                signal.pidfd_send_signal(fd, signal.SIGTERM)
            else:
                os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            return True, 0.0
        t0 = time.monotonic()
        if fd is not None:  # readable once the process has exited (zombie or reaped)
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            gone = bool(poller.poll(max(0, int(wait_s * 1000))))
            return gone, time.monotonic() - t0
        delay = 0.01
        while running(pid):
            if time.monotonic() - t0 > wait_s:
                return False, time.monotonic() - t0
            time.sleep(delay)
            delay = min(0.1, delay * 1.5)
        return True, time.monotonic() - t0
    finally:
        if fd is not None:
            os.close(fd)
