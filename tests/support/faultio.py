"""Fault-injecting FileIO layers for the storage-engine tests.

``FaultIO``    raises an ``OSError`` (EIO by default) at a chosen mutating call, optionally after a
               partial write: what a failing disk does to a process that survives it.
``TrackingIO`` models what is durable: per inode the bytes as of the last ``sync`` of any fd of it,
               and the directory as of the last ``sync_dir`` plus an ordered journal of the renames,
               creations and unlinks since.  It can "kill the machine" at a chosen call (raising
               ``PowerCut``, a BaseException that no ``except OSError`` in the engine can swallow,
               after a partial write when that call is a write) and ``power_cut(rng)`` then rewrites
               the directory as a restarted machine could find it: synced bytes plus a random prefix of
               the unsynced rest (sometimes zeros or garbage), and a random prefix of the directory
               journal.
``NoSyncIO``   a TrackingIO whose ``sync`` forgets to make anything durable (once armed): the fault
               the power-cut test must be able to catch.

All three route the real work to ``FileIO`` so the store sees a real file system; ``TrackingIO``
skips the real fsync calls (durability is what its model says, not what the kernel does), which
keeps hundreds of crash runs fast.
"""
from __future__ import annotations

import errno
import os
import random

from storaged.fileio import FileIO

MUTATING = ("open_append", "open_new", "write", "sync", "truncate", "replace", "sync_dir", "remove")


class PowerCut(BaseException):
    """The machine died in the middle of an I/O call."""


# ------------------------------------------------------------------------------------------------
class FaultIO(FileIO):
    """Fails the ``fail_at``-th (0-based) mutating call whose kind is in ``kinds``.

    ``partial``: a failing ``write`` first writes a prefix of its data (``partial_bytes``, default
    half).  ``error`` is the exception raised (an ``OSError`` unless you want a crash).  ``log`` holds
    ``(index, kind, path-or-fd)`` of every counted call, so a test can enumerate the steps.
    """

    def __init__(self, fail_at: int | None = None, kinds=MUTATING, error: BaseException | None = None,
                 partial: bool = False, partial_bytes: int | None = None, repeat: bool = False) -> None:
        super().__init__()
        self.fail_at = fail_at
        self.kinds = frozenset(kinds)
        self.error = error
        self.partial = partial
        self.partial_bytes = partial_bytes
        self.repeat = repeat          # keep failing every matching call from fail_at on
        self.count = 0
        self.failures = 0
        self.log: list[tuple[int, str, object]] = []

    def arm(self, fail_at: int | None, kinds=None) -> None:
        """Count from zero again and fail the ``fail_at``-th matching call from now."""
        self.fail_at = fail_at
        if kinds is not None:
            self.kinds = frozenset(kinds)
        self.count = 0
        self.log = []

    def _hit(self, kind: str, what: object) -> bool:
        if kind not in self.kinds:
            return False
        index = self.count
        self.count += 1
        self.log.append((index, kind, what))
        if self.fail_at is None:
            return False
        return index == self.fail_at or (self.repeat and index >= self.fail_at)

    def _raise(self) -> None:
        self.failures += 1
        raise (self.error if self.error is not None else OSError(errno.EIO, "injected I/O error"))

    def open_append(self, path, create=True):
        if self._hit("open_append", path):
            self._raise()
        return super().open_append(path, create)

    def open_new(self, path):
        if self._hit("open_new", path):
            self._raise()
        return super().open_new(path)

    def write(self, fd, data):
        if self._hit("write", fd):
            if self.partial and len(data) > 1:
                n = self.partial_bytes if self.partial_bytes is not None else len(data) // 2
                super().write(fd, bytes(data[:n]))
            self._raise()
        super().write(fd, data)

    def sync(self, fd):
        if self._hit("sync", fd):
            self._raise()
        super().sync(fd)

    def truncate(self, fd, size):
        if self._hit("truncate", fd):
            self._raise()
        super().truncate(fd, size)

    def replace(self, src, dst):
        if self._hit("replace", (src, dst)):
            self._raise()
        super().replace(src, dst)

    def sync_dir(self, path):
        if self._hit("sync_dir", path):
            self._raise()
        super().sync_dir(path)

    def remove(self, path):
        if self._hit("remove", path):
            self._raise()
        super().remove(path)


