"""Big files are freed a cut at a time (``FileIO.release``, ``release_fd``): the old log after a
rebuild's move, the snapshot a rebuild replaces, index segments nothing names. Freeing a big file's
blocks at once holds the file system's journal, and every fdatasync of the request loop waited for it.
Seen from outside: a descriptor opened on the file before shows its size fall in cuts to 0 while the
name is already gone; what the store shows never changes.

And big files are written paced (``fileio.Paced``): pushed to the disk every PACE_BYTES, so that their
final fsync does not flush them in one go while the loop's fdatasyncs wait."""
from __future__ import annotations

import os
import time

import pytest

from tests.support.faultio import live_state, write
from storaged import compaction, fileio, layout
from storaged.fileio import PACE_BYTES, FileIO
from storaged.store import Store

pytestmark = pytest.mark.timeout(60)


def _sizes_until_empty(fd: int, timeout: float = 30.0) -> list[int]:
    """The distinct sizes the file at ``fd`` shows until it is empty."""
    seen: list[int] = []
    deadline = time.monotonic() + timeout
    while True:
        size = os.fstat(fd).st_size
        if not seen or seen[-1] != size:
            seen.append(size)
        if size == 0:
            return seen
        assert time.monotonic() < deadline, f"not released: sizes seen {seen}"
        time.sleep(0.002)


def test_a_released_file_loses_its_name_at_once_and_its_blocks_in_cuts(tmp_path, monkeypatch):
    monkeypatch.setattr(fileio, "RELEASE_STEP_BYTES", 1 << 20)
    monkeypatch.setattr(fileio, "RELEASE_PAUSE_S", 0.05)
    path = str(tmp_path / "big")
    with open(path, "wb") as f:
        f.write(os.urandom(5 << 20))
    watch = os.open(path, os.O_RDONLY)
    try:
        FileIO().release(path)
        assert not os.path.exists(path)
        sizes = _sizes_until_empty(watch)
    finally:
        os.close(watch)
    assert sizes[-1] == 0
    assert any(0 < s < 5 << 20 and s % (1 << 20) == 0 for s in sizes), sizes  # cut, not dropped whole
    FileIO().release(str(tmp_path / "absent"))  # nothing there: nothing to do


def test_a_rebuild_releases_the_old_log_and_snapshot_and_the_segments_it_replaced(tmp_path):
    d = str(tmp_path / "data")
    store = Store.open(d)
    for i in range(400):
        write(store, f"s{i % 4}", f"released text {i} " * 40)
    store.index_step(None)  # indexed, so that the snapshot writes a segment
    assert store.write_snapshot()  # a snapshot and a segment for the rebuild to replace
    segments = [n for n in os.listdir(d) if n.endswith(layout.SEGMENT_SUFFIX)]
    assert segments
    watched = {name: os.open(os.path.join(d, name), os.O_RDONLY) for name in [layout.LOG, layout.SNAPSHOT, *segments]}
    try:
        state = live_state(store)
        compaction.install(store, compaction.prepare(store), background=True)
        assert not set(segments) & set(os.listdir(d))  # their names are gone at once
        while store.relocate_step(50):
            assert os.fstat(watched[layout.LOG]).st_size > 0  # messages still read the old log
        for name, fd in watched.items():
            assert _sizes_until_empty(fd)[-1] == 0, name
        assert live_state(store) == state
    finally:
        for fd in watched.values():
            os.close(fd)
    store.close()
    again = Store.open(d)
    assert live_state(again) == state
    again.close()


class RecordingIO(FileIO):
    """The real file layer, which also notes the ranges it pushed to the disk, by file."""

    def __init__(self) -> None:
        super().__init__()
        self.paths: dict[int, str] = {}
        self.pushed: dict[str, list[tuple[int, int]]] = {}

    def open_new(self, path: str) -> int:
        fd = super().open_new(path)
        self.paths[fd] = os.path.basename(path)
        return fd

    def writeback(self, fd: int, offset: int, nbytes: int) -> None:
        super().writeback(fd, offset, nbytes)
        self.pushed.setdefault(self.paths.get(fd, "?"), []).append((offset, nbytes))


def test_a_rebuild_pushes_its_files_to_the_disk_as_it_writes(tmp_path):
    d = str(tmp_path / "data")
    io = RecordingIO()
    store = Store.open(d, io=io)
    for i in range(600):
        write(store, f"s{i % 4}", f"paced text {i} " + os.urandom(3000).hex())
    store.index_step(None)
    compaction.install(store, compaction.prepare(store))
    store.relocate_step(None)
    state = live_state(store)
    store.close()
    segment = next(n for n in os.listdir(d) if n.startswith(layout.SEGMENT_PREFIX))
    rows = next(n for n in os.listdir(d) if n.startswith(layout.ROWS_PREFIX))
    assert {"log.compact", segment} <= set(io.pushed), io.pushed
    for name, final in (("log.compact", "log"), (segment, segment), (rows, rows), ("snapshot.tmp", "snapshot")):
        ranges, size = io.pushed.get(name, []), os.path.getsize(os.path.join(d, final))
        # contiguous from the start, PACE_BYTES or more each, the whole file but its last piece
        assert not ranges or ranges[0][0] == 0 and all(a + n == b for (a, n), (b, _) in zip(ranges, ranges[1:]))
        assert all(n >= PACE_BYTES for _, n in ranges) and size - PACE_BYTES < sum(n for _, n in ranges) <= size
    again = Store.open(d)
    assert live_state(again) == state
    again.close()
