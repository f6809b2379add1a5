"""Recovery at start: torn tails, bit flips, mid-log damage, salvage, snapshots, restarts, leftovers, salt."""
from __future__ import annotations

import glob
import os
import random
import shutil
import struct
import zlib

import msgpack
import pytest

from tests.support.faultio import STATE_FIGURES, delete, full_history, live_state, read, search, update, write
from protocol import errors as E
from protocol.errors import ProtocolError
from storaged import compaction
from storaged import log as logfile
from storaged import records
from storaged import snapshot
from storaged.fileio import FileIO
from storaged.salvage import salvage
from storaged.store import Store

pytestmark = pytest.mark.timeout(120)


def record_bounds(buf: bytes) -> list[tuple[int, int]]:
    """(start, end) of every record of an intact log."""
    salt = logfile.parse_header(buf)
    out, pos = [], logfile.HEADER_SIZE
    result = logfile.ScanResult()
    for offset, size, _ in logfile.scan(buf, salt, pos, result):
        assert offset == pos
        out.append((pos, pos + size))
        pos += size
    assert pos == len(buf) and not result.torn_tail and result.damage is None
    return out


def figures(store) -> dict:
    h = store.health()
    return {k: h[k] for k in STATE_FIGURES}


def put_log(d: str, data: bytes) -> None:
    for name in os.listdir(d):
        if name not in ("cursor.key", "log"):
            os.unlink(os.path.join(d, name))
    path = os.path.join(d, "log")
    with open(path, "r+b" if os.path.exists(path) else "wb") as f:  # no truncation to zero: it is slow
        f.write(data)
        f.truncate(len(data))


class QuickIO(FileIO):
    """FileIO without the real fdatasync (counted all the same): for loops of thousands of restarts
    whose subject is the recovery logic, not the disk."""

    def sync(self, fd):
        self.counters.flush_calls += 1


def err(fn, *a, **kw) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        fn(*a, **kw)
    return info.value


# ------------------------------------------------------------------------------------- the torn tail
LAST_OPS = {
    "write": lambda s, ids: write(s, "s", "the last one 日本語😀", tags=["x"]),
    "update": lambda s, ids: update(s, ids[2], content="updated at the end", importance=7),
    "delete": lambda s, ids: delete(s, ids[3]),
}


def build(d: str, last: str):
    s = Store.open(d)
    ids = [write(s, f"s{i % 2}", f"message {i} " + "é" * i, summary=f"sum {i}")["message"]["message_id"]
           for i in range(6)]
    update(s, ids[0], content="first edit")
    delete(s, ids[5])
    before_state, before_figures = live_state(s), figures(s)
    LAST_OPS[last](s, ids)
    after_state = live_state(s)
    s.close()
    with open(os.path.join(d, "log"), "rb") as f:
        data = f.read()
    return data, before_state, before_figures, after_state


def check_recovers_previous(d, data, before_state, before_figures, io_class=QuickIO):
    io = io_class()
    s = Store.open(d, io=io)
    try:
        assert s.recovered_tail is True and io.counters.truncate_calls == 1
        assert live_state(s) == before_state
        assert figures(s) == before_figures
        assert os.path.getsize(os.path.join(d, "log")) == before_figures["log_size"]
    finally:
        s.close()


@pytest.mark.parametrize("last", sorted(LAST_OPS))
def test_truncation_at_every_offset_of_the_last_record(tmp_path, last):
    d = str(tmp_path)
    data, before_state, before_figures, after_state = build(d, last)
    start, end = record_bounds(data)[-1]
    assert start == before_figures["log_size"] and end == len(data)
    for cut in range(start + 1, end):
        put_log(d, data[:cut])
        check_recovers_previous(d, data, before_state, before_figures, FileIO if cut == start + 1 else QuickIO)
    # the untouched log and the log cut exactly at a record boundary need no repair
    for size, state in ((end, after_state), (start, before_state)):
        put_log(d, data[:size])
        io = FileIO()
        s = Store.open(d, io=io)
        assert not s.recovered_tail and io.counters.truncate_calls == 0 and live_state(s) == state
        s.close()


