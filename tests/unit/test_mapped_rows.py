"""A base row segment's rows are mapped copy-on-write as the message table's first rows (columns.py
``MessageTable._map_base``), not copied: what the table answers is what a replay of the log builds,
through updates and deletes of mapped rows, new rows past them, snapshots and compaction; the segment
file never changes; a base holds the seqs deleted between its live ones as dead rows, so that it lies
as the rows do; one that cannot be mapped as it lies (mostly deleted, a file that is not the one read)
is copied as before."""
from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest

from storaged.columns import ROW_DTYPE
from storaged.store import Store
from tests.support.faultio import delete, live_state, update, write
from tests.support.replayed import opened, replay_copy

pytestmark = pytest.mark.unit


def _digests(d: str) -> dict[str, str]:
    return {n: hashlib.sha256(open(os.path.join(d, n), "rb").read()).hexdigest()
            for n in os.listdir(d) if n.startswith("rows.")}


def _replayed(d: str, tmp_path) -> dict:
    s = Store.open(replay_copy(d, str(tmp_path / "replayed")))
    try:
        return live_state(s)
    finally:
        s.close()


def _store(tmp_path, n: int = 300, delete_one: bool = False) -> tuple[str, list[str]]:
    d = str(tmp_path / "d")
    s = Store.open(d)
    ids = [write(s, f"s{i % 7}", f"message {i} about the mapped rows",
                 **({"summary": f"sum {i}"} if i % 11 == 0 else {}))["message"]["message_id"] for i in range(n)]
    if delete_one:
        delete(s, ids[n // 2])
    assert s.write_snapshot()
    s.close()
    return d, ids


def test_a_base_is_mapped_and_reads_as_a_replay(tmp_path):
    d, ids = _store(tmp_path)
    s = Store.open(d)
    try:
        t = s.table
        assert t.nbase == len(t.etype) and t._base_map is not None and len(t.rows) == 0
        assert not t.base_keys.flags.writeable and not t.base_key_seqs.flags.writeable   # the id keys mapped too
        assert live_state(s) == _replayed(d, tmp_path)
        seqs = t.live_seqs()
        assert (t.column("ts", seqs) == np.array([t.timestamp(q) for q in seqs.tolist()])).all()
        assert [t.importance(q) for q in seqs.tolist()] == [t.get(q).importance for q in seqs.tolist()]
    finally:
        s.close()


def test_changes_to_mapped_rows_stand_and_the_file_never_changes(tmp_path):
    d, ids = _store(tmp_path)
    before = _digests(d)
    s = Store.open(d)
    try:
        nbase = s.table.nbase
        update(s, ids[3], content="an update of a mapped row", importance=90)
        update(s, ids[200], tags=["moved"])
        delete(s, ids[10])
        new = [write(s, "s-new", f"a row past the base {i}")["message"]["message_id"] for i in range(50)]
        update(s, new[0], content="and an update past it")
        assert s.table.nbase == nbase and len(s.table.rows) > 0
        assert _digests(d) == before   # copy on write: the segment's bytes are untouched
        # a gather across both parts
        seqs = s.table.live_seqs()
        assert seqs[0] < nbase <= seqs[-1]
        rows = s.table._gather(seqs)
        assert (rows["ts"] == np.array([s.table.timestamp(q) for q in seqs.tolist()])).all()
        assert rows.dtype == ROW_DTYPE
        for run in (np.arange(nbase - 5, nbase + 5), np.arange(2, 9), np.arange(nbase + 1, nbase + 20)):
            assert (s.table.column("ts", run) == np.array([s.table.timestamp(q) for q in run.tolist()])).all()
            assert (s.table._gather(run) == np.concatenate([s.table._gather(run[:1]), s.table._gather(run[1:])])).all()
        got = live_state(s)
        assert got[ids[3]]["content"] == "an update of a mapped row" and ids[10] not in got
        assert s.write_snapshot()   # a delta of rows from both parts
        s.close()
        s = Store.open(d)
        assert live_state(s) == got == _replayed(d, tmp_path)
    finally:
        s.close()


def test_a_compaction_rewrites_every_mapped_row(tmp_path):
    from storaged import compaction

    d, ids = _store(tmp_path)
    before = _digests(d)
    s = Store.open(d)
    try:
        assert s.table.nbase
        for mid in ids[::3]:
            update(s, mid, content="rewritten " * 5)
        expected = live_state(s)
        assert compaction.rebuild(s)["status"] == "OK"
        assert s.table.nbase and s.relocation
        while s.relocate_step(4096):   # every message moved to the new log: each mapped row written
            pass
        assert live_state(s) == expected
        assert all(os.path.exists(os.path.join(d, n)) is False or _digests(d)[n] == h for n, h in before.items())
        s.close()
        s = Store.open(d)
        assert live_state(s) == expected == _replayed(d, tmp_path)
    finally:
        s.close()


def test_a_compaction_of_a_store_that_deleted_writes_a_base_the_next_start_maps(tmp_path):
    """A rebuild drops the deleted messages' records, not their seqs: its base holds them as dead rows,
    and the start after it maps the rows (with the manifest's count and the store's own after the
    install both counting them, so the snapshots after it are used too)."""
    from storaged import compaction

    d, ids = _store(tmp_path)
    with opened(d) as s:
        for mid in ids[10:60:5]:
            delete(s, mid)
        expected = live_state(s)
        assert compaction.rebuild(s)["status"] == "OK"
        while s.relocate_step(4096):
            pass
        assert s.row_segments[0][1] == 301   # (seqs 0 to 300: 0, never used, and ten of them dead)
        write(s, "s-after", "after the rebuild")
        assert s.write_snapshot()   # a delta after the rebuild's base
        expected = live_state(s)
    with opened(d) as s:
        assert s.snapshot_valid and s.scan_result.records == 0
        assert s.table._base_map is not None and live_state(s) == expected


def test_a_base_with_a_gap_lies_as_the_rows_do_and_is_mapped(tmp_path):
    """A message deleted between live ones: the base holds its seq as a dead row of zeros, so a start
    maps it as it maps any base (it used to copy every row to the heap), and reads as a replay."""
    d, ids = _store(tmp_path, delete_one=True)
    with opened(d) as s:
        t = s.table
        assert t.nbase == len(t.etype) and t._base_map is not None and len(t.rows) == 0
        assert t.count == 299 and t.seq_of(ids[150]) is None
        dead = int(np.flatnonzero(np.frombuffer(t.etype, np.uint8) == 0)[-1])   # (seq 0 is never used)
        assert not any(bytes(t.base[dead * ROW_DTYPE.itemsize:(dead + 1) * ROW_DTYPE.itemsize]))
        assert live_state(s) == _replayed(d, tmp_path)
        delete(s, ids[20])
        write(s, "s-late", "after the start")
        assert s.write_snapshot()   # (a delta after the base)
        state = live_state(s)
    with opened(d) as s:
        assert s.table._base_map is not None and live_state(s) == state


def test_a_base_mostly_deleted_lists_its_live_rows_and_is_copied(tmp_path):
    """More dead seqs than live ones between the first and the last (BASE_HOLES_MAX): the base holds
    the live rows only, as ever, and a start copies them."""
    d = str(tmp_path / "d")
    s = Store.open(d)
    ids = [write(s, "s", f"message {i}")["message"]["message_id"] for i in range(60)]
    for mid in ids[1:40]:
        delete(s, mid)
    assert s.table.live_span() is None and s.table.base_rows() == 21
    assert s.write_snapshot()
    s.close()
    with opened(d) as s:
        assert s.table.nbase == 0 and s.table._base_map is None and s.table.count == 21
        assert live_state(s) == _replayed(d, tmp_path)


def test_a_file_that_is_not_the_one_read_is_not_mapped(tmp_path):
    d, _ = _store(tmp_path)
    s = Store.open(d)
    try:
        path, identity, offsets = next(iter(_rows_files(d)))
        t = s.table
        assert not t._map_base((path, (identity[0], identity[1] + 1, identity[2]), offsets), 0, 1)
        assert not t._map_base((path, identity, offsets), 10 ** 9, 10 ** 9 + 1)   # rows before the file's start
        assert not t._map_base(None, 0, 1)
    finally:
        s.close()


def _rows_files(d: str):
    from storaged import snapshot
    from storaged.fileio import FileIO
    with snapshot.Reader(FileIO(), os.path.join(d, "snapshot")) as r:
        for seg in r.segments:
            yield seg.columns["file"]


def test_a_mapped_base_no_longer_named_is_unlinked_not_cut(tmp_path):
    """A background snapshot's install frees a dropped segment's blocks a cut at a time (FileIO.release);
    a file the table maps would then fault when a row of it is read: it is only unlinked."""
    from storaged.fileio import FileIO

    class Spy(FileIO):
        def __init__(self):
            super().__init__()
            self.released, self.removed = [], []

        def release(self, path):
            self.released.append(os.path.basename(path))
            super().release(path)

        def remove(self, path):
            self.removed.append(os.path.basename(path))
            super().remove(path)

    d, ids = _store(tmp_path)
    io = Spy()
    s = Store.open(d, io)
    try:
        old = set(s.table.mapped_names())
        assert old and old <= set(_digests(d))
        write(s, "s-new", "one more")
        s.rows_legacy = True   # the next snapshot writes a new base, and the old one is named no more
        tmp = s.snapshot_path + ".tmp"
        plan = s.plan_snapshot()
        s.install_snapshot(None, _written(s, tmp, plan), plan, background=True)
        assert old <= set(io.removed) and not old & set(io.released)
        assert not old & set(os.listdir(d))
        assert live_state(s) == _replayed(d, tmp_path)   # every mapped row still reads
    finally:
        s.close()


def _written(s, tmp: str, plan) -> int:
    pos = s.write_snapshot_file(tmp, plan)
    os.replace(tmp, s.snapshot_path)   # as a background child's writer puts it in place
    return pos


def test_a_delta_of_mapped_rows_alone_loads(tmp_path):
    """A delta whose rows are all below the mapped base, as one run (an update of one old message after
    a delta of new ones): placed in the base only (a slice past the tail's start was mistaken for one
    from its end, the load refused, and the start replayed the whole log)."""
    d, ids = _store(tmp_path)
    s = Store.open(d)
    for i in range(50):
        write(s, "s-new", f"past the base {i}")
    assert s.write_snapshot()
    s.close()
    s = Store.open(d)
    try:
        assert s.table.nbase and len(s.table.rows)
        update(s, ids[-3], content="one old row changed")   # near the base's end: the old slice was not empty
        assert s.write_snapshot()   # a delta of that row alone
        expected = live_state(s)
        s.close()
        s = Store.open(d)
        assert s.snapshot_valid and s.table.nbase and s.scan_result.records == 0
        assert live_state(s) == expected == _replayed(d, tmp_path)
    finally:
        s.close()


def test_the_id_keys_file_is_kept_from_cuts_while_they_are_mapped_merges_included(tmp_path, monkeypatch):
    """A store that deleted a message has its base's id keys mapped (the deleted id's among them: a
    lookup skips it); new ids merge into a level of their own, never into those,
    so the file stays mapped and kept from cuts."""
    from storaged import columns

    d, ids = _store(tmp_path, delete_one=True)
    with opened(d) as s:
        t = s.table
        assert not t.base_keys.flags.writeable and t.mapped_names() == set(_digests(d))
        monkeypatch.setattr(columns, "RECENT_MAX", 4)
        new = [write(s, "s-new", f"new id {i}")["message"]["message_id"] for i in range(5)]   # the fourth merges
        assert not t.base_keys.flags.writeable and t.mapped_names() == set(_digests(d))
        assert len(t.keys) == 4 and t.keys.flags.writeable
        assert all(t.seq_of(mid) is not None for mid in new)


@pytest.mark.parametrize("n, deleted, rows", [(300, slice(100, 101), 299), (4000, slice(0, 1000), 3000)],
                         ids=["one in the middle", "the oldest quarter"])
def test_a_gapped_base_of_an_earlier_release_is_written_again_lying_as_the_rows_do(tmp_path, monkeypatch, n,
                                                                                   deleted, rows):
    """A base an earlier release wrote of the live rows only — a gap where a message was deleted, or its
    first seq too far in for its rows to be mapped: the start copies its rows, and the store is due a
    base at once (``base_due``), which holds the dead rows, so the start after maps it."""
    from storaged import columns

    d, ids = _store(tmp_path, n=n)
    s = Store.open(d)
    for mid in ids[deleted]:
        delete(s, mid)
    s.rows_legacy = True   # (a base now)
    with monkeypatch.context() as m:
        m.setattr(columns, "BASE_HOLES_MAX", -1)   # (as the earlier release wrote it: live rows only)
        assert s.write_snapshot() and s.row_segments[0][1] == rows
    state = live_state(s)
    s.close()
    with opened(d) as s:
        assert s.table._base_map is None and s.base_due() and s.snapshot_due()
        assert live_state(s) == state
        assert s.write_snapshot()
    with opened(d) as s:
        assert s.table._base_map is not None and not s.base_due() and live_state(s) == state


def test_health_counts_the_rows_on_the_heap_not_those_a_base_maps(tmp_path):
    """store_entries_bytes is what the rows, their etype bytes and the id keys hold on the heap: the
    rows of a mapped base are the page cache's (a count of rows times their size said 430 MB at five
    million events where the heap held none), the rows written after it are counted."""
    d, ids = _store(tmp_path, n=12_000)   # (id keys over 1 MB: mapped too)
    with opened(d) as s:
        t = s.table
        assert t.nbase and len(t.rows) == 0 and t._keys_file is not None
        assert t.entries_heap_bytes() < 12_000 * ROW_DTYPE.itemsize // 4   # (the etype bytes, the recent keys)
        mapped = s.health()["memory_estimate"]["store_entries_bytes"]   # (and the id maps, the request ids)
        for i in range(100):
            write(s, "s-new", f"past the base {i}")
        grown = s.health()["memory_estimate"]["store_entries_bytes"]
        assert grown - mapped >= 100 * ROW_DTYPE.itemsize
    s = Store.open(replay_copy(d, str(tmp_path / "replayed")))   # (a replay holds every row on the heap)
    try:
        assert s.table.nbase == 0 and s.table.entries_heap_bytes() >= 12_100 * ROW_DTYPE.itemsize
    finally:
        s.close()


def test_a_base_of_a_store_whose_oldest_messages_were_deleted_is_mapped(tmp_path):
    """The oldest quarter deleted (a retention policy's way): the base's rows still run from seq 0, the
    deleted ones dead rows, so a start maps them. (A base from its first live seq on could only be
    mapped where the bytes before its rows were at least that seq's rows: ~10% of a store deleted first
    had every start copy the rest.)"""
    d, ids = _store(tmp_path, n=4000)
    with opened(d) as s:
        for mid in ids[:1000]:
            delete(s, mid)
        s.rows_legacy = True   # (a base now)
        assert s.write_snapshot() and s.row_segments[0][1] == 4001
        state = live_state(s)
    with opened(d) as s:
        t = s.table
        assert t._base_map is not None and t.nbase == 4001 and len(t.rows) == 0 and t.count == 3000
        assert live_state(s) == state


def test_a_sparse_entry_at_a_base_s_dead_row_is_not_loaded(tmp_path):
    """A dead row owns no sparse entry: one at its seq (only a writer's bug would put it there) is not
    loaded as the seq's summary."""
    from storaged import snapshot
    from storaged.fileio import FileIO

    d, ids = _store(tmp_path, delete_one=True)
    s = Store.open(d)
    state = live_state(s)
    t = s.table
    dead = int(np.flatnonzero(np.frombuffer(t.etype, np.uint8) == 0)[-1])
    name = s.row_segments[0][0]
    columns = t.segment_columns(t.live_seqs(), holes=True)
    columns["summary"] = sorted([*columns["summary"], [dead, "a ghost"]])
    metas, checkpoints = s.session_meta_entries(packed=True), s.ingest.dump(packed=True)
    s.close()
    os.remove(os.path.join(d, name))
    snapshot.write_row_columns(FileIO(), os.path.join(d, name), columns, (), metas, checkpoints)
    with opened(d) as s:
        assert s.snapshot_valid and dead not in s.table.summary and live_state(s) == state
