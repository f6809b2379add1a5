"""The message table (storaged/columns.py): what is put is what is built back, field for field; ids are
found through the recent dict, the sorted keys, colliding keys and odd ids alike; a dead or replaced row
is never answered; and a store that holds its messages as columns reads the same as it did."""
from __future__ import annotations

import numpy as np
import pytest

from storaged import columns
from storaged.columns import MessageTable, id_key
from storaged.fileio import FileIO
from storaged.model import Message
from storaged.text import LogText, location_from_parts
from storaged.store import Store
from tests.support.faultio import delete, update, write

SRC = LogText(FileIO())
OTHER = LogText(FileIO())


def _ulid(n: int, prefix: str = "01J0000000") -> str:
    digits = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
    tail = ""
    for _ in range(16):
        tail = digits[n & 31] + tail
        n >>= 5
    return prefix + tail


def _message(seq: int, mid: str | None = None, **kw) -> Message:
    fields = dict(message_id=mid or _ulid(seq), session_id=kw.pop("session_id", "sess"), seq=seq,
                  timestamp=1_700_000_000_000 + seq, role="user", content=location_from_parts([seq * 100, 40, 7]),
                  revision=1, updated_at=1_700_000_000_000 + seq, tool_call_id=None, tags=(), tier="short",
                  kind="conversation", importance=50, summary=None, relations=(), source_ids=(), rec_size=90,
                  etype=None, tool=None, ext=None)
    fields.update(kw)
    msg = Message(**fields)
    msg.src = SRC
    return msg


def _state(m: Message | None):
    if m is None:
        return None
    return (m.message_id, m.session_id, m.seq, m.timestamp, m.role, m.text, m.revision, m.updated_at, m.tool_call_id,
            m.tags, m.tier, m.kind, m.importance, m.summary, m.relations, m.source_ids, m.etype, m.tool, m.ext,
            m.rec_size, m.src)


VARIANTS = [
    {},
    {"tool_call_id": "toolu_01ABC", "etype": "tool_call", "tool": "Bash", "role": "assistant"},
    {"tool_call_id": "呼び出し-1", "etype": "tool_response", "ext": (True, 2, "model-x", ())},
    {"ext": (None, None, None, (("/a/b.py", None, "b.py", "proj", "edit"),)), "etype": "tool_call", "tool": "Edit"},
    {"tags": ("harness", "project"), "summary": "要約 summary", "importance": 100, "tier": "long", "kind": "semantic"},
    {"relations": (("reply_to", _ulid(1)), ("cites", _ulid(2))), "source_ids": (_ulid(3),), "revision": 7,
     "updated_at": 1_800_000_000_000, "role": "system", "etype": "system"},
    {"importance": 0, "timestamp": 0, "updated_at": 0},
]


@pytest.mark.parametrize("variant", range(len(VARIANTS)))
def test_what_is_put_is_built_back(variant):
    t = MessageTable()
    msg = _message(5, **VARIANTS[variant])
    t.put(msg)
    got = t.get(5)
    assert _state(got) == _state(msg) and type(got.seq) is int
    assert t.by_id[msg.message_id].seq == 5 and t.by_seq[np.int64(5)].seq == 5 and type(t.by_seq[np.int64(5)].seq) is int
    assert len(t) == 1 and 5 in t.by_seq and 4 not in t.by_seq and 6 not in t.by_seq and -1 not in t.by_seq


def test_a_snapshot_row_loads_as_the_message_it_came_from():
    t, direct = MessageTable(), MessageTable()
    for i, variant in enumerate(VARIANTS):
        msg = _message(i + 1, **variant)
        direct.put(msg)
        t.load_row(msg.row(), SRC)
    for seq in range(1, len(VARIANTS) + 1):
        assert _state(t.get(seq)) == _state(direct.get(seq))