# ------------------------------------------------------------------------------------------------
class _Inode:
    __slots__ = ("data", "durable")

    def __init__(self, data: bytes = b"", durable: bytes = b"") -> None:
        self.data = bytearray(data)   # what the page cache holds now
        self.durable = bytes(durable)  # what survives a power cut for sure


class TrackingIO(FileIO):
    """A FileIO that knows what a power cut would keep. Works on one flat directory ``root``."""

    def __init__(self, root: str, crash_at: int | None = None, rng: random.Random | None = None) -> None:
        super().__init__()
        self.root = os.path.abspath(root)
        self.rng = rng or random.Random(0)
        self.crash_at = crash_at      # die at this (0-based) mutating call; None: never
        self.calls = 0
        self.dead = False
        self.ns: dict[str, _Inode] = {}          # names now
        self.durable_ns: dict[str, _Inode] = {}  # names as of the last sync_dir
        self.journal: list[tuple] = []           # directory operations since, in order
        self.fds: dict[int, _Inode] = {}
        os.makedirs(self.root, exist_ok=True)
        for name in os.listdir(self.root):       # whatever is there already is durable
            path = os.path.join(self.root, name)
            if os.path.isfile(path):
                with open(path, "rb") as f:
                    data = f.read()
                self.ns[name] = self.durable_ns[name] = _Inode(data, data)

    # -- bookkeeping --
    def _name(self, path: str) -> str:
        path = os.path.abspath(path)
        assert os.path.dirname(path) == self.root, f"TrackingIO only models {self.root}, not {path}"
        return os.path.basename(path)

    def _tick(self) -> bool:
        """Count a mutating call; True if the machine dies during this one."""
        if self.dead:
            raise PowerCut("the machine is off")
        index = self.calls
        self.calls += 1
        if self.crash_at is not None and index >= self.crash_at:
            self.dead = True
            return True
        return False

    def _die(self):
        raise PowerCut(f"power cut at call {self.calls - 1}")

    def _sync_model(self, inode: _Inode) -> None:
        inode.durable = bytes(inode.data)

    # -- the FileIO interface --
    def open_append(self, path, create=True):
        if self._tick():
            self._die()
        fd = super().open_append(path, create)
        name = self._name(path)
        if name not in self.ns:
            inode = _Inode()
            self.ns[name] = inode
            self.journal.append(("create", name, inode))
        self.fds[fd] = self.ns[name]
        return fd

    def open_new(self, path):
        if self._tick():
            self._die()
        fd = super().open_new(path)
        name = self._name(path)
        inode = self.ns.get(name)
        if inode is None:
            inode = self.ns[name] = _Inode()
            self.journal.append(("create", name, inode))
        else:
            del inode.data[:]  # O_TRUNC
        self.fds[fd] = inode
        return fd

    def write(self, fd, data):
        inode = self.fds[fd]
        if self._tick():
            n = self.rng.randint(0, len(data))
            if n:
                FileIO.write(self, fd, bytes(data[:n]))
                inode.data += bytes(data[:n])
            self._die()
        super().write(fd, data)
        inode.data += bytes(data)

    def sync(self, fd):
        if self._tick():
            self._die()
        self.counters.flush_calls += 1
        self._sync_model(self.fds[fd])

    def truncate(self, fd, size):
        if self._tick():
            self._die()
        super().truncate(fd, size)
        del self.fds[fd].data[size:]

    def replace(self, src, dst):
        if self._tick():
            self._die()
        super().replace(src, dst)
        s, d = self._name(src), self._name(dst)
        self.ns[d] = self.ns.pop(s)
        self.journal.append(("rename", s, d))

    def sync_dir(self, path):
        if self._tick():
            self._die()
        assert os.path.abspath(path) == self.root
        self.counters.flush_calls += 1
        self.durable_ns = dict(self.ns)
        self.journal.clear()

    def remove(self, path):
        if self._tick():
            self._die()
        super().remove(path)
        name = self._name(path)
        if self.ns.pop(name, None) is not None:
            self.journal.append(("unlink", name))

    def close(self, fd):
        self.fds.pop(fd, None)
        os.close(fd)

    # -- the power cut --
    def _after_cut(self, inode: _Inode, rng: random.Random) -> bytes:
        durable, now = inode.durable, bytes(inode.data)
        if not now.startswith(durable):
            # cut back or rewritten since the last sync: the old bytes or the new ones
            return rng.choice([durable, now])
        rest = now[len(durable):]
        n = rng.randint(0, len(rest))
        if n == 0:
            return durable
        roll = rng.random()
        if roll < 0.2:    # the end of what reached the disk reads back as zeros
            keep = rng.randint(0, n)
            piece = rest[:keep] + bytes(n - keep)
        elif roll < 0.35:  # ... or as garbage
            keep = rng.randint(0, n)
            piece = rest[:keep] + rng.randbytes(n - keep)
        else:
            piece = rest[:n]
        return durable + piece

    def power_cut(self, rng: random.Random | None = None) -> dict[str, bytes]:
        """Rewrite the directory as the machine would find it after losing power now. Returns it."""
        rng = rng or self.rng
        self.dead = True
        for fd in list(self.fds):
            try:
                os.close(fd)
            except OSError:
                pass
        self.fds.clear()
        names = dict(self.durable_ns)
        for op in self.journal[:rng.randint(0, len(self.journal))]:  # the journal keeps its order
            if op[0] == "create":
                names[op[1]] = op[2]
            elif op[0] == "rename":
                if op[1] in names:
                    names[op[2]] = names.pop(op[1])
            elif op[0] == "unlink":
                names.pop(op[1], None)
        disk = {name: self._after_cut(inode, rng) for name, inode in names.items()}
        for name in os.listdir(self.root):
            path = os.path.join(self.root, name)
            if os.path.isfile(path):
                os.unlink(path)
        for name, data in disk.items():
            with open(os.path.join(self.root, name), "wb") as f:
                f.write(data)
        return disk


