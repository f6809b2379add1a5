"""The exts with files kept packed (storaged/extfiles.py, row segments of version 4): a loaded table builds
back every message as it was put, through base and delta segments, replaced and deleted rows, and the
mutations made after the load; a snapshot copies the packed entries it did not change byte for byte;
an entry that does not unpack fails its read clearly and is left out of the touch index, not fatal."""
from __future__ import annotations

import logging
import os

import msgpack
import numpy as np
import pytest

from storaged.columns import MessageTable, rows_from_columns
from storaged.extfiles import ExtDamaged, ExtFiles, pack_entry, packed_sections, unpack_entry
from storaged.indexes import TouchIndex
from tests.unit.test_columns import SRC, _message, _state

pytestmark = pytest.mark.unit


def _files(*paths: str) -> tuple:
    return tuple((p, "/src", p.rsplit("/", 1)[-1], "proj", "edit") for p in paths)


def _ext(*paths: str, error=None, code=None, model=None) -> tuple:
    return (error, code, model, _files(*paths))


def _table(messages) -> MessageTable:
    t = MessageTable()
    for m in messages:
        t.put(m)
    return t


def _loaded(*segments) -> MessageTable:
    t = MessageTable()
    t.load_segments(list(segments), SRC)
    return t


def test_a_base_loads_every_ext_packed_and_builds_it_back():
    msgs = [_message(seq, ext=_ext(f"/src/f{seq}.py", error=seq % 2 == 0, code=seq, model="m") if seq % 3 else None,
                     etype="tool_call", tool="Edit") for seq in range(1, 40)]
    src = _table(msgs)
    t = _loaded((src.segment_columns(src.live_seqs()), []))
    assert not t.ext_files.fresh and len(t.ext_files) == sum(1 for m in msgs if m.ext is not None)
    for m in msgs:
        assert _state(t.get(m.seq)) == _state(m)
    assert sorted(t.ext_files) == [m.seq for m in msgs if m.ext is not None]


def test_a_delta_replaces_and_deletes_the_base_s_entries():
    base = _table([_message(s, ext=_ext(f"/a/{s}.py")) for s in range(1, 6)])
    base_cols = base.segment_columns(base.live_seqs())
    base.put(_message(2, ext=None, revision=2))               # files gone
    base.put(_message(3, ext=_ext("/b/new.py"), revision=2))   # other files
    base.put(_message(7, ext=_ext("/c/seven.py")))             # a new one
    base.drop(4)
    delta = base.segment_columns(np.array([2, 3, 7]))
    t = _loaded((base_cols, []), (delta, [4]))
    assert t.get(2).ext is None and 2 not in t.ext_files
    assert t.get(3).ext == _ext("/b/new.py") and t.get(7).ext == _ext("/c/seven.py")
    assert t.get(4) is None and 4 not in t.ext_files
    assert sorted(t.ext_files) == [1, 3, 5, 7] and len(t.ext_files) == 4
    for seq in (1, 3, 5, 7):
        assert _state(t.get(seq)) == _state(base.get(seq))


def test_mutations_after_a_load_stand():
    src = _table([_message(s, ext=_ext(f"/a/{s}.py")) for s in range(1, 6)])
    t = _loaded((src.segment_columns(src.live_seqs()), []))
    t.put(_message(1, ext=_ext("/z/one.py"), revision=2))   # a packed entry replaced
    t.put(_message(2, ext=None, revision=2))                # a packed entry gone by an update
    t.drop(3)                                               # ... by a delete
    t.put(_message(9, ext=_ext("/n/nine.py")))              # a new one
    assert t.get(1).ext == _ext("/z/one.py") and t.get(2).ext is None and t.get(3) is None
    assert sorted(t.ext_files) == [1, 4, 5, 9] and len(t.ext_files) == 4
    assert 3 not in t.ext_files and 2 not in t.ext_files and 4 in t.ext_files
    again = _loaded((t.segment_columns(t.live_seqs()), []))   # and a new base holds just those
    for seq in t.live_seqs().tolist():
        assert _state(again.get(seq)) == _state(t.get(seq))
    assert sorted(again.ext_files) == [1, 4, 5, 9]


def _noncanonical(path: str) -> bytes:
    """An entry of one file (``path``, no root/tail/project, "edit") with its path as a str8, which no
    packer writes for a short string: same value as ``pack_entry``'s, other bytes."""
    return b"\x94\xc0\xc0\xc0\x91\x95\xd9" + bytes([len(path)]) + path.encode() + b"\xc0\xc0\xc0\xa4edit"


