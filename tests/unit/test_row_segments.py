"""The snapshot's rows in row segments (snapshot format 6): a base, then deltas of what changed.

A snapshot writes only the rows written or changed since the one before it (and the seqs deleted
since); a start merges the segments by seq, the newest row of each winning. These check that the
merge gives exactly the state the log gives, that deltas are folded into a new base before they
grow, that a snapshot that is never installed hands its rows to the next one, and that a missing
or damaged segment makes the whole snapshot unused (the log is replayed), never a partial state.
"""
from __future__ import annotations

import os
from typing import Any

import msgpack
import pytest

from tests.support.faultio import delete, full_history, live_state, search, update, write
from storaged import layout, snapshot
from storaged import store as store_module
from storaged.fileio import FileIO
from storaged.store import Store

pytestmark = pytest.mark.unit


def seg_names(d: str) -> list[str]:
    return sorted(n for n in os.listdir(d) if n.startswith(layout.ROWS_PREFIX))


def tail_of(d: str, name: str) -> dict:
    with snapshot.Reader(FileIO(), os.path.join(d, "snapshot")) as reader:
        return next(seg.tail for seg, entry in zip(reader.segments, reader.row_segments) if entry[0] == name)


def seqs_of(d: str, name: str) -> list[int]:
    with snapshot.Reader(FileIO(), os.path.join(d, "snapshot")) as reader:
        return next(seg.seqs() for seg, entry in zip(reader.segments, reader.row_segments) if entry[0] == name)


def everything(s: Store):
    return live_state(s), full_history(s), search(s, query="row segment text"), s.last_seq


def reopened(s: Store) -> Store:
    d = s.dir
    s.close()
    return Store.open(d)


def test_a_snapshot_writes_only_what_changed_since_the_one_before(tmp_path):
    d = str(tmp_path)
    s = Store.open(d)
    ids = [write(s, f"s{i % 4}", f"row segment text {i} " + "x" * 200, tags=["t"])["message"]["message_id"]
           for i in range(40)]
    assert s.write_snapshot()
    [[base, n, dead]] = s.row_segments
    assert n == 41 and dead == 0 and seg_names(d) == [base]   # (a base's rows run from seq 0, never used)
    base_size = os.path.getsize(os.path.join(d, base))

    for mid in ids[:2]:
        update(s, mid, content="row segment text, changed")
    dead_seqs = sorted(s.by_id[mid].seq for mid in ids[5:8])
    for mid in ids[5:8]:
        delete(s, mid)
    new = [write(s, "s9", f"row segment text new {i}")["message"]["message_id"] for i in range(5)]
    update(s, new[0], summary="changed twice before the snapshot")
    assert s.write_snapshot()
    assert s.row_segments[0] == [base, 41, 0] and len(s.row_segments) == 2
    delta, n, dead = s.row_segments[1]
    assert dead == 3
    changed = sorted(s.by_id[mid].seq for mid in [*ids[:2], *new])
    assert n == 7 and seqs_of(d, delta) == changed and tail_of(d, delta)["dead"] == dead_seqs
    assert os.path.getsize(os.path.join(d, delta)) < base_size / 3
    assert seg_names(d) == sorted([base, delta])
    before = everything(s)

    s = reopened(s)
    assert s.snapshot_valid and s.snapshot_pos == s.log_size()
    assert everything(s) == before
    assert list(s.by_seq) == sorted(s.by_seq)  # merged by seq: creation order, as a replay gives
    assert s.row_segments == [[base, 41, 0], [delta, 7, 3]]
    # nothing changed since: the next snapshot names the same rows and writes none
    write(s, "s1", "row segment text after the restart")
    assert s.write_snapshot() and len(s.row_segments) == 3 and s.row_segments[2][1] == 1
    s.close()


