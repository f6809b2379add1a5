"""Letting go of the resident pages of the store's file mappings (fileio.drop_pages, Store.release_pages,
Store.release_pages_step): the process's RSS loses them, the page cache keeps them, and nothing the
process wrote into a copy-on-write mapping — its only copy of a row changed since the snapshot — is
ever dropped with them."""
from __future__ import annotations

import gc
import mmap
import os

import pytest

from storaged.fileio import drop_pages, map_private
from storaged.store import Store
from tests.support.faultio import live_state, search, update, write

PAGE = mmap.PAGESIZE


def _resident_kib(path: str) -> int:
    """KiB of this process's mappings of ``path`` resident in memory (/proc/self/smaps)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(None, 5)
            if head and "-" in head[0] and ":" not in head[0]:
                inside = len(head) == 6 and head[5].strip().removesuffix(" (deleted)") == path
            elif inside and head[0] == "Rss:":
                total += int(head[1])
    return total


def _store_files_kib(d: str) -> dict[str, int]:
    return {name: _resident_kib(os.path.join(d, name)) for name in os.listdir(d) if name.endswith(".seg")}


needs_pagemap = pytest.mark.skipif(not os.path.exists("/proc/self/pagemap"), reason="Linux's pagemap")


@needs_pagemap
def test_a_private_mapping_keeps_the_pages_it_wrote_and_lets_the_rest_go(tmp_path):
    path = str(tmp_path / "f")
    data = os.urandom(64 * PAGE)
    with open(path, "wb") as f:
        f.write(data)
    st = os.stat(path)
    mm, at = map_private(path, 0, len(data), (st.st_dev, st.st_ino, st.st_size))
    assert at == 0
    assert bytes(mm) == data  # every page read: resident
    assert _resident_kib(path) >= 60 * PAGE // 1024
    for page in (0, 3, 40, 63):   # written: the process's own copies, the file unchanged
        mm[page * PAGE + 7:page * PAGE + 12] = b"write"
    assert drop_pages(mm, private=True) > 0
    assert _resident_kib(path) <= 4 * PAGE // 1024   # only the four written pages stay
    expect = bytearray(data)
    for page in (0, 3, 40, 63):
        expect[page * PAGE + 7:page * PAGE + 12] = b"write"
    assert bytes(mm) == bytes(expect)   # the written bytes kept, the rest read back from the file
    with open(path, "rb") as f:
        assert f.read() == data
    mm.close()


@needs_pagemap
def test_a_pagemap_that_reports_no_flags_drops_nothing_of_a_private_mapping(tmp_path, monkeypatch):
    """A kernel or sandbox whose pagemap reads all zeros would make every written page look like the
    file's: nothing is dropped then (the written rows would be lost)."""
    import numpy as np
    from storaged import fileio
    path = str(tmp_path / "f")
    data = os.urandom(16 * PAGE)
    with open(path, "wb") as f:
        f.write(data)
    st = os.stat(path)
    mm, _ = map_private(path, 0, len(data), (st.st_dev, st.st_ino, st.st_size))
    assert bytes(mm) == data
    mm[5 * PAGE:5 * PAGE + 5] = b"write"
    monkeypatch.setattr(fileio, "_page_flags", lambda m, first, n: np.zeros(n, np.uint64))
    fileio._pagemap_truthful.cache_clear()
    try:
        assert drop_pages(mm, private=True) == 0
        assert _resident_kib(path) >= 15 * PAGE // 1024
        assert mm[5 * PAGE:5 * PAGE + 5] == b"write"
    finally:
        monkeypatch.undo()
        fileio._pagemap_truthful.cache_clear()
    assert drop_pages(mm, private=True) > 0 and mm[5 * PAGE:5 * PAGE + 5] == b"write"
    mm.close()