@pytest.mark.parametrize("last", sorted(LAST_OPS))
def test_every_bit_flip_in_the_last_record(tmp_path, last):
    d = str(tmp_path)
    data, before_state, before_figures, _ = build(d, last)
    start, end = record_bounds(data)[-1]
    for pos in range(start, end):
        for bit in range(8):
            damaged = bytearray(data)
            damaged[pos] ^= 1 << bit
            put_log(d, bytes(damaged))
            check_recovers_previous(d, data, before_state, before_figures)


def test_zero_filled_and_garbage_tails(tmp_path):
    d = str(tmp_path)
    data, before_state, before_figures, _ = build(d, "write")
    start, end = record_bounds(data)[-1]
    rng = random.Random(7)
    for n in (1, 7, 8, 9, end - start - 1, end - start, 4096):
        for tail in (bytes(n), rng.randbytes(n), b"\xff" * n):
            put_log(d, data[:start] + tail)
            check_recovers_previous(d, data, before_state, before_figures)


def test_after_tail_recovery_the_store_is_writable_and_clean(tmp_path):
    d = str(tmp_path)
    data, before_state, _, _ = build(d, "write")
    start, end = record_bounds(data)[-1]
    put_log(d, data[:end - 3])
    s = Store.open(d)
    m = write(s, "s", "after recovery")["message"]
    s.close()
    io = FileIO()
    s = Store.open(d, io=io)
    assert not s.recovered_tail and io.counters.truncate_calls == 0
    assert live_state(s) == dict(before_state, **{m["message_id"]: m})
    s.close()


