"""What a rebuild's forked worker hands the daemon (``compaction.run_child`` → ``rebuild.tmp`` →
``read_result``): installed, it gives the store a rebuild in one thread gives, byte for byte on
disk and message for message in memory; a result that does not match the daemon's state, or a
failure, changes nothing. In-process: the child's body is run without the fork (the fork itself is
tests/process/test_rebuild_worker.py's)."""
from __future__ import annotations

import os
import shutil

import pytest

from tests.support.faultio import FaultIO, delete, live_state, search, update, write
from storaged import compaction, layout
from storaged.store import Store
from storaged.text import TEXT_LEN_BITS, TEXT_OFF_BITS, PackedLocations

pytestmark = pytest.mark.timeout(60)


def _store(d: str) -> Store:
    s = Store.open(d)
    ids = [write(s, f"s{i % 3}", f"message {i} 日本語 tokyo{i}" * (i % 5 + 1), tags=[f"t{i % 4}"])["message"]["message_id"]
           for i in range(60)]
    for mid in ids[::7]:
        delete(s, mid)
    update(s, ids[1], content="edited once")
    return s


def test_packed_locations_hold_locations_wider_than_64_bits():
    shift = TEXT_OFF_BITS + TEXT_LEN_BITS
    locs = [0, 1, (1 << 63) + 5, (5_000_000_000 << shift) | (300 << TEXT_LEN_BITS) | 65_000, (1 << 90) + 12345]
    packed = PackedLocations(*PackedLocations.pack(locs))
    assert len(packed) == len(locs) and [packed[i] for i in range(len(locs))] == locs
    with pytest.raises(ValueError):
        PackedLocations(b"\0" * 8, b"")


def test_the_workers_result_installs_what_a_rebuild_in_one_thread_does(tmp_path):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    s = _store(a)
    s.close()
    shutil.copytree(a, b)
    sa, sb = Store.open(a), Store.open(b)
    compaction.rebuild(sa)
    assert compaction.run_child(sb) == 0
    assert os.path.exists(os.path.join(b, layout.REBUILD_RESULT))
    kind, prepared = compaction.read_result(sb)
    assert kind == "ok"
    reply = compaction.install(sb, prepared)
    compaction.discard(sb)
    assert reply["status"] == "OK" and reply["messages_indexed"] == len(live_state(sa))
    assert live_state(sb) == live_state(sa)
    # the request ids (a retry after the rebuild is answered as before it) and the record sizes
    assert sb.rids and list(sb.rids.items()) == list(sa.rids.items())
    assert (sb.meta_rec_sizes, sb.meta_bytes) == (sa.meta_rec_sizes, sa.meta_bytes)
    assert (sb.ingest.rec_sizes, sb.ingest.live_bytes) == (sa.ingest.rec_sizes, sa.ingest.live_bytes)
    for q in ("tokyo7", "日本語", "edited"):
        assert search(sb, query=q) == search(sa, query=q)
    assert sb.health()["log_size"] == sa.health()["log_size"]
    sb.relocate_step(None)
    state, hits = live_state(sb), search(sb, query="tokyo7")
    sa.close()
    sb.close()
    assert not {"log.compact", "snapshot.tmp", layout.REBUILD_RESULT} & set(os.listdir(b))
    sb = Store.open(b)  # the snapshot the worker wrote, with its segment
    assert sb.health()["snapshot_valid"] is True and live_state(sb) == state
    assert search(sb, query="tokyo7") == hits
    sb.close()


def test_a_result_of_another_state_is_refused(tmp_path):
    """The daemon refuses mutations while its worker runs; if its state moved all the same, the
    result is refused rather than installed over messages it does not hold."""
    d = str(tmp_path / "d")
    s = _store(d)
    before = live_state(s)
    compaction.run_child(s)
    write(s, "late", "written after the worker's fork")
    kind, reply = compaction.read_result(s)
    assert kind == "error" and reply["error"]["code"] == "INTERNAL_ERROR", reply
    assert "unchanged" in reply["error"]["message"]
    compaction.discard(s)
    assert len(live_state(s)) == len(before) + 1
    s.close()


def test_a_failed_worker_reports_the_contracts_error_and_leaves_no_temps(tmp_path):
    d = str(tmp_path / "d")
    s = _store(d)
    s.close()
    io = FaultIO()
    s = Store.open(d, io=io)
    before = live_state(s)
    io.arm(3, kinds=["write"])  # the compacted log's writes fail (ENOSPC)
    assert compaction.run_child(s) == 0
    io.arm(None)
    kind, reply = compaction.read_result(s)
    assert kind == "error" and reply["error"]["code"] == "IO_ERROR", reply
    assert "unchanged" in reply["error"]["message"]
    compaction.discard(s)
    assert live_state(s) == before
    assert not {"log.compact", "snapshot.tmp", layout.REBUILD_RESULT} & set(os.listdir(d))
    assert not [n for n in os.listdir(d) if n.endswith(".seg")]  # no segment was named by anything
    s.close()


