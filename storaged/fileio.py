"""The one layer through which the store touches its files: the log, the snapshot, the cursor key.

All of the store's durable I/O goes through here (the data directory's lock, pid file and store id,
written once per start, are opened directly by ``datadir`` and ``identity``) so that (1) the I/O counters of ``get_system_health`` are
counted where the I/O happens, and (2) tests can substitute a layer that fails on purpose (short
writes, EIO, a power cut that drops whatever was not synced) and prove nothing acknowledged is lost.

No open here follows a symbolic link, and a new file is always a new inode (``O_EXCL``, after
unlinking a leftover — ``unlink`` removes a link, never its target): a ``snapshot.tmp`` or
``log.compact`` planted as a symlink, or left behind by someone else, is never written through or
reused with its old owner and mode. Files are created 0600.
"""
from __future__ import annotations

import ctypes
import errno
import functools
import logging
import mmap
import os
import queue
import threading
import time
from dataclasses import dataclass

import numpy as np

from . import layout


LOG = logging.getLogger("convmem.storaged")
# an fdatasync slower than NOTED_SYNC_S is logged (info; a warning beyond SLOW_SYNC_S): every client of
# the request loop waited for it (a disk busy with another process's writes is the usual cause; the
# log line tells it apart from our own work)
NOTED_SYNC_S = 0.05
SLOW_SYNC_S = 0.1
# A file released (``FileIO.release``) is cut this much at a time, with a pause between cuts: freeing
# a big file's blocks holds the journal, and every fdatasync in the meantime — the request loop's
# commits — waited for it (unlinking 256 MB at once held a concurrent fdatasync 115 ms on this
# machine's ext4; cut 16 MB at a time, the worst was 9.5 ms). RocksDB's DeleteScheduler does the same.
RELEASE_STEP_BYTES = 16 << 20
RELEASE_PAUSE_S = 0.01
# A bulk writer (``Paced``: a snapshot, a segment, a compacted log — tens to hundreds of MB, written by
# forked children) pushes what it wrote to the disk every PACE_BYTES and waits for it: left to pile up,
# those pages were flushed by its final fsync in one go, and the loop's fdatasyncs waited behind it (a
# 96 MB file written beside a loop of small fdatasyncs: their p99 60 ms, 8 ms paced per MiB). RocksDB's
# bytes_per_sync, LevelDB's and the kernel's own advice for streaming writers.
PACE_BYTES = 1 << 20


@dataclass
class IOCounters:
    write_bytes: int = 0
    write_calls: int = 0
    flush_calls: int = 0
    truncate_calls: int = 0
    replace_calls: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