# ------------------------------------------------------------------------------------- mid-log damage
def damaged_store(tmp_path, victim_index: int, n: int = 8):
    """A log of ``n`` writes (plus an update and a delete of other messages) with one byte flipped
    inside record ``victim_index``. Returns (dir, damaged bytes, bounds, states after each record)."""
    d = str(tmp_path / "data")
    s = Store.open(d)
    states = [{}]
    ids = []
    for i in range(n):
        ids.append(write(s, "s", f"message number {i}", tags=[f"t{i}"])["message"]["message_id"])
        states.append(live_state(s))
    update(s, ids[1], content="message number 1, edited")
    states.append(live_state(s))
    delete(s, ids[2])
    states.append(live_state(s))
    s.close()
    data = open(os.path.join(d, "log"), "rb").read()
    bounds = record_bounds(data)
    a, b = bounds[victim_index]
    damaged = bytearray(data)
    damaged[a + (b - a) // 2] ^= 0x5A
    with open(os.path.join(d, "log"), "wb") as f:
        f.write(damaged)
    return d, bytes(damaged), bounds, states, ids


@pytest.mark.parametrize("victim", [0, 1, 4])
def test_mid_log_damage_degrades_serves_and_touches_nothing(tmp_path, victim):
    d, damaged, bounds, states, ids = damaged_store(tmp_path, victim)
    io = FileIO()
    s = Store.open(d, io=io)
    h = s.health()
    a, b = bounds[victim]
    assert h["status"] == "DEGRADED" and f"{a}-{b}" in h["last_error"]
    assert live_state(s) == states[victim]  # the records before the damage are served
    assert read(s, session_id="s")["history"] == list(states[victim].values())
    if victim:
        assert search(s, query="message")["results"]
    for attempt in (lambda: write(s, "s", "new"), lambda: update(s, ids[0], content="x"),
                    lambda: delete(s, ids[0]), lambda: compaction.rebuild(s)):
        assert err(attempt).code == E.CORRUPT_STORE
    assert s.write_snapshot() is False
    s.close()
    assert io.counters.write_calls == 0 and io.counters.truncate_calls == 0
    assert open(os.path.join(d, "log"), "rb").read() == damaged
    assert not os.path.exists(os.path.join(d, "snapshot"))
    # and again: a second start sees the same thing
    s = Store.open(d)
    assert s.health()["status"] == "DEGRADED" and live_state(s) == states[victim]
    s.close()
    assert open(os.path.join(d, "log"), "rb").read() == damaged


def test_damaged_header_is_degraded_not_recreated(tmp_path):
    d = str(tmp_path)
    s = Store.open(d)
    write(s, "s", "x")
    s.close()
    path = os.path.join(d, "log")
    data = bytearray(open(path, "rb").read())
    data[3] ^= 1
    open(path, "wb").write(data)
    s = Store.open(d)
    h = s.health()
    assert h["status"] == "DEGRADED" and "0-32" in h["last_error"] and h["active_messages"] == 0
    assert err(write, s, "s", "y").code == E.CORRUPT_STORE
    s.close()
    assert open(path, "rb").read() == bytes(data)
    with pytest.raises(Exception):
        salvage(d)
    assert open(path, "rb").read() == bytes(data)


def test_salvage_recovers_every_intact_record(tmp_path):
    victim = 4  # the write of message 4: every other record is intact
    d, damaged, bounds, states, ids = damaged_store(tmp_path, victim)
    full = states[-1]
    report = salvage(d)
    copies = glob.glob(os.path.join(d, "log.damaged-*"))
    assert len(copies) == 1 and open(copies[0], "rb").read() == damaged
    assert report["damaged_copy"] == copies[0]
    io = FileIO()
    s = Store.open(d, io=io)
    h = s.health()
    assert h["status"] == "OK" and h["last_error"] == "" and not s.recovered_tail
    expected = {k: v for k, v in full.items() if k != ids[victim]}
    assert live_state(s) == expected
    assert h["dead_bytes"] == 0
    m = write(s, "s", "after salvage")["message"]
    s.close()
    s = Store.open(d)
    assert live_state(s) == dict(expected, **{m["message_id"]: m})
    assert s.health()["status"] == "OK"
    s.close()


def test_salvage_of_a_lost_update_keeps_the_previous_version(tmp_path):
    d, damaged, bounds, states, ids = damaged_store(tmp_path, 8)  # record 8 is the update of message 1
    salvage(d)
    s = Store.open(d)
    assert s.by_id[ids[1]].to_dict() == states[8][ids[1]]  # revision 1, as before the lost update
    assert ids[2] not in s.by_id  # the later delete was intact
    assert s.health()["status"] == "OK"
    s.close()


def test_salvage_of_a_torn_tail_and_of_a_clean_log(tmp_path):
    d = str(tmp_path)
    data, before_state, _, after_state = build(d, "write")
    salvage(d)
    s = Store.open(d)
    assert live_state(s) == after_state and s.health()["status"] == "OK"
    s.close()
    put_log(d, data[:-5])
    salvage(d)
    s = Store.open(d)
    assert live_state(s) == before_state and s.health()["status"] == "OK"
    s.close()


# ------------------------------------------------------------------------------------- records of the wrong shape
# Checksum fine, shape wrong (or a kind this daemon does not know): treated exactly like a bad record.
WRONG_SHAPES = {
    "message-of-10-fields": lambda f: ["w", None, f[:10]],
    "content-not-a-string": lambda f: records.write(None, f[:records.CONTENT] + [123] + f[records.CONTENT + 1:]),
    "delete-seq-a-string": lambda f: ["d", None, "7", f[records.MESSAGE_ID], 0],
    "unknown-tag": lambda f: ["z", None, "a record of a newer daemon"],
}


def shaped_store(tmp_path, shape: str, at: int | None, n: int = 6):
    """A log of ``n`` writes with a well-checksummed record of the wrong ``shape`` spliced in before
    record ``at`` (None: at the end). Returns (dir, the log's bytes, (start, end) of the bad record,
    the states after each good record, the good log's bytes)."""
    d = str(tmp_path / "data")
    s = Store.open(d)
    states = [{}]
    for i in range(n):
        write(s, "s", f"message number {i}", tags=[f"t{i}"])
        states.append(live_state(s))
    fields = next(iter(s.by_id.values())).fields()
    s.close()
    path = os.path.join(d, "log")
    good = open(path, "rb").read()
    salt = logfile.parse_header(good)
    bad = logfile.encode_record(salt, WRONG_SHAPES[shape](fields))
    pos = record_bounds(good)[at][0] if at is not None else len(good)
    data = good[:pos] + bad + good[pos:]
    put_log(d, data)
    return d, data, (pos, pos + len(bad)), states, good


@pytest.mark.parametrize("shape", sorted(WRONG_SHAPES))
def test_a_record_of_the_wrong_shape_mid_log_degrades(tmp_path, shape):
    d, data, (a, b), states, _ = shaped_store(tmp_path, shape, at=3)
    s = Store.open(d)
    h = s.health()
    assert h["status"] == "DEGRADED" and f"{a}-{b}" in h["last_error"]
    assert live_state(s) == states[3]  # served: the records before it
    assert read(s, session_id="s")["history"] == list(states[3].values())
    assert err(write, s, "s", "new").code == E.CORRUPT_STORE
    s.close()
    assert open(os.path.join(d, "log"), "rb").read() == data  # not touched


@pytest.mark.parametrize("shape", sorted(WRONG_SHAPES))
def test_a_record_of_the_wrong_shape_at_the_end_is_a_torn_tail(tmp_path, shape):
    d, data, (a, b), states, good = shaped_store(tmp_path, shape, at=None)
    s = Store.open(d)
    assert s.recovered_tail and s.health()["status"] == "OK" and live_state(s) == states[-1]
    assert os.path.getsize(os.path.join(d, "log")) == a == len(good)
    write(s, "s", "after the cut")
    s.close()


@pytest.mark.parametrize("shape", sorted(WRONG_SHAPES))
def test_salvage_skips_a_record_of_the_wrong_shape_and_keeps_every_other(tmp_path, shape):
    d, data, (a, b), states, _ = shaped_store(tmp_path, shape, at=2)
    report = salvage(d)
    assert report["damaged_ranges"] == [[a, b]] and report["records_recovered"] == len(states) - 1
    s = Store.open(d)
    assert s.health()["status"] == "OK" and live_state(s) == states[-1]
    s.close()


# ------------------------------------------------------------------------------------- snapshots
def make_snapshotted(d: str):
    s = Store.open(d)
    ids = [write(s, f"s{i % 3}", f"snapshot test {i}", tags=["a"], importance=i)["message"]["message_id"]
           for i in range(10)]
    update(s, ids[0], content="edited")
    delete(s, ids[1])
    assert s.write_snapshot()
    write(s, "s0", "after the snapshot")  # replayed from the log after the snapshot's position
    update(s, ids[2], summary="later summary")
    delete(s, ids[3])
    state, figs, hist = live_state(s), figures(s), full_history(s)
    hits = search(s, query="snapshot test")
    s.close()
    return state, figs, hist, hits


def assert_same(s, state, figs, hist, hits):
    assert live_state(s) == state
    assert figures(s) == figs
    assert full_history(s) == hist
    assert search(s, query="snapshot test") == hits


def test_valid_snapshot_is_used(tmp_path):
    d = str(tmp_path)
    expected = make_snapshotted(d)
    s = Store.open(d)
    assert s.snapshot_valid and s.snapshot_pos > logfile.HEADER_SIZE
    assert_same(s, *expected)
    s.close()


@pytest.mark.parametrize("damage", ["body-flip", "trailer-flip", "head-flip", "truncated", "empty", "garbage",
                                    "other-log"])
def test_bad_snapshot_falls_back_to_full_replay(tmp_path, damage):
    d = str(tmp_path / "data")
    expected = make_snapshotted(d)
    path = os.path.join(d, "snapshot")
    data = bytearray(open(path, "rb").read())
    if damage == "body-flip":
        data[len(data) // 2] ^= 0x10
    elif damage == "trailer-flip":
        data[-10] ^= 1
    elif damage == "head-flip":
        data[2] ^= 1
    elif damage == "truncated":
        data = data[:-30]
    elif damage == "empty":
        data = b""
    elif damage == "garbage":
        data = random.Random(1).randbytes(len(data))
    elif damage == "other-log":  # a valid snapshot of another store (another salt)
        other = str(tmp_path / "other")
        make_snapshotted(other)
        data = open(os.path.join(other, "snapshot"), "rb").read()
    open(path, "wb").write(data)
    s = Store.open(d)
    assert s.health()["snapshot_valid"] is False
    assert_same(s, *expected)
    s.close()


def test_a_snapshot_whose_rows_fail_half_way_is_dropped_whole(tmp_path):
    """The rows are decoded and loaded a chunk at a time (snapshot.Reader), so a row that cannot be
    loaded although the checksum holds (a bug, a checksum collision) is met after others were loaded:
    the start drops all of them and replays the whole log, as for any unusable snapshot."""
    d = str(tmp_path)
    expected = make_snapshotted(d)
    break_last_row(d)
    s = Store.open(d)
    assert s.health()["snapshot_valid"] is False
    assert_same(s, *expected)
    s.close()


def break_last_row(d: str) -> None:
    """Rewrite the snapshot with its rows inline, the last one too short to be a message row."""
    path = os.path.join(d, "snapshot")
    meta, rows, dump = snapshot.read(FileIO(), path)
    assert len(rows) >= 3
    rows[-1] = rows[-1][:3]  # too few fields for a message row
    snapshot.write(FileIO(), path, meta, rows, dump)


def test_a_snapshot_dropped_half_way_leaves_no_descriptor_open(tmp_path):
    """The start that drops a half-loaded snapshot begins again from a fresh state: the log
    descriptor it had opened is closed, not left open for the daemon's life (which would also keep
    a rebuilt-away log's blocks from being freed)."""
    d = str(tmp_path)
    make_snapshotted(d)
    break_last_row(d)
    before = sorted(os.listdir("/proc/self/fd"))
    s = Store.open(d)
    assert s.snapshot_valid is False
    s.close()
    assert sorted(os.listdir("/proc/self/fd")) == before


def test_inline_snapshot_rows_stream_in_chunks_of_at_most_chunk_rows(tmp_path, monkeypatch):
    """A snapshot with its rows inline (a tool's, or a release before row segments) streams them a
    chunk at a time, and the next snapshot writes them as a base row segment."""
    monkeypatch.setattr(snapshot, "CHUNK", 2)
    d = str(tmp_path)
    expected = make_snapshotted(d)
    path = os.path.join(d, "snapshot")
    meta, rows, dump = snapshot.read(FileIO(), path)
    snapshot.write(FileIO(), path, meta, rows, dump)
    with snapshot.Reader(FileIO(), path) as reader:
        assert reader.row_segments is None and reader.meta["chunks"] == (len(rows) + 1) // 2 >= 2
        assert list(reader.rows()) == rows
    s = Store.open(d)
    assert s.snapshot_valid and s.row_segments is None
    assert_same(s, *expected)
    write(s, "s", "one more")
    # (a base's rows: one a seq from the first live one to the last, the deleted ones between included)
    assert s.write_snapshot() and len(s.row_segments) == 1 and s.row_segments[0][1] == s.table.base_rows()
    span = s.table.live_span()
    assert span[1] - span[0] == s.table.base_rows() > len(s.by_id)
    s.close()


# Words whose stems under the hand-written Porter stemmer (the terms of a `convmem-search/1` dump, the
# release before PyStemmer) differ from their English Snowball stems (today's query terms).
PORTER_TERMS = {"generous": "gener", "fair": "fairli", "die": "dy"}
PORTER_TEXTS = {"generously": "she gave generously", "fairly": "a fairly long day", "dying": "the dying light"}


def test_a_search_dump_of_an_earlier_stemmer_is_never_read_and_replaced_at_once(tmp_path):
    """A snapshot whose search dump is `convmem-search/1` holds Porter's terms, which today's queries
    never make: the start ignores it, replays the log, and writes a snapshot with the current dump."""
    from storaged import search as S

    d = str(tmp_path)
    s = Store.open(d)
    ids = {q: write(s, "s", text)["message"]["message_id"] for q, text in PORTER_TEXTS.items()}
    write(s, "s", "nothing to see here")
    s.search  # indexes the queue: the dump holds every message's terms, as the earlier release's did
    assert s.write_snapshot()
    state = live_state(s)
    docs = [(m.seq, m.content, m.summary, m.tags) for m in s.by_seq.values()]
    s.close()
    # Make the snapshot what the earlier release wrote: its format string and Porter's terms, every
    # posting in the dump (that release had no segments).
    path = os.path.join(d, "snapshot")
    meta, messages, _ = snapshot.read(FileIO(), path)
    earlier = S.SearchIndex()
    for doc in docs:
        earlier.add(*doc)
    dump = earlier.dump()
    del dump["segments"], dump["mem_lo"]
    dump["terms"] = "\n".join(PORTER_TERMS.get(t, t) for t in dump["terms"].split("\n"))
    porter_index = S.SearchIndex.load(dump)  # what reading it would serve: no hit for these words
    assert [bool(porter_index.search(q, 10)) for q in (*PORTER_TEXTS, "see")] == [False, False, False, True]
    snapshot.write(FileIO(), path, meta, messages, dict(dump, format="convmem-search/1"))

    s = Store.open(d)
    assert s.snapshot_valid and not s.snapshot_outdated and s.snapshot_pos == s.log_size()
    assert snapshot.read(FileIO(), path)[2]["format"] == S._FORMAT != "convmem-search/1"
    assert live_state(s) == state
    for query, mid in ids.items():
        assert search(s, query=query)["results"][0]["message_id"] == mid, query
    s.close()
    s = Store.open(d)  # the next start reads the new snapshot
    assert s.snapshot_valid and s.snapshot_pos == s.log_size() and live_state(s) == state
    for query, mid in ids.items():
        assert search(s, query=query)["results"][0]["message_id"] == mid, query
    s.close()


# ------------------------------------------------------------------------------------- restarts
def busy_store(d: str):
    s = Store.open(d)
    rng = random.Random(3)
    ids = []
    for i in range(60):
        roll = rng.random()
        if roll < 0.6 or len(ids) < 3:
            ids.append(write(s, f"sess{rng.randint(0, 5)}", f"text {i} " + "語" * rng.randint(0, 20),
                             tags=[f"t{rng.randint(0, 3)}"], importance=rng.randint(0, 100),
                             memory_kind=rng.choice(["conversation", "semantic", "summary"]),
                             summary=rng.choice(["", f"summary {i}"]))["message"]["message_id"])
        elif roll < 0.8:
            update(s, rng.choice(ids), content=f"edit {i}", importance=rng.randint(0, 100))
        else:
            victim = rng.choice(ids)
            ids.remove(victim)
            delete(s, victim)
    return s


def observe(s):
    h = s.health()
    return {
        "state": live_state(s), "history": full_history(s),
        "sessions": read(s, view="sessions", limit=1000),
        "search": [search(s, query=q) for q in ("text", "edit", "summary", "語")],
        "figures": {k: h[k] for k in ("log_size", "active_messages", "session_count", "deleted_messages",
                                      "last_sequence", "update_records", "dead_bytes", "status", "last_error")},
        # (not store_entries_bytes: the rows on the heap, which a start that maps its base holds none of)
        "memory": {k: v for k, v in h["memory_estimate"].items()
                   if k in ("body_bytes", "metadata_bytes", "relation_index_bytes")},
    }


def test_clean_and_abrupt_stops_give_the_same_state(tmp_path):
    d = str(tmp_path / "data")
    s = busy_store(d)
    running = observe(s)
    abrupt = str(tmp_path / "abrupt")
    shutil.copytree(d, abrupt)  # the files as a SIGKILL would leave them: no snapshot, no close
    assert s.write_snapshot()
    s.close()
    clean = Store.open(d)
    assert clean.snapshot_valid and clean.snapshot_pos == clean.log_size()
    assert observe(clean) == running
    clean.close()
    killed = Store.open(abrupt)
    assert not os.path.exists(os.path.join(abrupt, "snapshot")) and not killed.recovered_tail
    assert observe(killed) == running
    # both continue identically
    for st in (killed, Store.open(d)):
        m = write(st, "sess0", "continued")["message"]
        assert m["message_id"] > max(running["state"])
        st.close()


def test_restart_after_rebuild_and_snapshot(tmp_path):
    d = str(tmp_path)
    s = busy_store(d)
    compaction.rebuild(s)
    after_rebuild = observe(s)
    write(s, "sess1", "one more text")
    more = observe(s)
    s.close()
    s = Store.open(d)  # the rebuild's snapshot + one record of log
    assert observe(s) == more
    s.close()
    os.unlink(os.path.join(d, "snapshot"))
    s = Store.open(d)  # the compacted log alone
    assert observe(s) == more
    assert after_rebuild["figures"]["dead_bytes"] == 0
    s.close()


def test_leftover_temporary_files_are_removed(tmp_path):
    d = str(tmp_path)
    s = busy_store(d)
    state = live_state(s)
    s.close()
    leftovers = ["log.compact", "log.new", "snapshot.tmp", "snapshot.bg.tmp", "cursor.key.tmp",
                 "log.damaged-20260101T000000.tmp"]
    for name in leftovers:
        with open(os.path.join(d, name), "wb") as f:
            f.write(b"half-written garbage" * 100)
    s = Store.open(d)
    for name in leftovers:
        assert not os.path.exists(os.path.join(d, name)), name
    assert live_state(s) == state and s.health()["status"] == "OK"
    s.close()


# ------------------------------------------------------------------------------------- the salt
def crafted_frame(salt: bytes) -> str:
    """A delete record framed for ``salt`` whose bytes are valid UTF-8, so that a message can carry it
    verbatim. (A write record cannot be: its msgpack always holds a byte that UTF-8 forbids there.)"""
    for nonce in range(1_000_000):
        rid = "r" * 140 + f"{nonce:010d}"                 # str8 of 150 bytes: 0xd9 0x96 is a valid pair
        payload = msgpack.packb(["d", rid, 5, "M" * 150], use_bin_type=True)
        assert len(payload) == 308                        # length bytes 0x34 0x01 0 0: ASCII
        framed = logfile.frame(salt, payload)
        try:
            return framed.decode("utf-8")
        except UnicodeDecodeError:
            continue
    raise AssertionError("no UTF-8 frame found")


@pytest.mark.parametrize("same_salt", [False, True])
def test_a_log_inside_a_message_is_not_a_record(tmp_path, same_salt):
    """A message whose text is a perfectly framed record must not pass for one after damage.

    The control case frames it with the log's own salt (which no writer can know): the scan *is* then
    fooled, so the test can fail."""
    d = str(tmp_path)
    s = Store.open(d)
    write(s, "s", "before")
    before = live_state(s)
    size_before = s.log_size()
    fake = crafted_frame(s.salt if same_salt else os.urandom(16))
    m = write(s, "s", "x" * 50 + fake + "y" * 50)["message"]
    assert fake.encode() in open(os.path.join(d, "log"), "rb").read()  # verbatim in the log
    s.close()
    data = open(os.path.join(d, "log"), "rb").read()
    for cut in (size_before + 2, size_before + 40):  # one byte lost inside the real record
        put_log(d, data[:cut] + data[cut + 1:])
        s = Store.open(d)
        h = s.health()
        if same_salt:
            assert h["status"] == "DEGRADED"  # the forged record was taken for one: "mid-log damage"
        else:
            assert h["status"] == "OK" and s.recovered_tail and live_state(s) == before
        s.close()
    # salvage resynchronises at every offset: it must not pick up the forged record either
    put_log(d, data[:size_before + 5] + bytes([data[size_before + 5] ^ 0xFF]) + data[size_before + 6:])
    report = salvage(d)
    assert report["records_recovered"] == (2 if same_salt else 1)
    s = Store.open(d)
    assert live_state(s) == before and m["message_id"] not in s.by_id
    s.close()


def test_frame_checksum_covers_length_and_salt():
    salt = b"s" * 16
    framed = logfile.frame(salt, msgpack.packb(records.delete(None, 1, "m", 0)))
    length, crc = struct.unpack_from("<II", framed)
    assert crc == zlib.crc32(framed[8:], zlib.crc32(framed[:4], zlib.crc32(salt)))
    buf = logfile.make_header(salt) + framed
    res = logfile.ScanResult()
    assert list(logfile.scan(buf, salt, logfile.HEADER_SIZE, res)) and res.records == 1
    res = logfile.ScanResult()
    assert list(logfile.scan(buf, b"t" * 16, logfile.HEADER_SIZE, res)) == [] and res.torn_tail
    zero = logfile.make_header(salt) + bytes(64)
    res = logfile.ScanResult()
    assert list(logfile.scan(zero, salt, logfile.HEADER_SIZE, res)) == [] and res.torn_tail


def test_a_snapshot_is_packed_in_pieces_with_the_bytes_of_one_pack():
    """The search dump is written piece by piece (snapshot.pack_pieces: no single C call over hundreds
    of MiB while a rebuild's worker holds the GIL), and the file holds exactly what one pack would."""
    import array

    from storaged.snapshot import WRITE_AT, pack_pieces

    packer = msgpack.Packer(use_bin_type=True)
    big = bytes(range(256)) * (WRITE_AT // 256 * 3 + 1)
    words = "\n".join(f"term{i} 京都{i}" for i in range(WRITE_AT // 8))  # a big str, not ASCII
    for obj in ({"fields": [{"slots": big, "n": 3}, {"slots": b"small"}], "terms": "a\nb", "x": None},
                [memoryview(big), bytearray(big[:WRITE_AT + 1]), (1, 2.5, "s")], big, {"terms": words},
                memoryview(array.array("I", range(WRITE_AT // 2))).cast("B")):
        pieces = list(pack_pieces(packer, obj))
        assert b"".join(pieces) == packer.pack(obj)
        assert max(map(len, pieces)) <= WRITE_AT