def _private_written(tmp_path, pages: int = 16, written: tuple = (5,)):
    path = str(tmp_path / "f")
    data = os.urandom(pages * PAGE)
    with open(path, "wb") as f:
        f.write(data)
    st = os.stat(path)
    mm, _ = map_private(path, 0, len(data), (st.st_dev, st.st_ino, st.st_size))
    assert bytes(mm) == data
    for page in written:
        mm[page * PAGE:page * PAGE + 5] = b"write"
    return path, mm


@needs_pagemap
@pytest.mark.parametrize("lie", ["every page a file's", "the probe true, the mapping all zeros"])
def test_a_pagemap_that_lies_drops_nothing_of_a_private_mapping(tmp_path, monkeypatch, lie):
    """A pagemap that calls every page a file's (only the probe of a written private page catches it),
    or that tells the probe the truth and the mapping nothing (the window's first page, just read, reads
    not present; and no page reads resident): nothing is dropped."""
    import numpy as np
    from storaged import fileio
    path, mm = _private_written(tmp_path)
    real = fileio._page_flags
    if lie == "every page a file's":
        fake = lambda m, first, n: np.full(n, fileio._PM_PRESENT | fileio._PM_FILE, np.uint64)  # noqa: E731
    else:
        fake = lambda m, first, n: real(m, first, n) if m is not mm else np.zeros(n, np.uint64)  # noqa: E731
    monkeypatch.setattr(fileio, "_page_flags", fake)
    fileio._pagemap_truthful.cache_clear()
    try:
        assert drop_pages(mm, private=True) == 0
        assert mm[5 * PAGE:5 * PAGE + 5] == b"write" and _resident_kib(path) >= 15 * PAGE // 1024
    finally:
        monkeypatch.undo()
        fileio._pagemap_truthful.cache_clear()
    mm.close()


def test_the_runs_let_go_skip_written_and_swapped_pages_and_runs_with_nothing_resident(monkeypatch):
    import numpy as np
    from storaged import fileio
    P, F, S = fileio._PM_PRESENT, fileio._PM_FILE, fileio._PM_SWAPPED
    #        0      1  2      3  4  5  6  7  8
    flags = [P | F, S, P | F, 0, P, 0, 0, P, P | F]   # 1 swapped, 4 and 7 written; 5-6 nothing resident
    monkeypatch.setattr(fileio, "_page_flags", lambda m, first, n: np.asarray(flags[first:first + n], np.uint64))
    mm = mmap.mmap(-1, 9 * PAGE, flags=mmap.MAP_PRIVATE)
    assert fileio._unwritten_runs(mm, 0, 9) == [(0, PAGE), (2 * PAGE, 4 * PAGE), (8 * PAGE, 9 * PAGE)]
    assert fileio._unwritten_runs(mm, 5, 7) == []   # (its first page must read present)
    mm.close()


def test_a_shared_read_only_mapping_lets_every_page_go(tmp_path):
    path = str(tmp_path / "f")
    data = os.urandom(32 * PAGE)
    with open(path, "wb") as f:
        f.write(data)
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    assert bytes(mm) == data
    assert drop_pages(mm, private=False) == len(data)
    assert _resident_kib(path) == 0
    assert bytes(mm) == data
    mm.close()


def _big_store(d: str, n: int = 12_000) -> list[str]:
    """A store whose snapshot maps a rows segment and index segments of a few MB each."""
    store = Store.open(d)
    ids = [write(store, f"s{i % 40}", f"note {i} about word{i % 997} and topic{i % 31} " + "x" * (i % 50),
                 importance=1 + i % 3)["message"]["message_id"] for i in range(n)]
    assert store.search.doc_count() == n   # (indexed: the snapshot writes the index as a segment)
    assert store.write_snapshot()
    store.close()
    del store
    gc.collect()   # (this process's writing store maps the segment too, until it is collected)
    return ids