class FileIO:
    """Plain POSIX file access. Subclass and override to inject faults."""

    def __init__(self) -> None:
        self.counters = IOCounters()

    # -- reading (not counted: the counters are about what the store writes) --
    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def free_bytes(self, path: str) -> int | None:
        """Bytes an unprivileged writer may still use on the file system of ``path`` (None: unknown)."""
        try:
            st = os.statvfs(path)
        except (OSError, AttributeError):  # (no statvfs: not a POSIX system)
            return None
        return st.f_bavail * st.f_frsize

    def size(self, path: str) -> int:
        try:
            return os.stat(path).st_size
        except FileNotFoundError:
            return 0

    def read_all(self, path: str):
        """The file's bytes, as a buffer. Large files are memory-mapped rather than copied."""
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            size = os.fstat(fd).st_size
            if size == 0:
                return b""
            if size < (1 << 20):
                return os.pread(fd, size, 0)
            return mmap.mmap(fd, size, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)

    def listdir(self, path: str) -> list[str]:
        return os.listdir(path)

    def open_read(self, path: str) -> int:
        """A descriptor to ``pread`` from (message text is read back from the log by offset)."""
        return os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)

    def pread(self, fd: int, n: int, offset: int) -> bytes:
        return os.pread(fd, n, offset)

    # -- writing --
    def open_append(self, path: str, create: bool = True) -> int:
        flags = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | (os.O_CREAT if create else 0)
        return os.open(path, flags, 0o600)

    def open_new(self, path: str) -> int:
        """A fresh file (a new inode, 0600) to fill and then rename into place."""
        return create_private(path)

    def write(self, fd: int, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            self.counters.write_calls += 1
            if n <= 0:
                raise OSError(errno.EIO, "write made no progress")
            self.counters.write_bytes += n
            view = view[n:]

    def sync(self, fd: int) -> None:
        t0 = time.monotonic()
        os.fdatasync(fd)
        self.counters.flush_calls += 1
        took = time.monotonic() - t0
        if took > NOTED_SYNC_S:
            LOG.log(logging.WARNING if took > SLOW_SYNC_S else logging.INFO,
                    "an fdatasync took %.0f ms (the disk is busy)", took * 1000)

    def truncate(self, fd: int, size: int) -> None:
        os.ftruncate(fd, size)
        self.counters.truncate_calls += 1

    def replace(self, src: str, dst: str) -> None:
        os.replace(src, dst)
        self.counters.replace_calls += 1

    def sync_dir(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
            self.counters.flush_calls += 1
        finally:
            os.close(fd)

    def remove(self, path: str) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass

    def close(self, fd: int) -> None:
        os.close(fd)

    def writeback(self, fd: int, offset: int, nbytes: int) -> None:
        """Write ``nbytes`` of ``fd`` from ``offset`` to the disk and wait (``sync_file_range``; an
        fdatasync where there is none). Not a durability point — no metadata, no disk cache flush:
        the writer's own fsync still is — only pacing (``Paced``)."""
        if _sync_file_range is None or _sync_file_range(fd, offset, nbytes, _SFR_WAIT_WRITE) != 0:
            os.fdatasync(fd)

    def open_to_release(self, path: str) -> int | None:
        """A writable descriptor of a file that is about to lose its last name (renamed over), for
        ``release_fd`` once nothing reads it; None if there is no such file."""
        try:
            return os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return None

    def release(self, path: str) -> None:
        """Remove a file that may be big: the name goes now (``remove``), its blocks are freed by a
        thread a cut at a time (``release_fd``)."""
        fd = self.open_to_release(path)
        try:
            self.remove(path)
        except BaseException:
            if fd is not None:
                os.close(fd)
            raise
        if fd is not None:
            self.release_fd(fd)

    def release_fd(self, fd: int) -> None:
        """Free the blocks of the file open for writing at ``fd`` (unlinked, or about to be) a cut at a
        time in a thread, then close it: the caller gives ``fd`` away."""
        _releaser().put(fd)

    def write_file_atomic(self, path: str, data: bytes) -> None:
        """Write, fsync, rename, fsync the directory: the file is either old or new, never torn."""
        tmp = path + layout.TMP_SUFFIX
        fd = self.open_new(tmp)
        try:
            self.write(fd, data)
            self.sync(fd)
        finally:
            self.close(fd)
        self.replace(tmp, path)
        self.sync_dir(os.path.dirname(path) or ".")


class Paced:
    """Writes to a file being filled from its start, pushed to the disk every PACE_BYTES (see there)."""

    __slots__ = ("io", "fd", "pos", "pushed")

    def __init__(self, io: FileIO, fd: int) -> None:
        self.io, self.fd, self.pos, self.pushed = io, fd, 0, 0

    def write(self, data) -> None:
        view = memoryview(data).cast("B")
        for at in range(0, len(view), PACE_BYTES):
            piece = view[at:at + PACE_BYTES]
            self.io.write(self.fd, piece)
            self.pos += len(piece)
            if self.pos - self.pushed >= PACE_BYTES:
                self.io.writeback(self.fd, self.pushed, self.pos - self.pushed)
                self.pushed = self.pos


def _load_sync_file_range():
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):  # not Linux: writeback falls back to fdatasync
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_sync_file_range = _load_sync_file_range()
_SFR_WAIT_WRITE = 1 | 2 | 4  # SYNC_FILE_RANGE_WAIT_BEFORE | _WRITE | _WAIT_AFTER

_RELEASES: queue.SimpleQueue | None = None
_RELEASES_LOCK = threading.Lock()


def _releaser() -> queue.SimpleQueue:
    """The queue of the process's one releasing thread (started at the first release)."""
    global _RELEASES
    with _RELEASES_LOCK:
        if _RELEASES is None:
            _RELEASES = queue.SimpleQueue()
            threading.Thread(target=_release_all, args=(_RELEASES,), name="release-files", daemon=True).start()
        return _RELEASES


def _release_all(pending: queue.SimpleQueue) -> None:
    while True:
        release_now(pending.get())


def release_now(fd: int) -> None:
    """``FileIO.release_fd``'s work in the calling thread: for a forked child, which may wait (a
    background snapshot's writer renaming its snapshot over the old one)."""
    try:
        size = os.fstat(fd).st_size
        while size > 0:
            size = max(0, size - RELEASE_STEP_BYTES)
            os.ftruncate(fd, size)
            if size:
                time.sleep(RELEASE_PAUSE_S)
    except OSError as exc:  # the blocks are freed at the close all the same
        LOG.warning("could not release a file a cut at a time (%s)", exc.strerror or exc)
    finally:
        try:
            os.close(fd)
        except OSError:
            pass


def map_private(path: str, offset: int, length: int, identity: tuple[int, int, int],
                writable: bool = True) -> tuple[mmap.mmap, int]:
    """A copy-on-write mapping of ``length`` bytes of the file at ``path`` from ``offset``, and where
    they begin in it (the mapping starts at the page below ``offset``): its pages are the page cache's
    until written, a written one becomes the process's own and the file never changes. ``identity``
    is the file's (st_dev, st_ino, st_size) when it was read and checked: OSError if it is not that file.
    ``writable`` False: a read-only mapping (a write faults)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino, st.st_size) != identity or offset < 0 or offset + length > st.st_size:
            raise OSError(errno.ESTALE, f"{path} is not the file that was checked")
        start = offset - offset % mmap.ALLOCATIONGRANULARITY
        access = mmap.ACCESS_COPY if writable else mmap.ACCESS_READ
        return mmap.mmap(fd, offset - start + length, offset=start, access=access), offset - start
    finally:
        os.close(fd)


# /proc/self/pagemap's flags of a page (the kernel's Documentation/admin-guide/mm/pagemap.rst): present
# in memory, swapped out, a page of a file (a private mapping's page that was written is anonymous)
_PM_PRESENT = 1 << 63
_PM_SWAPPED = 1 << 62
_PM_FILE = 1 << 61
# the pages of a private mapping looked at (and advised) at once: at most half as many madvise calls
# (one per run of unwritten pages holding a resident one; ~3 µs each), so a step stays a few ms
# however scattered the written rows are
DROP_WINDOW_PAGES = 4096
_dropping = True   # set_drop_pages


def set_drop_pages(enabled: bool) -> None:
    """Whether ``drop_pages`` does anything in this process (``--release-idle-s 0``: never; a switch for
    a platform whose madvise or pagemap misbehaves)."""
    global _dropping
    _dropping = enabled


def dropping_pages() -> bool:
    """Whether ``drop_pages`` may do anything in this process (``set_drop_pages``)."""
    return _dropping


_statm: tuple[int, int] | None = None   # (pid, fd) of this process's /proc/<pid>/statm


def file_resident_bytes() -> int | None:
    """The bytes of this process's resident memory that are files' pages — its mappings' pages from the
    page cache, what ``drop_pages`` can let go (``/proc/self/statm``'s shared field: RssFile plus
    RssShmem, which the daemon has none of) — or None where the system cannot tell. A pread of a
    file kept open, a few µs, so the request loop can ask it often; opened again after a fork (the
    fd names the process that opened it)."""
    global _statm
    pid = os.getpid()
    try:
        if _statm is None or _statm[0] != pid:
            if _statm is not None:
                try:
                    os.close(_statm[1])
                except OSError:
                    pass
            _statm = None
            _statm = (pid, os.open(f"/proc/{pid}/statm", os.O_RDONLY | os.O_CLOEXEC))
        fields = os.pread(_statm[1], 128, 0).split()
        return int(fields[2]) * mmap.PAGESIZE
    except (OSError, ValueError, IndexError):
        return None


def page_count(mm: mmap.mmap) -> int:
    """The pages of a mapping (the windows ``drop_pages`` takes count in them); 0 once closed."""
    try:
        return (len(mm) + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    except ValueError:
        return 0


def drop_pages(mm: mmap.mmap, private: bool, first: int = 0, count: int | None = None) -> int:
    """Let go of the process's resident pages of a file mapping (``madvise(MADV_DONTNEED)``) where they
    are the file's own — pages ``first`` to ``first + count`` (all by default): the page cache keeps
    them, so a later read maps them back without the disk, and meanwhile they are not the daemon's
    resident memory. Why: a start reads every row of the table and every slot's tables of the index
    through their mappings once (~0.6 GB at five million events), a query mix the postings it reads
    (~2 GB), and the kernel counted each page read as the daemon's RSS for as long as it lived.

    A shared mapping (``private`` False: read-only segments) holds only the file's pages. A private
    (copy-on-write) one may hold pages the process wrote — its only copy of them — so those are kept:
    the kernel's pagemap tells the two apart, and only runs of unwritten pages holding a resident one
    are advised, DROP_WINDOW_PAGES at a time. No other thread may write the mapping meanwhile (the
    request loop owns it). Returns the bytes advised (0 where the system cannot or may not: no
    madvise, no pagemap that tells the truth, ``set_drop_pages(False)``)."""
    try:
        if not _dropping or not hasattr(mm, "madvise"):
            return 0
        page, size = mmap.PAGESIZE, len(mm)   # (ValueError once closed)
        end = page_count(mm) if count is None else min(page_count(mm), first + count)
        if first >= end:
            return 0
        if not private:
            length = min(end * page, size) - first * page
            mm.madvise(mmap.MADV_DONTNEED, first * page, length)
            return length
        if not _pagemap_truthful():
            return 0
        dropped = 0
        for at in range(first, end, DROP_WINDOW_PAGES):
            for a, b in _unwritten_runs(mm, at, min(end, at + DROP_WINDOW_PAGES)):
                mm.madvise(mmap.MADV_DONTNEED, a, b - a)
                dropped += b - a
        return dropped
    except (OSError, ValueError, TypeError, AttributeError):
        return 0


def _unwritten_runs(mm: mmap.mmap, first: int, end: int) -> list[tuple[int, int]]:
    """The byte ranges of pages ``first`` to ``end`` of a private mapping that the process has not
    written (neither resident as anonymous memory nor swapped out), each holding a resident page
    (a run of pages none of which is resident has nothing to let go). Empty — nothing may be
    dropped — if the pagemap cannot be read or does not look true: the window's first page, just
    read, must read present."""
    page = mmap.PAGESIZE
    mm[first * page:first * page + 1]   # read: the pagemap must say it is present, or it cannot be believed
    flags = _page_flags(mm, first, end - first)
    if flags is None or not int(flags[0]) & _PM_PRESENT:
        return []
    present = (flags & np.uint64(_PM_PRESENT)) != 0
    written = (present & ((flags & np.uint64(_PM_FILE)) == 0)) | ((flags & np.uint64(_PM_SWAPPED)) != 0)
    cut = np.flatnonzero(written)
    starts = np.r_[0, cut + 1]
    ends = np.r_[cut, len(flags)]
    resident = np.r_[0, np.cumsum(present & ~written)]   # unwritten resident pages before each page
    keep = (ends > starts) & (resident[ends] > resident[starts])
    size = len(mm)
    return [((first + int(a)) * page, min((first + int(b)) * page, size)) for a, b in zip(starts[keep], ends[keep])]


def _page_flags(mm: mmap.mmap, first: int, n: int) -> np.ndarray | None:
    """The pagemap entries (u64) of pages ``first`` to ``first + n`` of a writable mapping, or None."""
    page = mmap.PAGESIZE
    view = ctypes.c_char.from_buffer(mm)   # the mapping's address (the export is released below)
    try:
        addr = ctypes.addressof(view)
    finally:
        del view
    try:
        fd = os.open("/proc/self/pagemap", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        raw = os.pread(fd, n * 8, (addr // page + first) * 8)
    except OSError:
        return None
    finally:
        os.close(fd)
    return np.frombuffer(raw, np.uint64) if len(raw) == n * 8 else None


@functools.lru_cache(maxsize=1)
def _pagemap_truthful() -> bool:
    """Whether this system's pagemap tells, in a private mapping of a file, a page the process wrote
    from one it only read — what drop_pages relies on: a probe file (memfd) of two pages mapped
    copy-on-write, one read (present, a file's), one written (present, not a file's). Any other
    answer, or no way to ask: never trusted. (An untouched page may read present: the kernel maps a
    read's neighbours in the page cache with it.)"""
    page = mmap.PAGESIZE
    try:
        fd = os.memfd_create("convmem-pagemap-probe", os.MFD_CLOEXEC)
    except (OSError, AttributeError):
        return False
    try:
        os.ftruncate(fd, 2 * page)
        os.pwrite(fd, b"p" * (2 * page), 0)
        probe = mmap.mmap(fd, 2 * page, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    except (OSError, ValueError):
        os.close(fd)
        return False
    try:
        probe[0:1]
        probe[page:page + 1] = b"x"
        flags = _page_flags(probe, 0, 2)
        if flags is None:
            return False
        read, written = (int(f) for f in flags)
        return (read & (_PM_PRESENT | _PM_FILE) == _PM_PRESENT | _PM_FILE
                and written & (_PM_PRESENT | _PM_FILE) == _PM_PRESENT)
    finally:
        probe.close()
        os.close(fd)


def create_private(path: str) -> int:
    """Open a new 0600 file at ``path`` for writing, removing whatever was there (a leftover of an
    interrupted write, or a planted symlink: unlinked, its target untouched)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