def test_a_new_revision_replaces_the_row_and_its_sparse_fields():
    t = MessageTable()
    t.put(_message(3, summary="old", relations=(("r", _ulid(9)),), tool_call_id="x", ext=(None, None, None, (("/p", None, None, None, "read"),))))
    t.put(_message(3, revision=2))
    got = t.get(3)
    assert (got.summary, got.relations, got.tool_call_id, got.ext, got.revision) == (None, (), None, None, 2)
    assert len(t) == 1 and not t.summary and not t.relations and not t.ext_files


def test_a_dropped_row_is_gone_from_every_lookup():
    t = MessageTable()
    for seq in (1, 2, 3):
        t.put(_message(seq))
    t.merge_keys()
    t.put(_message(4))
    for seq in (2, 4):  # one in the sorted keys, one in the recent ids
        t.drop(seq)
        assert t.get(seq) is None and _ulid(seq) not in t.by_id and t.by_id.get(_ulid(seq)) is None
        assert t.etype[seq] == 0
    assert list(t.by_seq) == [1, 3] and list(reversed(t.by_seq)) == [3, 1] and len(t) == 2
    assert list(t.by_id) == [_ulid(1), _ulid(3)]
    with pytest.raises(KeyError):
        t.drop(2)
    with pytest.raises(KeyError):
        t.by_seq[2]


def test_ids_are_found_before_and_after_the_keys_are_merged(monkeypatch):
    monkeypatch.setattr(columns, "RECENT_MAX", 7)
    t = MessageTable()
    for seq in range(1, 40):
        t.put(_message(seq))
    assert len(t.keys) >= 35 and len(t.recent) < 7
    for seq in range(1, 40):
        assert t.by_id[_ulid(seq)].seq == seq
    assert _ulid(99) not in t.by_id and "nonsense" not in t.by_id and 5 not in t.by_id


def test_colliding_keys_are_told_apart_by_the_id(monkeypatch):
    """Every id given the same key (the worst a key function can do): each is still found by its own
    id, in the recent ids and the sorted keys alike, and a dropped one is not."""
    monkeypatch.setattr(columns, "id_key", lambda mid: 7)
    monkeypatch.setattr(columns, "_keys", lambda ids: np.full(len(ids), 7, np.uint64))
    t = MessageTable()
    for seq in range(1, 30):
        t.put(_message(seq))
    t.merge_keys()
    t.put(_message(30))
    assert all(t.by_id[_ulid(seq)].seq == seq for seq in range(1, 31))
    t.drop(4)
    t.merge_keys()
    assert _ulid(4) not in t.by_id and t.by_id[_ulid(5)].seq == 5 and _ulid(99) not in t.by_id


def test_ids_alike_in_either_half_get_different_keys():
    """Ids that share their random part (a sequence imported at different times) or their time and
    high bits (a monotonic generator's run) spread over the keys instead of piling on one."""
    same_tail = [f"01J{i:07d}" + "0" * 16 for i in range(1000)]
    same_head = [_ulid(i) for i in range(1000)]
    for ids in (same_tail, same_head):
        assert len({id_key(mid) for mid in ids}) == 1000
        text = np.frombuffer("".join(ids).encode("ascii"), np.uint8).reshape(-1, 26)
        raw, ok = columns.raw_ids(text)
        assert ok.all() and [bytes(r) for r in raw] == [columns.id_raw(mid) for mid in ids]
        assert columns._keys(raw).tolist() == [id_key(mid) for mid in ids]


def test_an_id_deleted_and_stored_again_finds_its_new_seq():
    t = MessageTable()
    t.put(_message(1, _ulid(5)))
    t.merge_keys()
    t.drop(1)
    t.put(_message(8, _ulid(5)))
    assert t.by_id[_ulid(5)].seq == 8
    t.merge_keys()
    assert t.by_id[_ulid(5)].seq == 8 and list(t.by_seq) == [8]


def test_an_id_that_is_not_a_canonical_ulid_is_kept_as_it_is():
    t = MessageTable()
    odd = ["short", "01j0000000000000000000000a", "é" * 26]
    for seq, mid in enumerate(odd, 1):
        t.put(_message(seq, mid))
    t.index_all_ids()
    for seq, mid in enumerate(odd, 1):
        assert t.by_id[mid].seq == seq and t.get(seq).message_id == mid
    t.put(_message(1, "renamed"))
    assert "short" not in t.by_id and t.by_id["renamed"].seq == 1
    t.drop(2)
    assert odd[1] not in t.by_id