def test_a_rebuild_writes_its_index_a_segment_at_a_time_with_the_same_answers(tmp_path, monkeypatch):
    # a rebuild's worker that built the whole index in memory passed 24 GB at 5M events (killed by the
    # kernel): it writes a segment whenever its lists pass REBUILD_FLUSH_BYTES, merged as it goes;
    # the store it installs answers as one built in one piece, and keeps only the files it names
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    s = _store(a)
    s.close()
    shutil.copytree(a, b)
    sa = Store.open(a)
    compaction.rebuild(sa)
    monkeypatch.setattr(compaction, "FLUSH_CHECK_EVERY", 4)
    monkeypatch.setattr(compaction, "REBUILD_FLUSH_BYTES", 1)
    flushed = []
    real = compaction.SearchIndex.write_and_adopt
    monkeypatch.setattr(compaction.SearchIndex, "write_and_adopt",
                        lambda self, plan, io, d: (flushed.append(plan.name), real(self, plan, io, d))[1])
    sb = Store.open(b)
    assert compaction.run_child(sb) == 0
    kind, prepared = compaction.read_result(sb)
    assert kind == "ok" and len(flushed) >= 10
    compaction.install(sb, prepared)
    compaction.discard(sb)
    assert live_state(sb) == live_state(sa)
    queries = ("tokyo7", "日本語", "edited", "message", "tokyo1 message", "t2")
    for q in queries:
        assert search(sb, query=q) == search(sa, query=q)
    named = set(sb.snapshot_segments)
    on_disk = {n for n in os.listdir(b) if n.startswith(("index.", "rows."))}
    assert on_disk == named  # (the small segments merged into one as they came: the plan's policy)
    sb.close()
    sb = Store.open(b)
    for q in queries:
        assert search(sb, query=q) == search(sa, query=q)
    sa.close()
    sb.close()


def test_a_rebuild_that_fails_between_its_segments_leaves_none_of_them(tmp_path, monkeypatch):
    d = str(tmp_path / "d")
    s = _store(d)
    s.close()
    before = sorted(os.listdir(d))
    monkeypatch.setattr(compaction, "FLUSH_CHECK_EVERY", 4)
    monkeypatch.setattr(compaction, "REBUILD_FLUSH_BYTES", 1)
    calls = []
    real = compaction.SearchIndex.write_and_adopt

    def third_fails(self, plan, io, directory):
        calls.append(plan.name)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        return real(self, plan, io, directory)

    monkeypatch.setattr(compaction.SearchIndex, "write_and_adopt", third_fails)
    s = Store.open(d)
    state = live_state(s)
    with pytest.raises(OSError):
        compaction.rebuild(s)
    assert sorted(os.listdir(d)) == before and live_state(s) == state
    s.close()


def test_a_rebuilds_worker_frees_the_lists_its_segments_replaced_at_once(tmp_path, monkeypatch):
    # the daemon frees a segment's replaced lists in steps between requests; a rebuild's worker has no
    # loop that would, and held every list it had written (5 GB and growing at 5M events)
    d = str(tmp_path / "d")
    _store(d).close()
    monkeypatch.setattr(compaction, "FLUSH_CHECK_EVERY", 4)
    monkeypatch.setattr(compaction, "REBUILD_FLUSH_BYTES", 1)
    s = Store.open(d)
    held = []
    real = compaction.SearchIndex.write_and_adopt

    def spy(self, plan, io, directory):
        real(self, plan, io, directory)
        held.append(self._retired)  # the list itself: what is in it when the rebuild is done

    monkeypatch.setattr(compaction.SearchIndex, "write_and_adopt", spy)
    old = {n for n in os.listdir(d) if n.startswith("index.")}
    p = compaction.prepare(s)
    assert len(held) >= 10 and not any(held) and not p.search._retired
    # nor does it keep the files of its own segments it merged into later ones: nothing names them
    assert {n for n in os.listdir(d) if n.startswith("index.")} == old | set(p.search.segment_names())
    compaction.discard(s)
    for name in p.search.segment_names() + [p.rows_name]:
        os.remove(os.path.join(d, name))
    s.close()


def test_the_result_is_read_a_chunk_a_turn_and_a_truncated_one_is_refused(tmp_path, monkeypatch):
    # at 5M events the result's arrays are ~170 MB: read and decoded at once they held the request loop
    # 217-229 ms; they are read RESULT_CHUNK bytes a turn of the loop (a step of the generator)
    d = str(tmp_path / "d")
    _store(d).close()
    s = Store.open(d)
    assert compaction.run_child(s) == 0
    path = compaction.result_path(s)
    size = os.path.getsize(path)
    monkeypatch.setattr(compaction, "RESULT_CHUNK", 64)
    monkeypatch.setattr(compaction, "DECODE_STEP", 2)   # the big lists of the head: two entries a turn
    steps = compaction.read_result_steps(s)
    turns = 0
    try:
        while True:
            next(steps)
            turns += 1
    except StopIteration as stop:
        kind, prepared = stop.value
    assert len(s.rids) >= 10
    assert kind == "ok" and turns >= 4 * (8 * prepared.record_count // 64) + len(s.rids) // 2
    assert list(prepared.seqs) == list(s.by_seq)
    assert list(prepared.rids.items()) == list(s.rids.items())
    assert set(prepared.meta_sizes) == set(s.session_meta)
    with open(path, "r+b") as f:
        f.truncate(size - 8)
    kind, reply = compaction.read_result(s)
    assert kind == "error" and "wrong size" in reply["error"]["message"]
    compaction.discard(s)
    for name in prepared.search.segment_names() + [prepared.rows_name]:
        os.remove(os.path.join(d, name))
    s.close()
