"""Review of the message table (storaged/columns.py) and row segments of version 2 (now 3): a message the
row cannot hold changes nothing; a damaged (but checksummed) row segment is refused at load, never
loaded into rows that fail when read; a mapped segment with a bad tail is refused, not a BufferError."""
from __future__ import annotations

import os

import msgpack
import numpy as np
import pytest

from storaged import snapshot
from storaged.columns import ROW_DTYPE, MessageTable
from storaged.extfiles import packed_sections, raw_entries
from storaged.fileio import FileIO
from storaged.store import Store
from tests.support.faultio import write
from tests.unit.test_columns import SRC, _message, _state, _table_of, _ulid


def test_a_value_the_row_cannot_hold_changes_nothing():
    """A hand-made log's timestamp or importance of 2^63 and more (check_message checks types only):
    the put is refused with ValueError and the table is as it was (it used to raise struct.error
    with the seq counted, its id answered by by_id, and a replaced row half zeroed)."""
    t = MessageTable()
    t.put(_message(1, summary="kept"))
    with pytest.raises(ValueError):
        t.put(_message(1, importance=2 ** 63, summary="new"))
    with pytest.raises(ValueError):
        t.put(_message(2, timestamp=2 ** 63))
    assert len(t) == 1 and list(t.by_seq) == [1]
    assert _ulid(2) not in t.by_id and t.by_id.get(_ulid(2)) is None
    assert _state(t.get(1)) == _state(_message(1, summary="kept"))


def _segment():
    t = _table_of([_message(1), _message(2, "odd-id", ext=(None, None, None, (("/a/b", None, None, None, "read"),))),
                   _message(3, tool_call_id="call-3")])
    return t.segment_columns(t.live_seqs())


def _with_rows(cols, **fields):
    rows = np.frombuffer(cols["rows"], ROW_DTYPE).copy()
    for name, (i, value) in fields.items():
        rows[name][i] = value
    return {**cols, "rows": rows.tobytes()}


def _v3(cols):
    """The columns as a version 3 segment holds them: the exts with files as [seq, ext] pairs."""
    out = {k: v for k, v in cols.items() if not k.startswith("ext_")}
    out["ext_files"] = sorted(raw_entries(cols).items())
    return out


def _damaged():
    cols = _segment()
    entry = bytes(cols["ext_values"])
    etype = bytearray(cols["etype"])
    etype[0] = 200
    return {
        "etype code": ({**cols, "etype": bytes(etype)}, []),
        "role code": (_with_rows(cols, codes=(0, 99)), []),
        "source generation": (_with_rows(cols, codes=(0, 5 << 24)), []),
        "tool_call_id past its bytes": (_with_rows(cols, tcid=(2, 1000 << 24 | 5)), []),
        "ext with files, no entry": ({**cols, **packed_sections(np.zeros(0, np.int64), [])}, []),
        "ext entry at a row without files": ({**cols, **packed_sections(np.array([1, 2]), [entry, entry])}, []),
        "ext entries repeated": ({**cols, **packed_sections(np.array([2, 2]), [entry, entry])}, []),
        "ext entry past its bytes": ({**cols, "ext_ends": np.array([len(entry) + 1], "<u8").tobytes()}, []),
        "ext entry not ending its bytes": ({**cols, "ext_values": entry + b"\x90"}, []),
        "ext entries and ends differ in number": ({**cols, "ext_seqs": np.array([1, 2], "<u8").tobytes()}, []),
        "version 3 ext with files, no entry": ({**_v3(cols), "ext_files": []}, []),
        "odd id at a seq it does not hold": ({**cols, "odd_ids": [*cols["odd_ids"], [99, "x"]]}, []),
        "wide row, no entry": (_with_rows(cols, importance=(0, 255), rev=(0, 2 ** 32 - 1)), []),
        "wide entry not two integers": (_with_rows({**cols, "wide": [[1, [1, "x"]]]}, importance=(0, 255)), []),
        "wide entry not a pair": (_with_rows({**cols, "wide": [[1, 5]]}, importance=(0, 255)), []),
        "seqs repeated": ({**cols, "seqs": np.array([1, 1, 3], "<u8").tobytes()}, []),
        "negative dead seq": (cols, [-1]),
        "negative sparse seq": ({**cols, "summary": [[-1, "x"]]}, []),
    }


@pytest.mark.parametrize("case", sorted(_damaged()))
def test_a_damaged_row_segment_is_refused_at_load(case):
    """Each of these loaded without a word before: rows that raise IndexError/KeyError when read (every
    request that reaches them fails), or silently the wrong rows (a dead seq of -1 killed the last
    row; a repeated seq put one message's row at another's seq)."""
    cols, dead = _damaged()[case]
    with pytest.raises(ValueError):
        MessageTable().load_segments([(cols, dead)], SRC)


def test_a_row_segment_seq_beyond_the_snapshot_s_last_is_refused():
    """A damaged seq of 2^40 would size the table for it (110 TB: a MemoryError, which the start does
    not catch): the snapshot's last_seq bounds it."""
    cols = _segment()
    cols = {**cols, "seqs": np.array([1, 2, 1 << 40], "<u8").tobytes()}
    with pytest.raises(ValueError):
        MessageTable().load_segments([(cols, [])], SRC, last_seq=3)


def test_a_store_replays_the_log_when_a_row_segment_has_a_bad_code(tmp_path, monkeypatch):
    d = str(tmp_path)
    s = Store.open(d)
    for i in range(6):
        write(s, f"s{i % 2}", f"text {i}")
    expected = {mid: s.by_id[mid].to_dict() for mid in s.by_id}
    real = MessageTable.segment_columns

    def damaged(self, *args, **kw):
        cols = real(self, *args, **kw)
        return {**cols, "etype": bytes([200]) + bytes(cols["etype"][1:])}

    monkeypatch.setattr(MessageTable, "segment_columns", damaged)
    assert s.write_snapshot()
    s.close()
    monkeypatch.setattr(MessageTable, "segment_columns", real)
    again = Store.open(d)
    try:
        assert not again.snapshot_valid
        assert {mid: again.by_id[mid].to_dict() for mid in again.by_id} == expected
    finally:
        again.close()


def test_a_mapped_row_segment_with_a_bad_tail_is_refused_not_a_buffer_error(tmp_path):
    """A segment of 1 MB and more is mapped; its column sections are views of the mapping. A bad
    tail (or a section past the body) closed the mapping while the views were alive: BufferError,
    which the start does not catch (the daemon did not start), and the mapping stayed open."""
    t = _table_of([_message(seq, tool_call_id="x" * 200) for seq in range(1, 6000)])
    cols = t.segment_columns(t.live_seqs())
    head = {k: v for k, v in cols.items() if k not in snapshot._COLUMN_SECTIONS}
    head.update({f"{n}_bytes": len(cols[n]) for n in snapshot._COLUMN_SECTIONS})
    parts = [msgpack.packb(head, use_bin_type=True), *(bytes(cols[n]) for n in snapshot._COLUMN_SECTIONS),
             msgpack.packb({"rows": "not a count", "dead": []})]
    path = os.path.join(str(tmp_path), "rows")
    snapshot._write_framed(FileIO(), path, snapshot.ROWS_MAGIC, 2, parts)
    assert os.path.getsize(path) >= 1 << 20  # mapped, not read
    with pytest.raises(snapshot.SnapshotInvalid):
        snapshot._RowSegment(FileIO(), path)