def test_index_all_ids_after_a_bulk_load_finds_every_id():
    t = MessageTable()
    for seq in range(1, 300, 3):
        t.load_row(_message(seq).row(), SRC)
    t.index_all_ids()
    assert not t.recent and len(t.base_keys) == 100 and len(t.keys) == 0   # (all at once: the base level)
    assert all(t.by_id[_ulid(seq)].seq == seq for seq in range(1, 300, 3))
    assert list(t.by_seq) == list(range(1, 300, 3))


def test_a_relocated_row_reads_its_new_source():
    t = MessageTable()
    t.put(_message(1))
    t.put(_message(2))
    t.relocate(1, location_from_parts([5000, 41, 7]), 77, OTHER)
    m1, m2 = t.get(1), t.get(2)
    assert m1.src is OTHER and m1.rec_size == 77 and m1.text == location_from_parts([5000, 41, 7])
    assert m2.src is SRC and t.source_of(2) is SRC and t.source_of(1) is OTHER


def test_a_message_whose_text_is_not_stored_is_refused():
    msg = _message(1)
    msg.text = "in memory"
    with pytest.raises(ValueError):
        MessageTable().put(msg)


def test_a_store_reads_the_same_through_its_columns_across_a_restart(tmp_path):
    d = str(tmp_path)
    s = Store.open(d)
    ids = [write(s, f"s{i % 3}", f"text {i} " * (i + 1), tool_call_id=f"call-{i}" if i % 2 else None,
                 tags=["a", "b"] if i % 4 == 0 else [])["message"]["message_id"] for i in range(30)]
    update(s, ids[4], content="changed", summary="a summary")
    delete(s, ids[7])

    def state(store):
        return {mid: store.by_id[mid].to_dict() for mid in store.by_id}

    before = state(s)
    assert len(before) == 29 and ids[7] not in s.by_id and before[ids[4]]["content"] == "changed"
    assert s.write_snapshot()
    s.close()
    again = Store.open(d)
    assert state(again) == before and list(again.by_seq) == sorted(again.by_seq)
    assert [list(again.sessions[f"s{k}"].seqs) for k in range(3)] == [list(s.sessions[f"s{k}"].seqs) for k in range(3)]
    again.close()


def _table_of(messages) -> MessageTable:
    t = MessageTable()
    for m in messages:
        t.put(m)
    return t


def test_row_segment_columns_load_back_as_the_same_rows():
    """A base and a delta (rows replaced, rows deleted, new rows) as ``segment_columns`` writes them load
    back (``load_segments``) to the table they came from, and read as the rows a version 1 segment held."""
    from storaged.columns import rows_from_columns

    def variant(seq):
        return VARIANTS[seq % len(VARIANTS)]

    first = [_message(seq, **variant(seq)) for seq in range(1, 40)]
    first.append(_message(40, "not-a-ulid", session_id="other"))
    t = _table_of(first)
    base = t.segment_columns(t.live_seqs())
    assert rows_from_columns(base) == [m.row() for m in first]
    # then: 5 and 40 replaced, 7 and 8 deleted, 41-42 new
    t.put(_message(5, summary="now summarised", revision=2, tags=("x",)))
    t.put(_message(40, "still-odd", session_id="third", tool_call_id="c-40"))
    t.drop(7)
    t.drop(8)
    t.put(_message(41, **variant(3)))
    t.put(_message(42, relations=(("reply_to", _ulid(5)),)))
    delta = t.segment_columns(np.array([5, 40, 41, 42]))
    loaded = MessageTable()
    loaded.load_segments([(base, []), (delta, [7, 8])], SRC)
    assert list(loaded.by_seq) == list(t.by_seq) and len(loaded) == len(t)
    for seq in t.by_seq:
        assert _state(loaded.get(seq)) == _state(t.get(seq))
    for mid in ("not-a-ulid", _ulid(5), _ulid(40)):
        assert (loaded.by_id.get(mid) is None) == (t.by_id.get(mid) is None)
    assert loaded.by_id["still-odd"].seq == 40 and loaded.by_id[_ulid(41)].seq == 41
    assert not (loaded.summary.keys() - set(t.by_seq)) and loaded.summary == t.summary


