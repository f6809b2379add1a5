"""The stores written by earlier releases (before issue 15's format change; before the search index's
segments; before row segments), opened in-process.

The same fixture and expectations as ``tests/process/test_release_store.py`` (``fixtures/make_store.py``
says how they were made), read through ``Store.open`` and ``Store.by_id`` instead of a daemon, so that a
migration that loses or alters something fails here in a second, with the message that differs.
"""
from __future__ import annotations

import os

import pytest

from protocol.history import FILE_FIELDS
from storaged.store import Store
from tests.support.release_store import (RELEASES, STORE, STORE_ROWS2, STORE_ROWS3, STORE_SNAP4, STORE_SNAP5,
                                         STORE_SNAP6, copy_store, without_event)

pytestmark = pytest.mark.unit


@pytest.fixture(params=sorted(RELEASES))
def release(request):
    return RELEASES[request.param]


@pytest.fixture
def opened(tmp_path, release):
    s = Store.open(str(copy_store(release[0], tmp_path / "d")))
    yield s, release[1]
    s.close()


def test_every_message_as_the_old_daemon_returned_it(opened):
    opened, EXPECTED = opened
    for m in EXPECTED["messages"]:
        assert opened.by_id[m["message_id"]].to_dict() == without_event(m)
    assert len(opened.by_id) == len(EXPECTED["messages"])
    assert not set(EXPECTED["deleted"]) & set(opened.by_id)


def test_counters_and_checkpoints_survive(opened):
    opened, EXPECTED = opened
    health = opened.health()
    assert (health["status"], health["last_error"]) == ("OK", "")
    assert {k: health[k] for k in EXPECTED["health"]} == EXPECTED["health"]
    for source, reply in EXPECTED["ingest_checkpoints"].items():
        assert opened.ingest.of_source(source) == reply["checkpoints"]


def test_the_first_start_migrates_the_snapshot_once(tmp_path):
    """The release's snapshot (format 3) holds texts, not their places in the log: the first start
    replays the log once and writes a snapshot of the current format, which the next start uses."""
    from storaged import snapshot

    d = copy_store(STORE, tmp_path / "d")
    with open(d / "snapshot", "rb") as f:
        assert snapshot.HEAD.unpack(f.read(snapshot.HEAD.size))[1] == 3
    first = Store.open(str(d))
    assert not first.snapshot_outdated and first.snapshot_pos == first.log_size()
    texts = {mid: m.content for mid, m in first.by_id.items()}
    first.close()
    with open(d / "snapshot", "rb") as f:
        assert snapshot.HEAD.unpack(f.read(snapshot.HEAD.size))[1] == snapshot.VERSION
    again = Store.open(str(d))
    assert again.snapshot_valid and again.snapshot_pos == again.log_size()
    assert {mid: m.content for mid, m in again.by_id.items()} == texts
    for m in RELEASES[STORE.name][1]["messages"]:
        assert again.by_id[m["message_id"]].to_dict() == without_event(m)
    again.close()


def test_a_snapshot_before_segments_is_read_as_it_is_and_the_next_one_writes_a_segment(tmp_path):
    """The release before segments wrote snapshot 4, whose dump holds every posting: the start reads it
    (no replay of what it covers), searches find what they found, and the next snapshot is a 6 whose
    postings are in a segment file (and its rows in a row segment, since 6), which the start after that maps."""
    from storaged import snapshot
    from storaged.search import _MemPart

    d = copy_store(STORE_SNAP4, tmp_path / "d")
    expected = RELEASES[STORE_SNAP4.name][1]
    first = Store.open(str(d))
    assert first.snapshot_valid and not first.snapshot_outdated and first.snapshot_pos < first.log_size()
    assert first.search.segment_names() == []
    words = {m["message_id"]: m["content"].split()[0] for m in expected["messages"] if m["content"].split()}

    def finds(store: Store) -> dict[str, bool]:
        seq_of = {mid: msg.seq for mid, msg in store.by_id.items()}
        return {mid: seq_of[mid] in {h.doc for h in store.search.search(w, 50)} for mid, w in words.items()}

    before = finds(first)
    assert sum(before.values()) >= len(before) // 2
    assert first.write_snapshot()  # as the daemon's clean stop does
    first.close()
    with open(d / "snapshot", "rb") as f:
        assert snapshot.HEAD.unpack(f.read(snapshot.HEAD.size))[1] == snapshot.VERSION == 6
    again = Store.open(str(d))
    names = again.search.segment_names()
    assert again.snapshot_valid and again.snapshot_pos == again.log_size() and len(names) == 1
    assert not any(isinstance(p, _MemPart) for p in again.search._parts)
    assert sorted(n for n in os.listdir(d) if n.startswith("index.")) == names
    # its rows are in one row segment (a base), which it names
    assert [n for n in os.listdir(d) if n.startswith("rows.")] == [again.row_segments[0][0]]
    assert again.row_segments[0][1] == again.table.base_rows() >= len(again.by_id)   # (its dead rows too)
    assert finds(again) == before
    for m in expected["messages"]:
        assert again.by_id[m["message_id"]].to_dict() == without_event(m)
    again.close()