def test_a_snapshot_copies_unchanged_entries_byte_for_byte():
    ext = ExtFiles()
    raw = [_noncanonical("/a/4.py"), _noncanonical("/a/8.py")]
    sections = packed_sections(np.array([4, 8]), raw)
    ext.load_packed([(np.array([4, 8]), np.frombuffer(sections["ext_ends"], "<u8").astype(np.int64),
                      np.ones(2, bool), sections["ext_values"])])
    value = (None, None, None, (("/a/8.py", None, None, None, "edit"),))
    assert ext[8] == value and pack_entry(value) != raw[1]
    ext[5] = _ext("/n/5.py")
    assert ext.sections(np.array([5, 8])) == packed_sections(np.array([5, 8]), [pack_entry(_ext("/n/5.py")), raw[1]])
    assert ext.sections() == packed_sections(np.array([4, 5, 8]), [raw[0], pack_entry(_ext("/n/5.py")), raw[1]])


def test_rows_read_one_by_one_hold_the_entries():
    msgs = [_message(s, ext=_ext(f"/a/{s}.py", code=s)) for s in range(1, 4)]
    src = _table(msgs)
    rows = rows_from_columns({**src.segment_columns(src.live_seqs()), "version": 4})
    assert [r[18] for r in rows] == [[None, s, None, [list(f) for f in _files(f"/a/{s}.py")]] for s in range(1, 4)]


@pytest.mark.parametrize("raw", [
    b"\xc1",                                        # not msgpack
    msgpack.packb([None, None, None]),              # three fields
    msgpack.packb([None, None, None, []]),          # no files: never packed
    msgpack.packb([None, None, None, [["/a", None, None, None]]]),   # a file of four fields
    msgpack.packb([None, None, None, [[7, None, None, None, "edit"]]]),  # a path that is not a string
    msgpack.packb([None, None, None, [["/a", 3, None, None, "edit"]]]),  # a root that is neither
    msgpack.packb({"a": 1}),
])
def test_an_entry_that_does_not_unpack_is_ext_damaged(raw):
    with pytest.raises(ExtDamaged, match="seq 12"):
        unpack_entry(raw, 12)


def test_a_damaged_entry_fails_its_read_and_the_touch_load_goes_on(caplog):
    ext = ExtFiles()
    good = pack_entry(_ext("/a/good.py"))
    sections = packed_sections(np.array([1, 2, 3]), [good, b"\xc1", pack_entry(_ext("/a/third.py"))])
    seqs = np.frombuffer(sections["ext_seqs"], "<u8").astype(np.int64)
    ends = np.frombuffer(sections["ext_ends"], "<u8").astype(np.int64)
    ext.load_packed([(seqs, ends, np.ones(3, bool), sections["ext_values"])])
    assert ext[1] == _ext("/a/good.py")
    with pytest.raises(ExtDamaged):
        ext[2]
    touches = TouchIndex()
    touches.load_later(ext)
    with caplog.at_level(logging.ERROR, logger="convmem.storaged"):
        assert touches.load_step(None) is False
    assert touches.candidates("good.py") == [1] and touches.candidates("third.py") == [3]
    assert "seq 2" in caplog.text
    ext.discard(2)   # forgetting it never unpacks it
    assert 2 not in ext and len(ext) == 2


def test_the_mapping_s_methods_agree():
    ext = ExtFiles()
    sections = packed_sections(np.array([4, 8]), [pack_entry(_ext("/a/4.py")), pack_entry(_ext("/a/8.py"))])
    ext.load_packed([(np.array([4, 8]), np.frombuffer(sections["ext_ends"], "<u8").astype(np.int64),
                      np.array([True, False]), sections["ext_values"])])   # 8 kept by a later segment
    assert list(ext) == [4] and 8 not in ext and ext.get(8) is None and len(ext) == 1
    ext[8] = _ext("/b/8.py")
    assert ext[8] == _ext("/b/8.py") and sorted(ext) == [4, 8]
    ext[4] = _ext("/b/4.py")
    assert ext[4] == _ext("/b/4.py") and len(ext) == 2 and not ext._alive.any()
    del ext[4]
    with pytest.raises(KeyError):
        del ext[4]
    assert dict(ext.items()) == {8: _ext("/b/8.py")}


def test_numpy_seqs_are_found():
    ext = ExtFiles()
    sections = packed_sections(np.array([3]), [pack_entry(_ext("/a/3.py"))])
    ext.load_packed([(np.array([3]), np.frombuffer(sections["ext_ends"], "<u8").astype(np.int64), np.ones(1, bool),
                      sections["ext_values"])])
    assert np.int64(3) in ext and 3 in ext and np.int64(4) not in ext and "3" not in ext and 3.5 not in ext