def test_a_compaction_s_row_segment_carries_the_new_locations():
    t = _table_of([_message(seq) for seq in (2, 3, 9)])
    locs = [location_from_parts([100 * i, 30, 5]) for i in range(3)]
    cols = t.segment_columns(t.live_seqs(), locs, [70, 71, 72])
    loaded = MessageTable()
    loaded.load_segments([(cols, [])], OTHER)
    assert [(m.text, m.rec_size, m.src) for m in loaded.by_seq.values()] == [(loc, n, OTHER) for loc, n in zip(locs, [70, 71, 72])]
    assert [(m.text, m.rec_size) for m in t.by_seq.values()] != [(m.text, m.rec_size) for m in loaded.by_seq.values()]


def test_a_row_segment_that_does_not_hold_together_is_refused():
    t = _table_of([_message(seq) for seq in (1, 2)])
    cols = t.segment_columns(t.live_seqs())
    keys = np.frombuffer(cols["keys"], "<u8")
    unsorted = keys[::-1].tobytes() if keys[0] != keys[1] else keys.tobytes()
    far = np.array([1, 99], "<u8").tobytes()
    for broken in ({**cols, "sids": []}, {**cols, "etype": cols["etype"][:1]}, {**cols, "tagsets": []},
                   {**cols, "keys": unsorted}, {**cols, "key_seqs": far}, {**cols, "key_seqs": far[:8]}):
        with pytest.raises(ValueError):
            MessageTable().load_segments([(broken, [])], SRC)
    with pytest.raises(ValueError):
        t.segment_columns(np.array([1, 5]))  # 5 holds no message


# ---------------------------------------------------------------- the narrow row (row segments of version 3)
WIDE = [{"importance": 255}, {"importance": -1}, {"revision": 2 ** 32 - 1}, {"revision": 2 ** 40, "importance": 7},
        {"revision": 2 ** 63 - 1, "importance": -(2 ** 63)}]


@pytest.mark.parametrize("variant", WIDE)
def test_a_revision_or_importance_the_narrow_row_cannot_hold_is_kept_whole(variant):
    """Only a hand-made log has them (the store counts revisions from 1; the contract's importance is
    0-100), yet they read back as they were: in the table, through a row segment, as a version 1 row,
    and gone with the row."""
    from storaged.columns import rows_from_columns

    msgs = [_message(1), _message(2, **variant), _message(3, importance=254, revision=2 ** 32 - 2)]
    t = _table_of(msgs)
    assert [_state(t.get(m.seq)) for m in msgs] == [_state(m) for m in msgs]
    assert list(t.wide) == [2]
    assert [t.importance(m.seq) for m in msgs] == [m.importance for m in msgs]   # read in place too
    assert t.importances(np.array([3, 1, 2])).tolist() == [msgs[2].importance, msgs[0].importance, msgs[1].importance]
    cols = t.segment_columns(t.live_seqs())
    loaded = MessageTable()
    loaded.load_segments([(cols, [])], SRC)
    assert loaded.importances(np.array([2, 3])).tolist() == [msgs[1].importance, msgs[2].importance]
    assert [_state(loaded.get(m.seq)) for m in msgs] == [_state(m) for m in msgs]
    assert rows_from_columns(cols) == [m.row() for m in msgs]
    t.put(_message(2, revision=2))          # a narrow revision of it: the wide entry goes
    assert not t.wide and t.get(2).revision == 2
    t.put(_message(3, **variant))
    t.drop(3)
    assert not t.wide


def test_a_value_beyond_64_bits_is_still_refused():
    t = MessageTable()
    for bad in ({"revision": 2 ** 64}, {"importance": 2 ** 63}, {"importance": -(2 ** 63) - 1}):
        with pytest.raises(ValueError):
            t.put(_message(1, **bad))
    assert len(t) == 0 and not t.wide