def test_a_replayed_tail_goes_into_the_next_delta(tmp_path):
    """A start after a crash replays the log past the snapshot; what it replays is what the next
    snapshot's delta holds, and the start after that needs no replay."""
    d = str(tmp_path / "d")
    s = Store.open(d)
    ids = [write(s, "s", f"row segment text {i}")["message"]["message_id"] for i in range(20)]
    assert s.write_snapshot()
    update(s, ids[3], content="row segment text changed after the snapshot")
    delete(s, ids[4])
    write(s, "s2", "row segment text written after the snapshot")
    before = everything(s)
    s.writer.sync()
    crashed = str(tmp_path / "crashed")  # the files as they are, the process never closed
    os.system(f"cp -a {d} {crashed}")
    s.close()

    s = Store.open(crashed)
    assert s.snapshot_valid and s.snapshot_pos < s.log_size()
    assert everything(s) == before
    assert s.write_snapshot() and len(s.row_segments) == 2 and s.row_segments[1][1] == 2
    s = reopened(s)
    assert s.snapshot_pos == s.log_size() and everything(s) == before
    s.close()


def test_deltas_are_folded_into_a_new_base_before_they_grow(tmp_path, monkeypatch):
    d = str(tmp_path)
    s = Store.open(d)
    for i in range(30):
        write(s, "s", f"row segment text {i}")
    assert s.write_snapshot()
    lengths = []
    for round_ in range(2 * store_module.ROW_SEGMENTS_MAX):
        write(s, "s", f"row segment text round {round_}")
        assert s.write_snapshot()
        lengths.append(len(s.row_segments))
        assert seg_names(d) == sorted(entry[0] for entry in s.row_segments)  # the folded ones are removed
    assert max(lengths) == store_module.ROW_SEGMENTS_MAX and lengths.count(1) >= 1
    # half the base's rows in deltas: a new base too
    monkeypatch.setattr(store_module, "ROW_DELTA_MIN", 4)
    while len(s.row_segments) > 1:  # start from a fresh base
        write(s, "s", "row segment text filler")
        assert s.write_snapshot()
    base_rows, base_live = s.row_segments[0][1], len(s.by_id)
    n = 0
    while n < base_rows:
        for _ in range(4):
            n += 1
            write(s, "s", f"row segment text burst {n}")
        assert s.write_snapshot()
        if len(s.row_segments) == 1:
            break
        assert len(s.row_segments) < store_module.ROW_SEGMENTS_MAX
    # folded once the deltas' rows passed half the base's, before ROW_SEGMENTS_MAX files
    assert s.row_segments[0][1] == base_rows + n == s.table.base_rows() and len(s.by_id) == base_live + n
    assert base_rows // 2 < n <= base_rows // 2 + 4
    before = everything(s)
    s = reopened(s)
    assert everything(s) == before
    s.close()


def based_and_changed(d: str, n: int) -> Store:
    """A store of ``n`` messages with a base on disk, then its first message updated and its second
    deleted (what the next delta holds)."""
    s = Store.open(d)
    ids = [write(s, "s", f"row segment text {i}")["message"]["message_id"] for i in range(n)]
    assert s.write_snapshot()
    update(s, ids[0], content="row segment text changed")
    delete(s, ids[1])
    return s


def test_a_snapshot_never_installed_hands_its_rows_to_the_next(tmp_path, monkeypatch):
    d = str(tmp_path)
    s = based_and_changed(d, 10)
    # a planned snapshot that is dropped (a background child that failed, or was killed)
    s.abandon_snapshot(s.plan_snapshot(inline=True))
    # and one whose row segment could not be written
    real = snapshot.write_row_columns

    def failing(*args, **kwargs):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(snapshot, "write_row_columns", failing)
    write(s, "s", "row segment text during the failure")
    with pytest.raises(OSError):
        s.write_snapshot()
    monkeypatch.setattr(snapshot, "write_row_columns", real)
    assert len(s.row_segments) == 1 and seg_names(d) == [s.row_segments[0][0]]
    write(s, "s", "row segment text after it")
    before = everything(s)
    assert s.write_snapshot()
    assert len(s.row_segments) == 2 and s.row_segments[1][1] == 3
    s = reopened(s)
    assert s.snapshot_pos == s.log_size() and everything(s) == before
    s.close()