def test_an_entry_written_wrong_is_read_again_from_the_log(tmp_path, caplog, monkeypatch):
    """A packed entry that does not unpack (a writer's bug: the segment's CRC holds) is read again from
    the message's record in the log: reads, updates, deletes, indexing and a rebuild all go on, and
    the next snapshot writes it as it should be."""
    from storaged import compaction
    from storaged.store import Store
    from tests.support.faultio import delete, live_state, update
    from tests.unit.test_history_views import Book, touch

    d = str(tmp_path / "d")
    store = Store.open(d)
    book = Book(store)
    events = [touch(book, "claude-code:s", f"/repo/src/m{i}.py", "/repo", f"src/m{i}.py") for i in range(6)]
    book.put(events, [{"session_id": "claude-code:s", "harness": "claude-code", "source": "claude"}])
    expected = live_state(store)
    real = ExtFiles.sections

    def wrong(self, seqs=None):   # the snapshot's writer packs every entry but the first right
        out = real(self, seqs)
        ends = np.frombuffer(out["ext_ends"], "<u8")
        first = int(ends[0])
        return {**out, "ext_values": b"\xc1" * first + out["ext_values"][first:]}

    monkeypatch.setattr(ExtFiles, "sections", wrong)
    assert store.write_snapshot()
    store.close()
    monkeypatch.setattr(ExtFiles, "sections", real)
    store = Store.open(d)
    try:
        first = min(store.table.ext_files._seqs.tolist())
        with caplog.at_level(logging.WARNING, logger="convmem.storaged"):
            assert live_state(store) == expected
        assert f"seq {first}" in caplog.text and "read again from the log" in caplog.text
        assert first in store.table.ext_files.fresh and store.snapshot_due()
        assert store.write_snapshot()   # a delta holding the repaired row: the next start reads it right
        store.close()
        caplog.clear()
        store = Store.open(d)
        with caplog.at_level(logging.WARNING, logger="convmem.storaged"):
            assert live_state(store) == expected
        assert "read again" not in caplog.text and not store.snapshot_due()
        mid = store.table.message_id(first)
        update(store, mid, content="changed")
        assert compaction.rebuild(store)["status"] == "OK"
        delete(store, store.table.message_id(first + 1))
        assert store.write_snapshot()
        store.close()
        caplog.clear()
        store = Store.open(d)
        with caplog.at_level(logging.WARNING, logger="convmem.storaged"):
            state = live_state(store)
        assert "read again" not in caplog.text and state[mid]["content"] == "changed"
    finally:
        store.close()


def test_a_damaged_entry_and_a_rotten_record_together_do_not_stop_a_start(tmp_path, monkeypatch):
    """Two faults: the snapshot's packed ext of an event does not unpack, and its log record (before the
    snapshot's position, which a start does not scan) rotted. A later update of it is replayed all the
    same — the message replaced without its unreadable files — and the store starts, marked damaged."""
    from storaged.store import Store
    from tests.support.faultio import live_state, update
    from tests.unit.test_history_views import Book, touch

    d = str(tmp_path / "d")
    store = Store.open(d)
    book = Book(store)
    book.put([touch(book, "claude-code:s", f"/repo/src/m{i}.py", "/repo", f"src/m{i}.py") for i in range(4)],
             [{"session_id": "claude-code:s", "harness": "claude-code", "source": "claude"}])
    real = ExtFiles.sections

    def wrong(self, seqs=None):   # every entry written so that it does not unpack
        out = real(self, seqs)
        return {**out, "ext_values": b"\xc1" * len(out["ext_values"])}

    monkeypatch.setattr(ExtFiles, "sections", wrong)
    assert store.write_snapshot()
    store.close()
    monkeypatch.setattr(ExtFiles, "sections", real)
    store = Store.open(d)
    seq = min(store.table.ext_files._seqs.tolist())
    mid = store.table.message_id(seq)
    rec_pos = store.table.row(seq)[6]
    update(store, mid, content="updated after the snapshot")   # (its ext read again from the log, fine then)
    store.close()                                             # no snapshot: the update is the log's tail
    with open(os.path.join(d, "log"), "r+b") as f:            # the event's write record rots
        f.seek(rec_pos + 12)
        b = f.read(1)
        f.seek(rec_pos + 12)
        f.write(bytes([b[0] ^ 0x20]))
    store = Store.open(d)
    try:
        assert store.snapshot_valid and store.corrupt and store.health()["status"] == "DEGRADED"
        state = live_state(store)
        assert state[mid]["content"] == "updated after the snapshot" and len(state) == 4
    finally:
        store.close()