def test_ids_at_the_edges_of_128_bits():
    """The row holds a canonical id as its number: 26 digits whose first is at most 7. The smallest and
    largest such ids round-trip; one whose first digit is past 7 (130 bits) is an odd id, kept whole."""
    ids = ["0" * 26, "7" + "Z" * 25, "01ARZ3NDEKTSV4RRFFQ69G5FAV", "8" + "0" * 25, "Z" * 26]
    for mid in ids[:3]:
        assert columns.id_text(columns.id_raw(mid)) == mid
    t = MessageTable()
    for seq, mid in enumerate(ids, 1):
        t.put(_message(seq, mid))
    assert sorted(t.odd_id.values()) == ids[3:]
    for merged in (False, True):
        for seq, mid in enumerate(ids, 1):
            assert t.by_id[mid].seq == seq and t.message_id(seq) == mid
        t.merge_keys()
    assert t.by_id.get("0" * 25 + "1") is None
    loaded = MessageTable()
    loaded.load_segments([(t.segment_columns(t.live_seqs()), [])], SRC)
    assert [loaded.message_id(seq) for seq in range(1, 6)] == ids
    assert all(loaded.by_id[mid].seq == seq for seq, mid in enumerate(ids, 1))


def _as_version_2(cols, texts):
    """A version 3 segment's columns as the release before wrote them: 110-byte rows with the ids'
    characters (zeros for an odd id) and 64-bit revision, importance and record size; ``texts``
    (seq -> id) says what each row's id was, as version 2 rows spelled every canonical-looking one."""
    rows = np.frombuffer(cols["rows"], columns.ROW_DTYPE)
    seqs = np.frombuffer(cols["seqs"], "<u8").tolist()
    old = np.zeros(len(rows), columns.ROW_DTYPE_V2)
    for name in columns.ROW_DTYPE.names:
        if name != "id":
            old[name] = rows[name]
    wide = dict(cols["wide"])
    for i, seq in enumerate(seqs):
        if seq in wide:
            old["rev"][i], old["importance"][i] = wide[seq]
    old["id"] = [texts[seq].encode("ascii") if texts[seq].isascii() and len(texts[seq]) == 26
                 and texts[seq].upper() == texts[seq] else b"" for seq in seqs]
    odd = [[seq, mid] for seq, mid in cols["odd_ids"] if not old["id"][seqs.index(seq)]]
    out = {k: v for k, v in cols.items() if k != "wide"}
    return {**out, "rows": old.tobytes(), "odd_ids": odd, "version": 2}


def test_a_version_2_segment_is_converted_to_the_narrow_row():
    """What the release before wrote loads as the same messages: ids from their characters (one of 26
    valid digits past 7 becomes an odd id, as this release keeps it), revisions and importances past
    the narrow fields into ``wide``, the id lookup built from the same keys."""
    from storaged.columns import rows_from_columns

    msgs = [_message(seq, **VARIANTS[seq % len(VARIANTS)]) for seq in range(1, 20)]
    msgs += [_message(20, "odd-one"), _message(21, "9" + "0" * 25), _message(22, importance=300),
             _message(23, revision=2 ** 33)]
    t = _table_of(msgs)
    v3 = t.segment_columns(t.live_seqs())
    v2 = _as_version_2(v3, {m.seq: m.message_id for m in msgs})
    assert len(v2["rows"]) == len(msgs) * columns.ROW_DTYPE_V2.itemsize and v2["odd_ids"] == [[20, "odd-one"]]
    loaded = MessageTable()
    loaded.load_segments([(v2, [])], SRC)
    assert [_state(loaded.get(m.seq)) for m in msgs] == [_state(m) for m in msgs]
    assert loaded.odd_id == {20: "odd-one", 21: "9" + "0" * 25} and set(loaded.wide) == {22, 23}
    assert all(loaded.by_id[m.message_id].seq == m.seq for m in msgs)
    assert rows_from_columns(v2) == rows_from_columns(v3) == [m.row() for m in msgs]
