"""Message text read back from the log by offset (storaged/text.py): the locations point at the very
bytes, across restarts, snapshots, compaction and the migration of an older snapshot."""
from __future__ import annotations

import os
import struct

import msgpack
import pytest

from storaged import compaction, layout
from storaged import log as logfile
from storaged import snapshot
from storaged.store import Store
from storaged.text import TEXT_LEN_BITS, locate, span
from tests.support.faultio import delete, live_state, read, search, update, write

# lengths on each side of msgpack's str header sizes (1, 2, 3 and 5 bytes)
LENGTHS = [0, 1, 31, 32, 255, 256, 65535, 65536, 300_000]


def _texts():
    for n in LENGTHS:
        yield "a" * n
        yield ("é" * (n // 2 + 1))[: max(n // 2, 0)] or "é"
        yield ("語" * (n // 3 + 1))[: max(n // 3, 1)]


@pytest.mark.parametrize("form", [19, 16])
@pytest.mark.parametrize("tag", ["w", "u"])
@pytest.mark.parametrize("rid", [None, "01J00000000000000000000000"])
def test_locate_points_at_the_texts_bytes(form, tag, rid):
    for text in _texts():
        fields = ["01J00000000000000000000001", "session-" * 3, 123456789, 1_700_000_000_000, "assistant", text,
                  3, 1_700_000_000_001, None, ["t"], "short", "note", 2, None, [], []]
        if form == 19:
            fields += ["assistant_response", None, None]
        record = [tag, rid, fields] if tag == "w" else [tag, rid, 99999, fields]
        framed = logfile.encode_record(b"s" * 16, record)
        pos = 4096
        offset, length = span(locate(pos, record, text))
        raw = text.encode("utf-8")
        assert length == len(raw)
        assert framed[offset - pos: offset - pos + length] == raw
        assert msgpack.unpackb(framed[logfile.FRAME_SIZE:], raw=False) == record


def _texts_of(store):
    return {mid: m.content for mid, m in store.by_id.items()}


def test_text_is_not_held_in_memory_and_survives_every_way_of_opening(tmp_path):
    d = str(tmp_path)
    store = Store.open(d)
    big = "ツール出力 " * 9000 + "end"
    ids = [write(store, f"s{i % 3}", f"message {i} " + ("x" * (i * 97 % 5000)))["message"]["message_id"]
           for i in range(60)]
    ids.append(write(store, "s0", big)["message"]["message_id"])
    update(store, ids[3], content="a new text for three")
    delete(store, ids[4])
    expected = _texts_of(store)
    assert expected[ids[-1]] == big and expected[ids[3]] == "a new text for three"
    assert all(isinstance(m.text, int) for m in store.by_id.values())
    chunk = read(store, view="content", message_id=ids[-1], content_offset=6, content_limit=9)
    assert chunk["content_range"]["content"] == big.encode("utf-8")[6:15].decode("utf-8")

    # a restart without a snapshot (replay), then with one (rows hold locations), then after SIGKILL-like
    # loss of the snapshot's tail coverage (writes after the snapshot are replayed from their offsets)
    store.close()
    store = Store.open(d)
    assert _texts_of(store) == expected
    store.write_snapshot()
    late = write(store, "s9", "written after the snapshot")["message"]["message_id"]
    expected[late] = "written after the snapshot"
    store.close()
    store = Store.open(d)
    assert store.snapshot_valid and store.snapshot_pos > 0
    assert _texts_of(store) == expected
    assert all(isinstance(m.text, int) for m in store.by_id.values())

    # compaction writes a new log: every text is read from it (the old file is gone)
    old_inode = os.stat(store.log_path).st_ino
    compaction.rebuild(store)
    assert os.stat(store.log_path).st_ino != old_inode
    assert _texts_of(store) == expected
    after = write(store, "s1", "after the rebuild")["message"]["message_id"]
    expected[after] = "after the rebuild"
    store.close()
    store = Store.open(d)
    assert _texts_of(store) == expected
    store.close()


def test_an_older_snapshot_is_replaced_by_a_current_one_at_the_first_start(tmp_path):
    d = str(tmp_path)
    store = Store.open(d)
    for i in range(30):
        write(store, "s", f"text {i}")
    expected = _texts_of(store)
    store.write_snapshot()
    store.close()
    path = os.path.join(d, "snapshot")
    with open(path, "r+b") as f:  # the same file as a format-3 writer would have stamped it
        f.seek(8)
        f.write(struct.pack("<H", 3))
    store = Store.open(d)
    assert _texts_of(store) == expected
    assert not store.snapshot_outdated and store.snapshot_pos == store.log_size()
    with open(path, "rb") as f:
        assert struct.unpack_from("<H", f.read(10), 8)[0] == snapshot.VERSION
    store.close()
    store = Store.open(d)  # the rewritten snapshot is used
    assert store.snapshot_valid and store.snapshot_pos == store.log_size()
    assert _texts_of(store) == expected
    store.close()


def test_a_location_that_points_elsewhere_fails_to_read_instead_of_returning_other_bytes(tmp_path):
    import errno

    d = str(tmp_path)
    store = Store.open(d)
    a = store.by_id[write(store, "s", "first text " * 10)["message"]["message_id"]]
    b = store.by_id[write(store, "s", "second")["message"]["message_id"]]
    a.text += 1 << TEXT_LEN_BITS  # one byte further into the record: the str header no longer precedes it
    with pytest.raises(OSError) as exc:
        a.content
    assert exc.value.errno == errno.EIO
    b.text += 1  # a length the header does not say
    with pytest.raises(OSError):
        b.content
    store.close()


def test_bit_rot_before_the_snapshot_is_found_when_read_never_served_nor_copied(tmp_path):
    """A start with a snapshot does not re-read the log before the snapshot's position: a text that
    rots there is caught by the record's checksum when read, the store turns read-only (as for damage
    found at start), a rebuild refuses to copy it under a fresh checksum, and salvage repairs the log."""
    from storaged.salvage import salvage
    from storaged.text import TextDamaged

    d = str(tmp_path)
    store = Store.open(d)
    ids = [write(store, "s", f"text number {i} " * 20)["message"]["message_id"] for i in range(20)]
    victim = ids[7]
    offset, length = span(store.by_id[victim].text)
    store.write_snapshot()
    store.close()
    with open(os.path.join(d, "log"), "r+b") as f:
        f.seek(offset + 3)
        byte = f.read(1)
        f.seek(offset + 3)
        f.write(bytes((byte[0] ^ 0x01,)))  # still ASCII, still UTF-8: only the checksum can tell

    store = Store.open(d)
    assert store.snapshot_valid and store.corrupt is None  # the start did not look there
    assert store.by_id[ids[8]].content == "text number 8 " * 20
    with pytest.raises(TextDamaged):
        store.by_id[victim].content
    assert store.corrupt and "salvage" in store.last_error and store.health()["status"] == "DEGRADED"
    size = store.log_size()
    store.corrupt = None  # even if a rebuild were let through, it must not bless the rotten record
    with pytest.raises(TextDamaged):
        compaction.rebuild(store)
    assert store.log_size() == size and not os.path.exists(os.path.join(d, "log.compact"))
    store.close()

    result = salvage(d)
    assert result["damaged_ranges"] and result["messages"] == 19
    store = Store.open(d)
    assert store.corrupt is None and victim not in store.by_id
    assert all(store.by_id[m].content == f"text number {i} " * 20 for i, m in enumerate(ids) if m != victim)
    store.close()


def test_locations_in_a_log_of_many_gigabytes_survive_the_snapshot(tmp_path):
    """A location is wider than msgpack's 64-bit ints once the log passes 16 MiB: the snapshot stores it
    in parts, and it comes back the same."""
    from storaged.model import Message
    from storaged.text import location_from_parts, location_parts

    for pos in (0, 1 << 24, 5 << 30, (1 << 40) - 1):
        record = ["w", None, ["01J00000000000000000000001", "s", 1, 2, "user", "hi", 1, 2, None, [], "short",
                              "note", 0, None, [], [], "user_input", None, None]]
        loc = locate(pos, record, "hi")
        assert location_from_parts(location_parts(loc)) == loc and span(loc)[0] >= pos
    d = str(tmp_path)
    store = Store.open(d)
    write(store, "s", "a text")
    msg = next(iter(store.by_id.values()))
    far = locate(5 << 30, ["w", None, msg.fields()], msg.content)
    rows = [msg.row(far)]
    meta = store.snapshot_meta(store.salt, store.log_size())
    snapshot.write_file(store.io, os.path.join(d, "snap.test"), meta, rows, store.search.dump())
    _, back, _ = snapshot.read(store.io, os.path.join(d, "snap.test"))
    assert Message.from_row(back[0], store.log_text).text == far
    store.close()


def test_a_store_past_16_mib_snapshots_and_reopens(tmp_path):
    d = str(tmp_path)
    store = Store.open(d)
    big = "x" * (1 << 20) + "tail"
    for i in range(18):
        write(store, f"s{i % 2}", big[: (1 << 20) - 16] + str(i))
    last = write(store, "s", "after sixteen mebibytes")["message"]["message_id"]
    assert store.log_size() > 17 << 20
    expected = _texts_of(store)
    assert store.write_snapshot()
    store.close()
    store = Store.open(d)
    assert store.snapshot_valid and store.snapshot_pos == store.log_size()
    assert _texts_of(store) == expected and store.by_id[last].content == "after sixteen mebibytes"
    compaction.rebuild(store)
    assert _texts_of(store) == expected
    store.close()


def test_after_a_rebuild_messages_move_to_the_new_log_in_steps(tmp_path):
    """compaction.install switches the log at once but moves the messages' locations in steps between
    requests (Store.relocate_step); meanwhile every text reads right (unmoved ones from the old log,
    still open), mutations go on, no snapshot is written, and the accounting ends exact."""
    d = str(tmp_path / "data")
    store = Store.open(d)
    ids = [write(store, f"s{i % 3}", f"relocated text {i} " * 30)["message"]["message_id"] for i in range(100)]
    update(store, ids[0], content="changed before the rebuild")
    delete(store, ids[1])
    old_text = store.log_text
    compaction.install(store, compaction.prepare(store))
    assert store.relocation is not None and not store.snapshot_due()
    state = live_state(store)  # every text read, none moved yet: all from the old log
    assert len(state) == 99 and all(m.src is old_text for m in store.by_seq.values())
    assert store.relocate_step(10)
    update(store, ids[50], content="changed while messages move")   # not moved yet: replaced
    delete(store, ids[60])
    new_id = write(store, "s1", "written while messages move")["message"]["message_id"]
    while store.relocate_step(7):
        pass
    assert store.relocation is None
    assert all(m.src is store.log_text for m in store.by_seq.values())
    live = live_state(store)
    assert live[ids[50]]["content"] == "changed while messages move" and ids[60] not in live and new_id in live
    assert {k: v for k, v in live.items() if k not in (ids[50], ids[60], new_id)} == {
        k: v for k, v in state.items() if k not in (ids[50], ids[60])}
    live_bytes, dead = store.live_bytes, store.dead_bytes()
    assert store.snapshot_due() and store.write_snapshot()
    store.close()
    for from_snapshot in (True, False):  # from the snapshot, and replaying the whole log: the same figures
        if not from_snapshot:
            os.remove(os.path.join(d, layout.SNAPSHOT))
        again = Store.open(d)
        assert live_state(again) == live
        assert (again.live_bytes, again.dead_bytes()) == (live_bytes, dead)
        again.close()


def test_a_rebuild_frees_the_index_it_replaces_in_steps(tmp_path):
    """The old index's lists go to the new one's release queue (SearchIndex.retire), not freed at once
    on the request loop; searches are right meanwhile and the queue empties step by step."""
    store = Store.open(str(tmp_path / "data"))
    for i in range(300):
        write(store, "s", f"retired index word{i} common")
    old = store.search  # indexes the queue: the old index's live lists hold every message
    while not (old._prefix is not None and old._prefix.ready):  # a prefix query builds the sorted terms
        search(store, query="retir", limit=1)
    old_terms = len(old._vocab)
    compaction.install(store, compaction.prepare(store))
    new = store.search
    assert new is not old and old._vocab == {} and new._retired
    lists = [p for p in new._retired if hasattr(p, "vocab")]   # (beside them: the new segments' pages to let go)
    assert sum(len(p.vocab) for p in lists) >= old_terms
    assert search(store, query="word7", limit=5)["results"][0]["content"] == "retired index word7 common"
    prefix = next(p for p in lists if p.prefix is not None).prefix
    assert sum(map(len, prefix.runs)) >= 200  # the prefix-matchable terms ("word100".."word299" and more)
    while new._retired:
        new.release_step()
    assert not any(prefix.runs) and not prefix.side  # emptied in steps, not dropped whole
    assert search(store, query="word299", limit=5)["results"][0]["content"] == "retired index word299 common"
    assert new.doc_count() == 300
    store.close()


def test_a_clean_stop_in_the_middle_of_a_move_writes_rows_of_the_new_log_only(tmp_path):
    """write_snapshot (a clean stop) finishes the move before it writes rows; close() without a snapshot
    just drops the old log's reader. Either way the next open finds the state the store showed."""
    for snapshot_at_stop in (True, False):
        d = str(tmp_path / f"data-{snapshot_at_stop}")
        store = Store.open(d)
        ids = [write(store, "s", f"moved text {i} " * 20)["message"]["message_id"] for i in range(60)]
        delete(store, ids[3])  # the compacted log differs from the old one
        compaction.install(store, compaction.prepare(store))
        assert store.relocate_step(10)
        update(store, ids[40], content="changed mid-move")
        live = live_state(store)
        if snapshot_at_stop:
            assert not store.write_snapshot(relocate_max=5) and store.relocation_left() == 49  # too many to move
            assert store.write_snapshot(relocate_max=49) and store.relocation is None
        store.close()
        again = Store.open(d)
        assert again.snapshot_valid and live_state(again) == live
        again.close()