def test_a_snapshot_with_inline_rows_is_read_as_it_is_and_the_next_one_writes_a_base_row_segment(tmp_path):
    """The release before row segments wrote snapshot 5 (rows inline, the index in segment files): the
    start reads it (no replay of what it covers), and the next snapshot is a 6 whose rows are one base
    row segment, which the start after that reads, with the same messages and searches."""
    from storaged import snapshot

    d = copy_store(STORE_SNAP5, tmp_path / "d")
    expected = RELEASES[STORE_SNAP5.name][1]
    with open(d / "snapshot", "rb") as f:
        assert snapshot.HEAD.unpack(f.read(snapshot.HEAD.size))[1] == 5
    first = Store.open(str(d))
    assert first.snapshot_valid and not first.snapshot_outdated and first.snapshot_pos < first.log_size()
    assert first.row_segments is None and first.search.segment_names()
    hits = {w: [h.doc for h in first.search.search(w, 50)] for w in ("migration", "移行", "postgres")}
    assert all(hits.values())
    assert first.write_snapshot()
    first.close()
    with open(d / "snapshot", "rb") as f:
        assert snapshot.HEAD.unpack(f.read(snapshot.HEAD.size))[1] == snapshot.VERSION == 6
    again = Store.open(str(d))
    assert again.snapshot_valid and again.snapshot_pos == again.log_size()
    [[name, n, _]] = again.row_segments
    assert n == again.table.base_rows() and len(again.by_id) == len(expected["messages"]) and (d / name).exists()
    assert {w: [h.doc for h in again.search.search(w, 50)] for w in hits} == hits
    for m in expected["messages"]:
        assert again.by_id[m["message_id"]].to_dict() == without_event(m)
    again.close()


def test_the_release_before_per_slot_segments_is_read_and_its_slots_carried_until_merged(tmp_path):
    """The release before wrote index segments of version 1 (postings only) and a search dump (/3)
    holding every slot's doc and lengths: the start reads both, and a dump (/4) made while those
    segments are still in use holds their per-slot tables itself (nothing else does). The next
    snapshot merges them into a segment of the current version (2 then, 3 now: with window bounds),
    after which the dump holds none, and the start
    after it has the same tables and answers with the same docs (a merge drops dead postings, so the
    scores move with the df)."""
    from storaged import search as search_mod
    from storaged import segment as segment_mod

    d = copy_store(STORE_SNAP6, tmp_path / "d")
    expected = RELEASES[STORE_SNAP6.name][1]
    first = Store.open(str(d))
    assert first.snapshot_valid and not first.snapshot_outdated
    index = first.search
    assert index._parts and all(p.version == 1 for p in index._parts)
    hits = {w: [h.doc for h in index.search(w, 50)] for w in ("migration", "移行", "postgres")}
    assert all(hits.values())
    tables = (bytes(index._slot_doc), [bytes(x) for x in index._lens], bytes(index._alive))
    dump = index.dump()
    assert dump["format"] == search_mod._FORMAT
    assert [(lo, hi) for lo, hi, _, _ in dump["docs"]] == [(0, len(index._slot_doc))]
    back = search_mod.SearchIndex.load(dump, first.dir, first.io)
    assert (bytes(back._slot_doc), [bytes(x) for x in back._lens], bytes(back._alive)) == tables
    assert {w: [h.doc for h in back.search(w, 50)] for w in hits} == hits
    assert first.write_snapshot()
    first.close()
    again = Store.open(str(d))
    assert again.snapshot_valid and again.snapshot_pos == again.log_size()
    index = again.search
    assert index._parts and all(p.version == segment_mod.VERSION for p in index._parts)
    assert index.dump()["docs"] == []
    assert (bytes(index._slot_doc), [bytes(x) for x in index._lens], bytes(index._alive)) == tables
    assert {w: [h.doc for h in index.search(w, 50)] for w in hits} == hits
    for m in expected["messages"]:
        assert again.by_id[m["message_id"]].to_dict() == without_event(m)
    again.close()


