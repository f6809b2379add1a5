"""Search-index segments (storaged/segment.py, SearchIndex.plan/write_segment/adopt): an index whose
postings are partly in mapped files, partly in frozen lists and partly live answers every query as
the same docs held in memory alone would, and a segment that is torn, rotten or not the one the
snapshot names is refused, never read."""
from __future__ import annotations

import os
import random

import msgpack
import numpy as np
import pytest

from storaged import search as search_mod
from storaged.fileio import FileIO
from storaged.search import SearchIndex
from storaged.segment import Segment, SegmentInvalid

WORDS = [f"w{i}" for i in range(2000)] + [
    "searching", "searchable", "searchers", "database", "databases", "東京", "京都", "大阪", "データ", "ベース",
]
QUERIES = [
    "w1", "w2 w3", "w10 w11 w12 w13 w14", "search", "searchable w5", "databa", "東京", "京", "データベース",
    "東京 大阪", "w1999", "missing words here", "w0 w1 w2 w3 w4 w5 w6 w7 w8 w9", "tag3", "大",
]


def _text(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS[:40]) if rng.random() < 0.5 else rng.choice(WORDS)
                    for _ in range(rng.randint(1, 30)))


def _docs(n: int, seed: int = 7) -> list[tuple[int, str, str | None, list[str]]]:
    rng = random.Random(seed)
    return [(seq, _text(rng), _text(rng) if rng.random() < 0.2 else None, [f"tag{rng.randint(0, 5)}"])
            for seq in range(1, n + 1)]


def _index_of(docs) -> SearchIndex:
    index = SearchIndex()
    for seq, c, s, t in docs:
        index.add(seq, c, s, t)
    return index


def _results(index: SearchIndex, query: str, limit: int = 20) -> list[tuple[int, float]]:
    return [(h.doc, h.score) for h in index.search(query, limit)]


def _assert_same(a: SearchIndex, b: SearchIndex) -> None:
    for q in QUERIES:
        for limit in (1, 5, 50):
            ra, rb = _results(a, q, limit), _results(b, q, limit)
            assert len(ra) == len(rb), q
            for (da, sa), (db, sb) in zip(ra, rb):
                assert sa == pytest.approx(sb, rel=1e-9, abs=1e-12), q
            # the same docs, up to the order of docs tied within float noise (and which of those
            # tied with the last one made the cut)
            if ra:
                last = round(ra[-1][1], 9)
                assert ({(d, round(v, 9)) for d, v in ra if round(v, 9) != last}
                        == {(d, round(v, 9)) for d, v in rb if round(v, 9) != last}), q


def _snapshot(index: SearchIndex, directory: str, io: FileIO, adopt: bool = True):
    plan = index.plan()
    if plan is None:
        return None
    path = index.write_segment(plan, io, directory)
    if adopt:
        assert index.adopt(plan, Segment(path, io))
    return plan