class NoSyncIO(TrackingIO):
    """``sync`` makes nothing durable once ``armed`` (the store's creation may still be synced)."""

    armed = False

    def sync(self, fd):
        if not self.armed:
            return super().sync(fd)
        if self._tick():
            self._die()
        self.counters.flush_calls += 1


# ------------------------------------------------------------------------------------------------
# Small store helpers shared by the storage tests (validated arguments, as the daemon calls it).
def rid() -> str:
    from ulid import ULID
    return str(ULID())


def write(store, session_id="s", content="hello", role="user", request_id=None, **metadata):
    from protocol.validation import validate
    args = {"session_id": session_id, "role": role, "content": content}
    if metadata:
        import json
        args["metadata_json"] = json.dumps(metadata)
    return store.write_message(validate("write_message", args), request_id or rid())


def update(store, message_id, content=None, request_id=None, expected_revision=None, **metadata):
    from protocol.validation import validate
    args = {"message_id": message_id}
    if content is not None:
        args["content"] = content
    if metadata:
        import json
        args["metadata_json"] = json.dumps(metadata)
    if expected_revision is not None:
        args["expected_revision"] = expected_revision
    return store.update_message(validate("update_message", args), request_id or rid())


def delete(store, message_id, session_id=None, request_id=None):
    from protocol.validation import validate
    args = {"message_id": message_id}
    if session_id is not None:
        args["session_id"] = session_id
    return store.delete_message(validate("delete_message", args), request_id or rid())


def read(store, **args):
    from protocol.validation import validate
    from storaged import views
    return views.read_messages(store, validate("read_messages", args))


def search(store, **args):
    from protocol.validation import validate
    from storaged import views
    return views.search_messages(store, validate("search_messages", args))


def live_state(store) -> dict:
    """Every live message as the contract shows it, by id."""
    return {mid: m.to_dict() for mid, m in store.by_id.items()}


def full_history(store) -> dict:
    """Every session's complete history, read through the history view with its cursors."""
    out = {}
    for sid in sorted(store.sessions):
        items, cur = [], None
        while True:
            args = {"session_id": sid, "limit": 7}
            if cur:
                args["cursor"] = cur
            page = read(store, **args)
            items += page["history"]
            cur = page.get("nextCursor")
            if not cur:
                break
        out[sid] = items
    return out


STATE_FIGURES = ("format_version", "log_size", "active_messages", "session_count", "deleted_messages",
                 "last_sequence", "update_records", "dead_bytes", "last_error", "status")