@pytest.mark.parametrize("store, version", [(STORE_SNAP6, 1), (STORE_ROWS2, 2), (STORE_ROWS3, 3)],
                         ids=["rows v1", "rows v2", "rows v3"])
def test_row_segments_of_an_earlier_release_are_read_and_the_next_snapshot_writes_a_current_base(tmp_path, store,
                                                                                                  version):
    """Three releases wrote earlier row segments: version 1 (msgpack rows, read a row at a time), version
    2 (110-byte packed rows, converted in numpy: the id's characters to its number, the 64-bit revision,
    importance and record size narrowed) and version 3 (the exts with files as lists in the head, taken
    into the table as tuples, where version 4 keeps them packed). The start reads them, and the next snapshot, even one that
    would have been a small delta, writes a base of the current version, which the start after it loads
    as columns, with the same messages, sessions and searches."""
    from storaged import snapshot

    d = copy_store(store, tmp_path / "d")
    expected = RELEASES[store.name][1]

    def versions() -> list[int]:
        out = []
        for name in sorted(n for n in os.listdir(d) if n.startswith("rows.")):
            with open(d / name, "rb") as f:
                out.append(snapshot.HEAD.unpack(f.read(snapshot.HEAD.size))[1])
        return out

    assert versions() and set(versions()) == {version}
    first = Store.open(str(d))
    assert first.snapshot_valid and first.rows_legacy
    sessions = {sid: (list(s.seqs), s.turn_seqs, s.min_ts, s.max_ts, s.kind_counts, s.tool_calls, s.summary_seqs)
                for sid, s in first.sessions.items()}
    hits = {w: [h.doc for h in first.search.search(w, 50)] for w in ("migration", "移行", "postgres")}
    for m in expected["messages"]:
        assert first.by_id[m["message_id"]].to_dict() == without_event(m)
    assert first.write_snapshot()
    first.close()
    assert versions() == [snapshot.ROWS_VERSION]
    with snapshot.Reader(first.io, str(d / "snapshot")) as reader:
        assert reader.columnar() and not reader.rows_outdated()
    again = Store.open(str(d))
    assert again.snapshot_valid and not again.rows_legacy and len(again.row_segments) == 1
    assert {sid: (list(s.seqs), s.turn_seqs, s.min_ts, s.max_ts, s.kind_counts, s.tool_calls, s.summary_seqs)
            for sid, s in again.sessions.items()} == sessions
    files = {m["message_id"]: [dict(zip(FILE_FIELDS, f)) for f in again.by_id[m["message_id"]].ext[3]]
             for m in expected["messages"] if (m.get("event") or {}).get("files")}
    assert files and files == {m["message_id"]: m["event"]["files"] for m in expected["messages"]
                               if (m.get("event") or {}).get("files")}
    assert sorted(again.table.ext_files) == sorted(again.by_id[mid].seq for mid in files)
    assert {w: [h.doc for h in again.search.search(w, 50)] for w in hits} == hits
    for m in expected["messages"]:
        assert again.by_id[m["message_id"]].to_dict() == without_event(m)
    assert len(again.by_id) == len(expected["messages"])
    again.close()