def test_segments_answer_as_memory_does(tmp_path):
    io = FileIO()
    docs = _docs(2400)
    mem, seg = SearchIndex(), SearchIndex()
    for i, (seq, c, s, t) in enumerate(docs):
        mem.add(seq, c, s, t)
        seg.add(seq, c, s, t)
        if i % 400 == 399:
            # every other batch stays frozen a while (a snapshot child still writing it)
            _snapshot(seg, str(tmp_path), io, adopt=(i // 400) % 2 == 0)
    assert seg._parts and seg.segment_names()
    _assert_same(mem, seg)
    # everything written: a load maps the same segments and answers the same
    _snapshot(seg, str(tmp_path), io)
    assert not any(isinstance(p, search_mod._MemPart) for p in seg._parts)
    back = SearchIndex.load(msgpack.unpackb(msgpack.packb(seg.dump())), str(tmp_path), io)
    assert back.segment_names() == seg.segment_names()
    _assert_same(mem, back)
    # geometric merging keeps the count of segments small
    assert len(back.segment_names()) <= search_mod._MAX_SEGMENTS


def test_deletes_and_merges(tmp_path, monkeypatch):
    io = FileIO()
    docs = _docs(1500, seed=3)
    rng = random.Random(11)
    mem, seg = SearchIndex(), SearchIndex()
    for i, (seq, c, s, t) in enumerate(docs):
        mem.add(seq, c, s, t)
        seg.add(seq, c, s, t)
        if i % 300 == 299:
            _snapshot(seg, str(tmp_path), io)
    dead = rng.sample([d[0] for d in docs], 500)
    for seq in dead:
        mem.remove(seq)
        seg.remove(seq)
    # an update: the doc comes back with new text, in the live lists
    mem.add(dead[0], "searchable brand new words", None, [])
    seg.add(dead[0], "searchable brand new words", None, [])
    for q in QUERIES:
        assert not {d for d, _ in _results(seg, q, 100)} & set(dead[1:]), q
    # one merge of everything drops the dead postings: then the statistics agree exactly
    monkeypatch.setattr(search_mod, "_MAX_SEGMENTS", 1)
    before = sum(p.postings_count for p in seg._parts) + seg._n_postings + seg._n_single
    _snapshot(seg, str(tmp_path), io)
    assert len(seg._parts) == 1
    assert seg._parts[0].postings_count < before * 0.8  # a third of the docs died
    mem.compact()
    _assert_same(mem, seg)
    assert {d for d, _ in _results(seg, "searchable brand", 5)} >= {dead[0]}


def test_dump_refuses_frozen_parts_and_stale_plans_are_not_adopted(tmp_path):
    io = FileIO()
    index = _index_of(_docs(50))
    plan = index.plan()
    with pytest.raises(ValueError):
        index.dump()
    path = index.write_segment(plan, io, str(tmp_path))
    other = SearchIndex()
    assert not other.adopt(plan, Segment(path, io))
    assert index.adopt(plan, Segment(path, io))
    assert not index.adopt(plan, Segment(path, io))  # already in place
    assert index.plan() is None  # nothing new to write
    index.dump()


def _written(tmp_path) -> tuple[SearchIndex, str, dict]:
    io = FileIO()
    index = SearchIndex()
    for seq, c, s, t in _docs(300):
        index.add(seq, c, s, t)
    _snapshot(index, str(tmp_path), io)
    (name,) = index.segment_names()
    return index, os.path.join(str(tmp_path), name), msgpack.unpackb(msgpack.packb(index.dump()))


@pytest.mark.parametrize("damage", ["truncate", "flip", "missing", "other_slots", "path_name"])
def test_a_damaged_or_foreign_segment_is_refused(tmp_path, damage):
    _, path, dump = _written(tmp_path)
    if damage == "truncate":
        with open(path, "r+b") as f:
            f.truncate(os.path.getsize(path) - 8)
    elif damage == "flip":
        with open(path, "r+b") as f:
            f.seek(os.path.getsize(path) // 2)
            b = f.read(1)
            f.seek(-1, 1)
            f.write(bytes([b[0] ^ 0x10]))
    elif damage == "missing":
        os.unlink(path)
    elif damage == "other_slots":
        dump["segments"][0][2] += 1
    elif damage == "path_name":
        dump["segments"][0][0] = "../" + dump["segments"][0][0]
    if damage in ("truncate", "flip", "missing"):
        with pytest.raises(SegmentInvalid):
            Segment(path)
    with pytest.raises(ValueError):
        SearchIndex.load(dump, str(tmp_path), FileIO())


def _format_3_dump(index: SearchIndex) -> dict:
    """The dump the releases before per-slot segments wrote (/3): every slot's doc and lengths, the
    alive flags as bytes, and the doc map, beside what a current dump holds."""
    dump = index.dump()
    for f, fd in enumerate(dump["fields"]):
        fd["lens"] = index._lens[f].tobytes()
    for key in ("slots", "docs"):
        del dump[key]
    return dict(dump, format="convmem-search/3", slot_doc=index._slot_doc.tobytes(), alive=bytes(index._alive),
                docmap=index._docmap.arr.tobytes(), docmap_extra=[[d, sl] for d, sl in index._docmap.extra.items()])


def test_a_format_2_dump_loads_without_segments():
    index = SearchIndex()
    for seq, c, s, t in _docs(100):
        index.add(seq, c, s, t)
    index.remove(7)
    dump = _format_3_dump(index)
    dump["format"] = "convmem-search/2"
    del dump["segments"], dump["mem_lo"]
    back = SearchIndex.load(dump)
    _assert_same(index, back)
    assert bytes(back._alive) == bytes(index._alive) and back._docmap.get(7) == -1


def test_merges_stop_at_the_size_cap(tmp_path, monkeypatch):
    """No merge grows a segment past _MERGE_MAX_POSTINGS, even when that leaves more than
    _MAX_SEGMENTS: one merge's work stays bounded whatever the store's size."""
    io = FileIO()
    monkeypatch.setattr(search_mod, "_MAX_SEGMENTS", 2)
    index = SearchIndex()
    docs = _docs(900, seed=5)
    per_batch = []
    for i, (seq, c, s, t) in enumerate(docs):
        index.add(seq, c, s, t)
        if i % 100 == 99:
            per_batch.append(index._n_postings + index._n_single)
            _snapshot(index, str(tmp_path), io)
    cap = max(per_batch) * 2 + 1
    monkeypatch.setattr(search_mod, "_MERGE_MAX_POSTINGS", cap)
    old = set(index.segment_names())
    for seq, c, s, t in _docs(900, seed=6):
        index.add(seq + 10_000, c, s, t)
        if seq % 100 == 0:
            _snapshot(index, str(tmp_path), io)
            # every segment written under the cap holds at most the cap
            assert all(p.postings_count <= cap for p in index._parts if p.name not in old)
    assert len(index._parts) > 2  # the cap left more segments than _MAX_SEGMENTS
    mem = SearchIndex()
    for seq, c, s, t in docs:
        mem.add(seq, c, s, t)
    for seq, c, s, t in _docs(900, seed=6):
        mem.add(seq + 10_000, c, s, t)
    _assert_same(mem, index)


def test_frozen_lists_a_segment_replaced_are_freed_in_idle_steps(tmp_path, monkeypatch):
    monkeypatch.setattr(search_mod, "_RELEASE_STEP", 64)
    io = FileIO()
    index = SearchIndex()
    for seq, c, s, t in _docs(300):
        index.add(seq, c, s, t)
    plan = index.plan()
    frozen = plan.parts[0]
    held = index.memory_bytes()
    assert index.adopt(plan, Segment(index.write_segment(plan, io, str(tmp_path)), io))
    assert index._retired == [frozen] and index.memory_bytes() == held  # not freed at once
    steps = 0
    while index._retired:
        assert index.idle_step()
        steps += 1
    assert steps > 3 and not frozen.vocab and not any(frozen.slots) and index.memory_bytes() < held
    assert [h.doc for h in index.search("w1", 5)]  # the segment serves


def test_prefix_expansion_reaches_the_newest_part_among_many(tmp_path, monkeypatch):
    """Every part's sorted terms are read as one sorted list, charged once per prefix: with a dozen
    segments the live lists still expand a prefix (the review found the newest parts got none)."""
    monkeypatch.setattr(search_mod, "_MERGE_RATIO", 0)  # every batch its own segment, as the size cap leaves them
    monkeypatch.setattr(search_mod, "_MAX_SEGMENTS", 100)
    io = FileIO()
    mem, seg = SearchIndex(), SearchIndex()
    doc = 0
    for batch in range(12):
        for i in range(300):
            doc += 1
            text = f"zebra{batch}x{i} yak{i}q common" + (" postgresql" if batch == 11 and i == 0 else "")
            mem.add(doc, text, None, [])
            seg.add(doc, text, None, [])
        if batch < 11:
            _snapshot(seg, str(tmp_path), io)
    assert len(seg._parts) == 11
    for index in (mem, seg):
        while index.idle_step():
            pass
    for q in ("postgres", "postgres common"):
        assert [h.doc for h in seg.search(q, 5)][:1] == [h.doc for h in mem.search(q, 5)][:1] == [3301], q


def test_the_segment_head_is_under_its_checksum(tmp_path):
    """A section offset moved in the head (the body intact) is refused, not read as other postings."""
    from storaged import segment as seg_mod

    _, path, _ = _written(tmp_path)
    with open(path, "r+b") as f:
        f.seek(seg_mod.HEAD.size)
        off = int.from_bytes(f.read(8), "little")
        f.seek(seg_mod.HEAD.size)
        f.write((off + 8).to_bytes(8, "little"))
    with pytest.raises(SegmentInvalid):
        Segment(path)


def test_an_inline_snapshot_merges_only_small_segments(tmp_path, monkeypatch):
    """A snapshot the daemon writes on its own thread (a clean stop) never starts a big merge: that
    is the snapshot child's work."""
    io = FileIO()
    index = SearchIndex()
    docs = _docs(800, seed=9)
    for seq, c, s, t in docs[:500]:
        index.add(seq, c, s, t)
    _snapshot(index, str(tmp_path), io)
    monkeypatch.setattr(search_mod, "_INLINE_MERGE_MAX_POSTINGS", index._parts[0].postings_count // 2)
    for seq, c, s, t in docs[500:]:
        index.add(seq, c, s, t)
    assert len(index.plan(inline=True).parts) == 1  # the new lists alone, not merged into the big segment
    assert len(index.plan().parts) == 2  # the same state in the child: the ratio rule merges them


def _store_with_segment(d: str, n: int = 20) -> list[str]:
    from storaged.store import Store
    from tests.support.faultio import write

    store = Store.open(d)
    ids = [write(store, "s", f"wombat number {i}")["message"]["message_id"] for i in range(n)]
    store.search  # index the queue: the snapshot writes a segment
    assert store.write_snapshot()
    store.close()
    return ids


def _checked(store) -> str | None:
    """What the deferred CRC checks of ``store``'s start found, once they are done."""
    assert store.index_check is not None
    store.index_check.result(timeout=30)
    return store.index_check_step()


def test_a_segment_that_cannot_be_read_is_found_after_the_start_and_the_index_built_again(tmp_path):
    """An I/O error reading a segment is found by the deferred CRC check, never a start that fails:
    the store serves from its snapshot, then drops the index and queues every message for a new one
    (writes go on, health says what happened); nothing on disk is removed meanwhile."""
    import errno

    from storaged.store import Store

    class SegmentsUnreadable(FileIO):
        def pread(self, fd, n, offset):
            if os.readlink(f"/proc/self/fd/{fd}").endswith(".seg"):
                raise OSError(errno.EIO, "Input/output error")
            return super().pread(fd, n, offset)

    d = str(tmp_path / "d")
    ids = _store_with_segment(d)
    names = sorted(n for n in os.listdir(d) if n.endswith(".seg"))
    assert names
    again = Store.open(d, io=SegmentsUnreadable())
    assert again.snapshot_valid and sorted(again.by_id) == sorted(ids) and not again.unindexed
    reason = _checked(again)
    assert reason is not None and "cannot be read" in reason and again.index_check is None
    again.discard_index(reason)
    assert again.health()["status"] == "DEGRADED" and "built again" in again.health()["last_error"]
    assert len(again.unindexed) == 20 and not again._index.segment_names()
    assert len(again.search.search("wombat", 50)) == 20
    # whole again: the contract's OK, an empty last_error (a string, as get_system_health's schema says)
    assert again.health()["status"] == "OK" and again.health()["last_error"] == "" and again.index_damage is None
    assert again.snapshot_due()   # so that the next start maps the new index, not the damaged segment
    assert sorted(n for n in os.listdir(d) if n.endswith(".seg")) == names  # the snapshot still names it
    again.close()


def test_a_rotten_segment_opens_serves_is_never_merged_then_is_found(tmp_path):
    """A flipped byte in a posting section passes the open (its sections are in bounds) and is
    found by the deferred check; until then no plan merges it into a new segment (its damage would get
    a fresh CRC). A sound store's check finds nothing."""
    from storaged.store import Store
    from tests.support.faultio import write

    d = str(tmp_path / "d")
    _store_with_segment(d, 300)
    sound = Store.open(d)
    assert _checked(sound) is None and not sound._index.unverified_segments()
    sound.close()
    (name,) = [n for n in os.listdir(d) if n.endswith(".seg") and not n.startswith("rows")]
    path = os.path.join(d, name)
    seg = Segment(path)
    whole, slots = np.frombuffer(seg._buf, np.uint8), np.frombuffer(seg._slots[0], np.uint8)
    off = slots.ctypes.data - whole.ctypes.data + 1   # a byte of the first posting's slot (content field)
    del seg, whole, slots
    with open(path, "r+b") as f:
        f.seek(off)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0x01]))
    with pytest.raises(SegmentInvalid):
        Segment(path)
    store = Store.open(d)
    assert store.snapshot_valid and store._index.unverified_segments()
    store.index_check.result(timeout=30)
    for i in range(600):   # more than the segment holds: a plan would merge it (the ratio rule)
        write(store, "s", f"marmot number {i}")
    store.search
    plan = store._index.plan()
    assert plan is not None and all(p.verified for p in plan.parts)  # the new lists alone
    reason = store.index_check_step()
    assert reason is not None and "fails its checksum" in reason
    store.discard_index(reason)
    assert len(store.search.search("wombat", 900)) == 300 and len(store.search.search("marmot", 900)) == 600
    assert store.write_snapshot()
    store.close()
    again = Store.open(d)
    assert _checked(again) is None and name not in again._index.segment_names()
    assert len(again.search.search("wombat", 500)) == 300
    again.close()


def test_the_term_hash_table_finds_every_term_and_no_other(tmp_path):
    """Version 3 looks terms up in its hash table (one CRC, a probe or two), not by bisection: the
    same answer for every term of the segment, for near misses, and for a segment of one term or of
    none; a table of a wrong size is refused even when the checksum holds."""
    import zlib

    import numpy as np

    from storaged import segment as G

    rng = random.Random(5)
    words = sorted({"".join(rng.choice("abcxyz09会議") for _ in range(rng.randint(1, 9))) for _ in range(5000)})
    io = FileIO()
    for terms in (words, words[:1], []):
        path = str(tmp_path / f"index.{len(terms):016x}.seg")
        empty = [(np.zeros(len(terms) + 1, np.uint64), np.zeros(0, np.uint32), np.zeros(0, np.uint16),
                  np.zeros(len(terms), np.uint8))] * 3
        G.write(io, path, 0, 0, terms, empty, lambda t: (), np.zeros(0, np.uint64), [np.zeros(0, np.uint32)] * 3)
        seg = Segment(path, io)
        assert seg._hash is not None and len(seg._hash) == G.hash_size(len(terms))
        assert [seg.lookup(t) for t in terms] == list(range(len(terms)))
        for miss in ("", "zz", "abcxyz09会議x", "q", *(t + "!" for t in terms[:50])):
            assert seg.lookup(miss) == -1 or terms[seg.lookup(miss)] == miss
        # the bisection agrees (what a version 2 segment, with no table, uses)
        table, seg._hash = seg._hash, None
        assert [seg.lookup(t) for t in terms[:300]] == list(range(min(300, len(terms))))
        seg._hash = table
    raw = bytearray(open(path, "rb").read())  # the segment of no term: its table one slot short
    sections = list(G.SECTIONS[G.VERSION].unpack_from(raw, G.HEAD.size))
    assert sections[-1] == 4 * G.hash_size(0)
    sections[-1] -= 4
    G.SECTIONS[G.VERSION].pack_into(raw, G.HEAD.size, *sections)
    size = G.HEADER_SIZE[G.VERSION]
    G.CRC.pack_into(raw, size - 4, zlib.crc32(bytes(raw[:size - 4]), zlib.crc32(bytes(raw[size:]))))
    with open(path, "wb") as f:
        f.write(raw)
    with pytest.raises(SegmentInvalid, match="hash table"):
        Segment(path, io)


def test_prefix_expansion_reads_each_terms_df_with_it_across_segments(tmp_path):
    """The df an expansion is chosen by comes with the segment's sorted terms (Segment._read_prefix),
    no lookup of the term in every segment: the same sums as looking it up in each part, and the same
    expansions chosen as before, with some terms in segments, some frozen, some live."""
    from storaged import search as S

    rng = random.Random(9)
    index = SearchIndex()
    io = FileIO()
    words = [f"kubernet{letters}" for letters in ("qa", "qb", "qc", "xz", "xk", "zz", "kq")]
    for d in range(1, 1201):
        index.add(d, " ".join(rng.choices(words, k=rng.randint(1, 4))), None, [])
        if d % 300 == 0 and d <= 900:
            index.write_and_adopt(index.plan(), io, str(tmp_path))
    index.plan()  # a frozen part too
    for d in range(1201, 1300):
        index.add(d, rng.choice(words), None, [])
    sources = index._sources(None)
    readers = [r for part in sources for r in part.prefix_readers()]
    dfs: dict = {}
    found = S._expansions("kubernet", readers, [10_000], dfs)
    assert set(found) <= set(words) and found
    memory = [p for p in sources if not isinstance(p, Segment)]
    for t in found:
        assert dfs.get(t, 0) + S.SearchIndex._df(memory, t) == S.SearchIndex._df(sources, t), t
    assert index.search("kubernet", 5)


def test_the_deferred_checks_never_hold_up_an_exit_or_a_close(tmp_path):
    """The checks run on a daemon thread that a stop ends between two reads: a process that exits while
    they run exits at once (a supervisor's stop timeout is 10 s; at five million events the checks read
    3.8 GB), and ``Store.close`` stops them, leaving what was not checked unverified."""
    import subprocess
    import sys
    import threading
    import time

    from storaged.store import Store

    script = ("import sys, time\n"
              f"sys.path.insert(0, {os.getcwd()!r})\n"
              "from storaged.segment import SegmentCheck\n"
              "class Slow:\n"
              "    name = 'slow'\n"
              "    def check_body(self, io, stop): time.sleep(30)\n"
              "SegmentCheck([Slow()], None)\n")
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-c", script], check=True, timeout=20)
    assert time.monotonic() - t0 < 10

    d = str(tmp_path / "d")
    _store_with_segment(d, 300)
    gate = threading.Event()

    class Gated(FileIO):   # the check's thread waits before its first read until the store is closed
        def open_read(self, path):
            if threading.current_thread().name == "segment-check":
                gate.wait(10)
            return super().open_read(path)

    store = Store.open(d, io=Gated())
    check = store.index_check
    assert check.thread.daemon and not check.done()
    store.close()
    gate.set()
    assert check.result(timeout=10) == [] and store._index.unverified_segments()


@pytest.mark.parametrize("doc", ["no message", "a queued message", "a length"])
def test_a_per_slot_doc_that_names_no_indexed_message_is_found_at_open(tmp_path, doc):
    """The per-slot tables are read at open, before the deferred CRC check has read them: a slot whose
    doc names no message of the snapshot (it would fail every search reaching it), or one the snapshot
    left queued for the index (it would never be indexed, and its own message would be lost to search),
    or a length that does not add up to the dump's totals (every score skewed), makes the start build the
    index again at once, the check stopped."""
    import struct

    from storaged import segment as seg_mod
    from storaged.store import Store
    from tests.support.faultio import write

    d = str(tmp_path / "d")
    ids = _store_with_segment(d, 40)
    store = Store.open(d)
    ids += [write(store, "s", f"wombat queued {i}")["message"]["message_id"] for i in range(5)]
    assert store.write_snapshot() and len(store.unindexed) == 5   # the manifest lists them as queued
    queued = store.unindexed[0]
    store.close()
    (name,) = [n for n in os.listdir(d) if n.endswith(".seg") and not n.startswith("rows")]
    path = os.path.join(d, name)
    with open(path, "r+b") as f:
        buf = bytearray(f.read())
        sections = seg_mod.SECTIONS[seg_mod.VERSION].unpack_from(buf, seg_mod.HEAD.size)
        if doc == "a length":   # slot 0's length in the content field, one term more
            off = sections[2 * (4 + 4 * seg_mod.NFIELDS + 1)]
            f.seek(off)
            (n,) = struct.unpack("<I", f.read(4))
            f.seek(off)
            f.write(struct.pack("<I", n + 1))
        else:
            off = sections[2 * (4 + 4 * seg_mod.NFIELDS)]   # slot_doc: slot 0's doc
            f.seek(off)
            f.write(struct.pack("<Q", 1000 if doc == "no message" else queued))
    store = Store.open(d)
    assert store.snapshot_valid and store.index_check is None and not store._index.segment_names()
    assert "per-slot" in store.health()["last_error"] and len(set(store.unindexed)) == 45
    hits = store.search.search("wombat", 50)
    assert len(hits) == 45 and store.health()["status"] == "OK" and store.health()["last_error"] == ""
    assert {store.by_seq[h.doc].message_id for h in hits} == set(ids)
    store.close()


def test_an_ignored_snapshot_stops_the_checks_of_its_segments(tmp_path, monkeypatch):
    """A row segment that fails its checksum (found after the index segments' checks began) makes the
    start replay the log: the checks of the segments it no longer uses stop, not read on beside it."""
    from storaged import store as store_mod
    from storaged.store import Store

    d = str(tmp_path / "d")
    _store_with_segment(d, 50)
    (rows,) = [n for n in os.listdir(d) if n.startswith("rows")]
    with open(os.path.join(d, rows), "r+b") as f:
        f.seek(os.path.getsize(os.path.join(d, rows)) // 2)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0x01]))
    made = []
    real = store_mod.SegmentCheck
    monkeypatch.setattr(store_mod, "SegmentCheck", lambda segs, io: made.append(real(segs, io)) or made[-1])
    store = Store.open(d)
    assert not store.snapshot_valid and store.index_check is None and len(made) == 1
    assert made[0]._stop.is_set()
    made[0].thread.join(10)
    assert not made[0].thread.is_alive()
    store.close()


def test_the_segments_of_an_index_a_rebuild_replaced_are_let_go_one_a_release_step(tmp_path):
    # unmapping a 5M index's 17 segments at once held the request loop ~33 ms of the rebuild's install
    import sys
    io = FileIO()
    old = SearchIndex()
    for i, (seq, c, s, t) in enumerate(_docs(900)):
        old.add(seq, c, s, t)
        if i % 100 == 99:
            _snapshot(old, str(tmp_path), io)
    segments = [p for p in old._parts if isinstance(p, Segment)]
    assert len(segments) >= 2
    new = SearchIndex()
    for seq, c, s, t in _docs(300):
        new.add(seq, c, s, t)
    new.retire(old)
    del old
    def held() -> int:  # the segments the new index still holds (nothing else does: the old one is gone)
        return sum(len(p.segments) for p in new._retired if isinstance(p, search_mod._Unmapped))

    assert held() == len(segments)  # nothing let go at the install
    # (getrefcount's own argument, this list, the loop's name: 3; the _Unmapped that holds it: 4)
    assert all(sys.getrefcount(seg) == 4 for seg in segments)
    left = []
    while new._retired:
        new.release_step()
        left.append(held())
    assert left[:len(segments)] == list(range(len(segments) - 1, -1, -1))  # one a step, first
    assert all(sys.getrefcount(seg) == 3 for seg in segments)  # let go: nothing but this test holds them
    assert [h.doc for h in new.search("w1", 5)]


def test_a_rebuild_s_segments_pages_are_let_go_a_window_a_step():
    """_PagesLetGo / _Unmapped advise DROP_WINDOW_PAGES of a segment a release step (a segment's ~190 MB
    at once was a step of tens of ms), and a segment leaves the list after its last window."""

    class Seg:
        def __init__(self, pages):
            self.pages, self.calls = pages, []

        def page_count(self):
            return self.pages

        def release_pages(self, first, count):
            self.calls.append((first, count))

    w = search_mod.DROP_WINDOW_PAGES
    a, b, c = Seg(2 * w + 1), Seg(0), Seg(w)
    for kind in (search_mod._PagesLetGo, search_mod._Unmapped):
        a.calls, c.calls = [], []
        queue = kind([a, b, c])
        steps = 1
        while queue.release_step(0):
            steps += 1
        assert c.calls == [(0, w)] and a.calls == [(0, w), (w, w), (2 * w, w)]
        assert steps == 1 + 1 + 3 and queue.segments == []