@needs_pagemap
def test_a_start_leaves_none_of_its_files_pages_resident_and_a_changed_row_survives_a_release(tmp_path):
    d = str(tmp_path / "data")
    ids = _big_store(d)
    store = Store.open(d)
    try:
        sizes = {name: os.path.getsize(os.path.join(d, name)) for name in os.listdir(d) if name.endswith(".seg")}
        # (a file under 1 MB is read, not mapped: nothing to see)
        assert all(max(n for k, n in sizes.items() if k.startswith(kind)) > 1 << 20 for kind in ("rows.", "index."))
        # the start read every row and every slot's tables through the mappings, and let them go
        assert sum(_store_files_kib(d).values()) <= 64, _store_files_kib(d)
        before = live_state(store)
        assert search(store, query="word7 topic3", limit=5)["results"]
        # a row of the mapped base changed: the process's own copy of its page
        update(store, ids[5], content="changed after the snapshot", importance=3)
        update(store, ids[-1], tags=["late"])
        resident = sum(_store_files_kib(d).values())
        assert resident > 0
        assert store.release_pages() > 0
        assert sum(_store_files_kib(d).values()) < resident
        after = live_state(store)
        assert after[ids[5]]["content"] == "changed after the snapshot" and after[ids[5]]["metadata"]["importance"] == 3
        assert after[ids[-1]]["metadata"]["tags"] == ["late"]
        expect = dict(before)
        expect[ids[5]], expect[ids[-1]] = after[ids[5]], after[ids[-1]]
        assert after == expect   # every other row read back from the file as it was
        hits = search(store, query="changed after the snapshot", limit=3)["results"]
        assert hits and hits[0]["message_id"] == ids[5]
    finally:
        store.close()