@pytest.mark.parametrize("damage", ["missing-delta", "flipped-base", "flipped-tail", "other-count", "other-dead",
                                    "no-segment"])
def test_a_missing_or_damaged_row_segment_makes_the_whole_snapshot_unused(tmp_path, damage):
    d = str(tmp_path)
    s = based_and_changed(d, 12)
    assert s.write_snapshot()
    [base, _, _], [delta, _, _] = s.row_segments
    before = everything(s)
    s.close()
    if damage == "missing-delta":
        os.remove(os.path.join(d, delta))
    elif damage in ("flipped-base", "flipped-tail"):
        # the rows, or the tail the start decodes and applies while the checksum is computed beside it
        path = os.path.join(d, base)
        data = bytearray(open(path, "rb").read())
        data[len(data) // 2 if damage == "flipped-base" else data.rfind(b"session_meta") + 2] ^= 0x01
        open(path, "wb").write(data)
    else:  # a manifest that says a segment holds other rows or dead seqs than it does, or names none
        meta, _, dump = snapshot.read(FileIO(), os.path.join(d, "snapshot"))
        if damage == "other-count":
            meta["rows"][0][1] += 1
        elif damage == "other-dead":
            meta["rows"][1][2] -= 1
        else:
            meta["rows"] = []
        snapshot.write(FileIO(), os.path.join(d, "snapshot"), meta, (), dump)
    s = Store.open(d)
    assert s.snapshot_valid is False and s.row_segments is None
    assert everything(s) == before
    # the next snapshot writes a base of its own; the next start uses it
    assert s.write_snapshot() and len(s.row_segments) == 1
    s = reopened(s)
    assert s.snapshot_valid and everything(s) == before
    s.close()


def test_a_manifest_cannot_name_a_file_outside_the_directory(tmp_path):
    d = str(tmp_path / "d")
    s = Store.open(d)
    write(s, "s", "row segment text")
    assert s.write_snapshot()
    before = everything(s)
    s.close()
    meta, _, dump = snapshot.read(FileIO(), os.path.join(d, "snapshot"))
    outside = tmp_path / "rows.0000000000000000.seg"
    os.rename(os.path.join(d, meta["rows"][0][0]), outside)
    meta["rows"][0][0] = "../" + outside.name
    snapshot.write(FileIO(), os.path.join(d, "snapshot"), meta, (), dump)
    s = Store.open(d)
    assert s.snapshot_valid is False and everything(s) == before
    s.close()


def test_opening_a_row_segment_reads_its_tail_without_decoding_its_rows(tmp_path):
    """A start opens every row segment first (to check it and read its tail), then loads the rows:
    the rows are decoded once, when they are loaded, not also at the open (a base holds millions).
    Shown with a row whose decoding fails (a map with an int key, which the decoder refuses): the
    open succeeds, reading the rows fails."""
    path = str(tmp_path / snapshot.rows_name())
    assert snapshot.write_rows(FileIO(), path, [[0, 1, 7, {1: 2}]], [3], base=False) == 1
    segment = snapshot._RowSegment(FileIO(), path)
    try:
        assert segment.tail == {"rows": 1, "dead": [3], "seqs": [7], "session_meta": [], "checkpoints": []}
        with pytest.raises(snapshot.SnapshotInvalid):
            list(segment.chunks())
    finally:
        segment.close()


def test_deleted_seqs_count_towards_folding_the_deltas(tmp_path, monkeypatch):
    """Each dead seq of a delta drops a row of the base that every start still decodes: after a mass
    delete, the next snapshot folds into a new base rather than carry them."""
    monkeypatch.setattr(store_module, "ROW_DELTA_MIN", 4)
    d = str(tmp_path)
    s = Store.open(d)
    ids = [write(s, "s", f"row segment text {i}")["message"]["message_id"] for i in range(40)]
    assert s.write_snapshot()
    for mid in ids[:10]:  # a quarter: a delta of 10 dead seqs
        delete(s, mid)
    assert s.write_snapshot() and len(s.row_segments) == 2 and s.row_segments[1][1:] == [0, 10]
    for mid in ids[10:21]:  # 10 + 11 > 40 // 2: folded
        delete(s, mid)
    assert s.write_snapshot() and s.row_segments == [[s.row_segments[0][0], 19, 0]]
    before = everything(s)
    s = reopened(s)
    assert everything(s) == before
    s.close()


def test_a_row_out_of_seq_order_goes_where_a_replay_puts_it(tmp_path):
    """A salvage that restored a message from its update (its write record lost) holds it last, with its
    old seq; a snapshot then lists it last too. Its session's seqs and turns must come out as a replay
    of the log gives them, not in the order the rows arrive."""
    d = str(tmp_path)
    s = Store.open(d)
    for i in range(6):
        write(s, "s", f"row segment text {i}", role="user" if i % 2 == 0 else "assistant")
    assert s.write_snapshot()
    s.close()
    path = os.path.join(d, "snapshot")
    meta, rows, dump = snapshot.read(FileIO(), path)
    snapshot.write(FileIO(), path, meta, [*rows[1:], rows[0]], dump)  # the first message's row last
    loaded = Store.open(d)
    assert loaded.snapshot_valid
    os.remove(path)
    replayed = Store.open(d)
    for st in (loaded, replayed):
        session = st.sessions["s"]
        assert list(session.seqs) == sorted(session.seqs) and list(session.turn_seqs) == sorted(session.turn_seqs)
    a, b = loaded.sessions["s"], replayed.sessions["s"]
    assert (a.seqs, a.turn_seqs, a.min_ts, a.max_ts, a.kind_counts) == (b.seqs, b.turn_seqs, b.min_ts, b.max_ts,
                                                                        b.kind_counts)
    loaded.close()
    replayed.close()


def test_a_background_snapshot_indexes_the_queue_and_writes_it_as_a_segment_of_its_own(tmp_path):
    """What a background snapshot's child does (here in-process): the messages still queued for the
    index are indexed in its copy and written as one more index segment, under the name the parent
    chose, so the snapshot leaves nothing queued and a start after a crash indexes only the log past it."""
    d = str(tmp_path)
    s = Store.open(d)
    ids = {f"qword{i}x": write(s, "s", f"qword{i}x row segment text")["message"]["message_id"] for i in range(30)}
    assert s.write_snapshot()  # a clean stop's snapshot (inline) leaves the queue as it is
    assert len(snapshot.read(FileIO(), os.path.join(d, "snapshot"))[0]["unindexed"]) == 30
    more = {f"qword{i}x": write(s, "s", f"qword{i}x row segment text")["message"]["message_id"] for i in range(30, 45)}
    ids.update(more)
    plan = s.plan_snapshot()
    assert plan.catchup_name is not None and s.unindexed
    tmp = os.path.join(d, layout.SNAPSHOT + layout.BACKGROUND_SUFFIX)
    pos = s.write_snapshot_file(tmp, plan)
    s.install_snapshot(tmp, pos, plan)
    meta, _, dump = snapshot.read(FileIO(), os.path.join(d, "snapshot"))
    assert meta["unindexed"] == [] and plan.catchup_name in [name for name, _, _ in dump["segments"]]
    assert plan.catchup_name in s.snapshot_segments and os.path.exists(os.path.join(d, plan.catchup_name))
    s.close()
    s = Store.open(d)
    assert not s.unindexed and s.snapshot_pos == s.log_size()
    for word, mid in ids.items():
        assert search(s, query=word)["results"][0]["message_id"] == mid, word
    # nothing queued: no catch-up segment is planned
    assert s.plan_snapshot().catchup_name is None
    s.close()


def test_a_background_snapshot_told_not_to_catch_up_leaves_the_queue_to_the_next_start(tmp_path):
    """What the loop asks for under a bulk import (a queue of SPLIT_MIN or more, which the loop and its
    catch-up children index anyway): the child writes no catch-up segment, the snapshot names the queued
    messages as unindexed, and the next start queues them again and finds them."""
    d = str(tmp_path)
    s = Store.open(d)
    ids = {f"qword{i}x": write(s, "s", f"qword{i}x row segment text")["message"]["message_id"] for i in range(30)}
    queued = list(s.unindexed)
    plan = s.plan_snapshot(catch_up=False)
    assert plan.catchup_name is None and list(s.unindexed) == queued
    tmp = os.path.join(d, layout.SNAPSHOT + layout.BACKGROUND_SUFFIX)
    pos = s.write_snapshot_file(tmp, plan)
    s.install_snapshot(tmp, pos, plan)
    meta, _, dump = snapshot.read(FileIO(), os.path.join(d, "snapshot"))
    assert sorted(meta["unindexed"]) == sorted(queued)
    s.close()
    s = Store.open(d)
    assert sorted(s.unindexed) == sorted(queued) and s.snapshot_pos == s.log_size()
    for word, mid in ids.items():
        assert search(s, query=word)["results"][0]["message_id"] == mid, word
    s.close()


def test_deltas_merge_into_the_base_chunk_by_chunk_in_seq_order(tmp_path, monkeypatch):
    """Rows a delta replaces fall in every chunk of the base (chunks of 4 here); each start gives the
    state a full replay of the log gives, rows in seq order."""
    monkeypatch.setattr(snapshot, "CHUNK", 4)
    d = str(tmp_path / "d")
    s = Store.open(d)
    ids = [write(s, f"s{i % 3}", f"row segment text {i}")["message"]["message_id"] for i in range(41)]
    assert s.write_snapshot()
    for round_ in range(3):
        for mid in ids[round_::5]:
            if mid in s.by_id:
                update(s, mid, content=f"row segment text changed in round {round_}")
        for mid in ids[round_ + 2::7]:
            if mid in s.by_id:
                delete(s, mid)
        write(s, "s9", f"row segment text new in round {round_}")
        assert s.write_snapshot()
    assert len(s.row_segments) == 4
    before = everything(s)
    s = reopened(s)
    assert s.snapshot_valid and everything(s) == before and list(s.by_seq) == sorted(s.by_seq)
    with snapshot.Reader(FileIO(), os.path.join(d, "snapshot")) as reader:
        merged = list(reader.rows())
    s.close()
    os.remove(os.path.join(d, "snapshot"))
    replayed = Store.open(d)
    assert merged == [m.row() for m in replayed.by_seq.values()]  # the same rows, the same order
    replayed.close()


def _ingest(s: Store, n: int, sid: str, key: str, value: dict | None) -> None:
    """One ingester batch: an event of ``sid``, the session's metadata, the file's checkpoint."""
    from protocol import wire
    from ulid import ULID

    ts = 1_767_225_600_000 + n * 1000
    event = {"message_id": str(ULID.from_bytes(((ts << 80) | n).to_bytes(16, "big"))), "session_id": sid,
             "timestamp": ts, "role": "user", "content": f"row segment text ingested {n}",
             "event": {"type": "user_input"}}
    args = {"messages": [event], "sessions": [{"session_id": sid, "harness": "codex", "source": "codex",
                                               "title": f"title {n}"}],
            "checkpoints": [{"source": "codex", "key": key, "value": value}]}
    assert s.import_messages(wire.validate_args("import_messages", args))["status"] == "OK"


def _meta_state(s: Store):
    return (s.session_meta, s.meta_rec_sizes, s.meta_bytes, s.ingest.checkpoints, s.ingest.rec_sizes,
            s.ingest.live_bytes, s.ingest.totals)


def test_session_metadata_and_checkpoints_go_in_the_row_segments_changed_ones_in_a_delta(tmp_path):
    """The manifest holds neither: a base's tail holds every session's metadata and every checkpoint,
    a delta's tail those that changed since (a forgotten checkpoint as nil), and a start applies them in
    order to the state a replay gives. A snapshot with only such changes still writes a delta."""
    d = str(tmp_path)
    s = Store.open(d)
    for n in range(6):
        _ingest(s, n, f"codex:s{n % 3}", f"/f{n % 4}.jsonl", {"offset": n})
    assert s.write_snapshot()
    meta = snapshot.read(FileIO(), os.path.join(d, "snapshot"))[0]
    assert meta["session_meta"] == [] and meta["checkpoints"] == []
    base = tail_of(d, s.row_segments[0][0])
    assert len(base["session_meta"]) == 3 and len(base["checkpoints"]) == 4
    _ingest(s, 10, "codex:s1", "/f1.jsonl", {"offset": 10})  # one session's metadata, one checkpoint
    _ingest(s, 11, "codex:s9", "/f2.jsonl", None)            # a new session; a checkpoint forgotten
    assert s.write_snapshot()
    delta = tail_of(d, s.row_segments[1][0])
    assert sorted(m[0] for m in delta["session_meta"]) == ["codex:s1", "codex:s9"]
    # the values as msgpack bytes (version 3: a start keeps them packed, builds no dict of each)
    assert [(c[1], c[2]) for c in delta["checkpoints"]] == [("/f1.jsonl", msgpack.packb({"offset": 10})),
                                                            ("/f2.jsonl", None)]
    assert all(m[1].__class__ is bytes and msgpack.unpackb(m[1])["harness"] for m in delta["session_meta"])
    # nothing but a checkpoint changed: a delta of no rows still carries it
    args = {"checkpoints": [{"source": "codex", "key": "/f3.jsonl", "value": {"offset": 99}}]}
    from protocol import wire
    assert s.import_messages(wire.validate_args("import_messages", args))["status"] == "OK"
    assert s.write_snapshot() and s.row_segments[2][1:] == [0, 0]
    state, before = _meta_state(s), everything(s)
    s = reopened(s)
    assert s.snapshot_pos == s.log_size() and _meta_state(s) == state and everything(s) == before
    s.close()
    os.remove(os.path.join(d, "snapshot"))
    replayed = Store.open(d)
    assert _meta_state(replayed) == state
    replayed.close()


def test_changed_metadata_of_a_snapshot_never_installed_goes_into_the_next(tmp_path):
    d = str(tmp_path)
    s = Store.open(d)
    _ingest(s, 0, "codex:a", "/a.jsonl", {"offset": 0})
    assert s.write_snapshot()
    _ingest(s, 1, "codex:b", "/b.jsonl", {"offset": 1})
    s.abandon_snapshot(s.plan_snapshot(inline=True))
    assert s.write_snapshot()
    delta = tail_of(d, s.row_segments[1][0])
    assert [m[0] for m in delta["session_meta"]] == ["codex:b"] and [c[1] for c in delta["checkpoints"]] == ["/b.jsonl"]
    state = _meta_state(s)
    s = reopened(s)
    assert _meta_state(s) == state
    s.close()


def test_a_row_segment_whose_head_lacks_a_section_is_refused_and_closed(tmp_path, monkeypatch):
    """A version 2 segment whose head does not give every section's length (a checksum that holds over
    a head this daemon does not understand) is invalid, like any damage: the open says so, and closing
    the file while views of its sections may still live never raises."""
    s = Store.open(str(tmp_path / "d"))
    for i in range(3):
        write(s, "s", f"row segment text {i}")
    cols = s.table.segment_columns(s.table.live_seqs())
    s.close()
    head = {k: v for k, v in cols.items() if k != "keys"}
    path = str(tmp_path / snapshot.rows_name())
    with monkeypatch.context() as m:  # a writer that knows one section fewer
        m.setattr(snapshot, "_COLUMN_SECTIONS", tuple(n for n in snapshot._COLUMN_SECTIONS if n != "keys"))
        snapshot.write_row_columns(FileIO(), path, head, [])
    with pytest.raises(snapshot.SnapshotInvalid):
        snapshot._RowSegment(FileIO(), path)


def _base_rewritten(tmp_path, batches: int, change) -> tuple[str, str, Any, Any]:
    """A store of ``batches`` ingester batches whose snapshot's base is written again with the tail's
    (metas, checkpoints) as ``change`` makes them: (directory, the base's name, the meta state and
    everything before)."""
    d = str(tmp_path)
    s = Store.open(d)
    for n in range(batches):
        _ingest(s, n, f"codex:s{n}", f"/f{n}.jsonl", {"offset": n})
    assert s.write_snapshot()
    state, before = _meta_state(s), everything(s)
    name = s.row_segments[0][0]
    metas, checkpoints = change(s.session_meta_entries(packed=True), s.ingest.dump(packed=True))
    columns = s.table.segment_columns(s.table.live_seqs(), holes=True)
    s.close()
    os.remove(os.path.join(d, name))
    snapshot.write_row_columns(FileIO(), os.path.join(d, name), columns, (), metas, checkpoints)
    return d, name, state, before


@pytest.mark.parametrize("where", ["session_meta", "checkpoints"])
def test_a_packed_tail_value_that_is_not_a_map_makes_the_snapshot_unusable(tmp_path, where):
    """A version 3 tail keeps each session's metadata and each checkpoint as msgpack bytes, stored as
    they are. Bytes that are not a map (a bug, or damage the checksum missed) are refused at the start,
    which replays the log instead: the state is the log's, never a value that fails when read."""
    def change(metas, checkpoints):
        if where == "session_meta":
            metas[0][1] = msgpack.packb(["not", "a", "map"])
        else:
            checkpoints[0][2] = msgpack.packb(7)
        return metas, checkpoints

    d, _, state, before = _base_rewritten(tmp_path, 3, change)
    again = Store.open(d)
    assert not again.snapshot_valid
    assert _meta_state(again) == state and everything(again) == before
    again.close()


def test_a_start_keeps_the_checkpoints_packed_and_takes_the_sums_from_the_manifest(tmp_path, monkeypatch):
    """The manifest carries the checkpoints' per-source sums (``ingest_totals``) and a tail each
    session's hot fields: a start keeps each checkpoint's and each session's bytes without unpacking
    one, and gets the sums and hot fields a replay computes. Sums that are not sums make the snapshot
    unused (the log is replayed)."""
    from storaged import ingeststate, packedmap

    d = str(tmp_path)
    s = Store.open(d)
    for n in range(6):
        _ingest(s, n, f"codex:s{n % 3}", f"/f{n % 4}.jsonl", {"offset": n, "events": n, "bytes": 10 * n})
    assert s.write_snapshot()
    _ingest(s, 10, "codex:s1", "/f1.jsonl", None)   # forgotten in a delta
    assert s.write_snapshot() and len(s.row_segments) == 2
    state, hot = _meta_state(s), {sid: s.session_meta.hot(sid) for sid in s.session_meta}
    assert s.ingest.totals["codex"]["files"] == 3 and s.ingest.totals["codex"]["events"] == 2 + 3 + 4
    assert set(hot.values()) == {("codex", "codex", None)}
    s.close()
    unpacked = []
    real = packedmap.unpack
    for module in (ingeststate, packedmap):
        monkeypatch.setattr(module, "unpack", lambda raw: unpacked.append(raw) or real(raw))
    again = Store.open(d)
    assert again.snapshot_valid and not unpacked
    monkeypatch.undo()
    assert _meta_state(again) == state and {sid: again.session_meta.hot(sid) for sid in again.session_meta} == hot
    again.close()
    meta, _, dump = snapshot.read(FileIO(), os.path.join(d, "snapshot"))
    meta["ingest_totals"]["codex"]["events"] = -1
    snapshot.write(FileIO(), os.path.join(d, "snapshot"), meta, (), dump)
    damaged = Store.open(d)
    assert not damaged.snapshot_valid and _meta_state(damaged) == state
    damaged.close()


def test_a_tail_without_the_hot_fields_is_read_and_replaced_by_a_base_with_them(tmp_path, monkeypatch):
    """A tail written before the hot fields were (an entry of three) is read by unpacking each
    session's metadata; the store is then due a snapshot, whose base has them, and the next start
    unpacks nothing."""
    from storaged import packedmap

    # the entries as the release before wrote them: three long
    d, name, state, before = _base_rewritten(tmp_path, 4, lambda metas, cps: ([m[:3] for m in metas], cps))
    old = Store.open(d)
    assert old.snapshot_valid and old.rows_legacy and old.snapshot_due()
    assert _meta_state(old) == state and everything(old) == before
    assert old.write_snapshot() and len(old.row_segments) == 1 and old.row_segments[0][0] != name
    old.close()
    unpacked = []
    real = packedmap.unpack
    monkeypatch.setattr(packedmap, "unpack", lambda raw: unpacked.append(raw) or real(raw))
    again = Store.open(d)
    assert again.snapshot_valid and not again.rows_legacy and not unpacked
    monkeypatch.undo()
    assert _meta_state(again) == state
    again.close()


def test_sums_past_msgpacks_integers_are_left_out_of_the_manifest_not_the_snapshot(tmp_path):
    """A client may checkpoint any count: two of 2**64 - 1 sum past what msgpack holds. The manifest
    then leaves the sums out (a start sums the checkpoints itself) rather than fail every snapshot."""
    d = str(tmp_path)
    s = Store.open(d)
    for n in range(2):
        _ingest(s, n, f"codex:s{n}", f"/f{n}.jsonl", {"bytes": 2**64 - 1})
    assert s.ingest.totals["codex"]["bytes"] == 2**65 - 2 and s.ingest.stored_totals() is None
    assert s.write_snapshot()
    state = _meta_state(s)
    assert snapshot.read(FileIO(), os.path.join(d, "snapshot"))[0]["ingest_totals"] is None
    s = reopened(s)
    assert s.snapshot_valid and s.snapshot_pos == s.log_size() and _meta_state(s) == state
    s.close()


def test_a_rebuild_writes_the_hot_fields_and_the_sums_too(tmp_path):
    """rebuild_index writes its own base: with the sessions' hot fields and the manifest's sums, so the
    start after it unpacks nothing and is due no base."""
    from storaged.compaction import rebuild

    d = str(tmp_path)
    s = Store.open(d)
    for n in range(3):
        _ingest(s, n, f"codex:s{n}", f"/f{n}.jsonl", {"offset": n, "events": 1})
    rebuild(s)
    state = _meta_state(s)
    assert all(len(entry) == 4 for entry in tail_of(d, s.row_segments[0][0])["session_meta"])
    assert snapshot.read(FileIO(), os.path.join(d, "snapshot"))[0]["ingest_totals"]["codex"]["events"] == 3
    s = reopened(s)
    assert s.snapshot_valid and not s.rows_legacy and not s.snapshot_due() and _meta_state(s) == state
    s.close()


def test_a_stop_leaves_a_due_base_to_the_next_start(tmp_path):
    """A stop of a daemon that snapshots in the background (``base_later``) writes a delta where a base
    is due — a base at five million events is ~10 s, past a supervisor's stop timeout — and the next
    start is due the base at once (its background snapshot writes it)."""
    d, name, state, before = _base_rewritten(tmp_path, 4, lambda metas, cps: ([m[:3] for m in metas], cps))
    s = Store.open(d)
    assert s.rows_legacy and s.base_due() and s.snapshot_due()
    _ingest(s, 9, "codex:s9", "/f9.jsonl", {"offset": 9})
    assert s.write_snapshot(base_later=True)
    assert s.row_segments[0][0] == name and len(s.row_segments) == 2   # the old base and a delta
    state = _meta_state(s)
    s = reopened(s)
    assert s.snapshot_valid and s.snapshot_pos == s.log_size() and _meta_state(s) == state
    assert s.base_due() and s.snapshot_due()
    assert s.write_snapshot() and len(s.row_segments) == 1 and s.row_segments[0][0] != name
    assert not s.base_due() and not s.snapshot_due()
    s.close()