@needs_pagemap
def test_release_pages_step_goes_round_every_mapping_one_a_step(tmp_path, monkeypatch):
    from storaged import fileio
    d = str(tmp_path / "data")
    _big_store(d)
    store = Store.open(d)
    try:
        from storaged import store as store_module
        monkeypatch.setattr(store_module, "DROP_WINDOW_PAGES", 64)   # the rows' pages 64 a step
        monkeypatch.setattr(fileio, "DROP_WINDOW_PAGES", 16)   # looked at 16 at a time
        assert store.index_segments()[0] >= 1
        segment_windows = sum(-(-pages // 64) for _, pages in store._index.segment_releasers())
        windows = sum(-(-fileio.page_count(mm) // 64) for mm, _ in store.table.mappings())
        assert windows > 2
        n_segments = segment_windows   # (each segment a window at a time too)
        for _ in range(3):
            assert search(store, query="word9 topic4 note", limit=10)["results"]
            live_state(store)   # every row read through the table's mapping
            assert sum(_store_files_kib(d).values()) > 0
            steps = 1
            while store.release_pages_step():
                steps += 1
            assert steps == n_segments + windows   # each segment, then the table, a window at a time
            assert sum(_store_files_kib(d).values()) <= 64
        live_state(store)
        store.release_pages_step()
        store.release_pages_restart()   # (a request came: the round starts over)
        steps = 1
        while store.release_pages_step():
            steps += 1
        assert steps == n_segments + windows and sum(_store_files_kib(d).values()) <= 64
    finally:
        store.close()


@needs_pagemap
def test_a_rebuild_lets_the_pages_its_install_read_go_in_release_steps(tmp_path):
    from storaged import compaction
    d = str(tmp_path / "data")
    _big_store(d)
    store = Store.open(d)
    try:
        before = live_state(store)
        compaction.install(store, compaction.prepare(store))
        new = store.search
        steps = 0
        while new._retired:
            new.release_step()
            steps += 1
        assert steps >= 2
        index_kib = {n: kib for n, kib in _store_files_kib(d).items() if n.startswith("index.")}
        assert index_kib and sum(index_kib.values()) <= 64, index_kib
        assert live_state(store) == before
        assert search(store, query="word7 topic3", limit=5)["results"]
    finally:
        store.close()


def _read_everything(store: Store, d: str) -> int:
    """Search and read every row, so the mappings hold resident pages; KiB of the store's files resident."""
    for q in ("word9 topic4 note", "word11 topic7", "note about"):
        assert search(store, query=q, limit=10)["results"]
    live_state(store)
    resident = sum(_store_files_kib(d).values())
    assert resident > 64
    return resident


@needs_pagemap
def test_release_pages_while_steps_on_from_where_it_stopped_until_told_enough(tmp_path, monkeypatch):
    """Store.release_pages_while: one window (CAP_WINDOW_PAGES) a step; stopped by the deadline it goes on
    at the next call from where it stopped (a request does not restart it); stopped by ``more()`` at
    once; a whole round lets every page go and says there is nothing more."""
    import time

    from storaged import store as store_module
    d = str(tmp_path / "data")
    _big_store(d)
    store = Store.open(d)
    try:
        monkeypatch.setattr(store_module, "CAP_WINDOW_PAGES", 64)
        _read_everything(store, d)
        assert store.release_pages_while(lambda: True, time.monotonic() - 1)   # the deadline: one step
        assert store._cap_at == (0, 64)
        store.release_pages_restart()   # (what a request does to the resting round: not this one)
        asked = []

        def three_more() -> bool:
            asked.append(1)
            return len(asked) <= 3

        assert store.release_pages_while(three_more, time.monotonic() + 60)
        assert len(asked) == 4
        from storaged.fileio import page_count
        pages = [n for _, n in store._index.segment_releasers()] + [page_count(mm) for mm, _ in store.table.mappings()]
        pages = [n for n in pages if n]
        i, page = 0, 64
        for _ in range(3):   # three windows on from the first
            page += 64
            if page >= pages[i]:
                i, page = (i + 1) % len(pages), 0
        at = store._cap_at
        assert at == (i, page)
        assert not store.release_pages_while(lambda: True, time.monotonic() + 60)   # a whole round
        assert store._cap_at == at   # (round from where it stood, back to it)
        assert sum(_store_files_kib(d).values()) <= 64
    finally:
        store.close()


@needs_pagemap
def test_the_loop_keeps_the_mapped_pages_under_its_cap_while_requests_come(tmp_path):
    """Server._cap_mapped, after each batch: under the cap nothing is let go; over it, the store's
    pages go (down to half the cap, here below what the process's own code keeps, so all of them)
    and, with the process still over the cap, it waits MAPPED_BACKOFF_S before it looks again."""
    import time

    from storaged import fileio
    from storaged.server import MAPPED_BACKOFF_S, Server
    d = str(tmp_path / "data")
    _big_store(d)
    store = Store.open(d)
    server = Server(store, "inproc://convmem-mapped-cap")
    try:
        resident = _read_everything(store, d)
        total = fileio.file_resident_bytes()
        assert total is not None and total >= resident << 10
        server.mapped_resident_cap = total + (64 << 20)   # well over: nothing to do
        server._cap_mapped()
        assert not server._mapped_over and sum(_store_files_kib(d).values()) == resident
        server._mapped_next = 0.0
        server.mapped_resident_cap = total - (resident << 9)   # half the store's pages over it
        turns = 0
        while True:
            server._cap_mapped()
            turns += 1
            if not server._mapped_over:
                break
            assert turns < 10_000
        assert sum(_store_files_kib(d).values()) <= 64
        assert fileio.file_resident_bytes() < server.mapped_resident_cap
        looks_next = server._mapped_next
        server.mapped_resident_cap = 1 << 20   # below what no one may let go: it backs off
        server._mapped_next = 0.0
        t0 = time.monotonic()
        server._cap_mapped()
        assert not server._mapped_over and server._mapped_next >= t0 + MAPPED_BACKOFF_S - 0.01
        assert looks_next < server._mapped_next
    finally:
        server.close()
        store.close()
