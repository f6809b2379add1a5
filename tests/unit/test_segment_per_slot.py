"""Each slot's doc and lengths live in the index segment that covers the slot (segment format 2), not in
the search dump the snapshot's manifest rewrites whole (dump format /4): the dump holds only the slots
no segment holds and the alive flags as bits, and the doc → slot map is derived at load. A load gives the
same tables, map and answers; a dump whose pieces do not cover every slot once, or that makes a doc live
in two slots, is refused (the store then replays the log)."""
from __future__ import annotations

import zlib

import msgpack
import pytest

from storaged import segment as segment_mod
from storaged.fileio import FileIO
from storaged.search import SearchIndex
from storaged.segment import Segment, SegmentInvalid
from tests.unit.test_segments import _assert_same, _docs, _index_of, _snapshot

pytestmark = pytest.mark.unit

FAR_DOC = 10**9  # beyond twice the docs: the doc map keeps it in its dict


def _tables(index: SearchIndex):
    dm = index._docmap
    docmap = {d: s for d, s in enumerate(dm.arr) if s >= 0}
    docmap.update(dm.extra)
    return bytes(index._slot_doc), [bytes(x) for x in index._lens], bytes(index._alive), docmap


def _index_with_segments(tmp_path, io) -> SearchIndex:
    """Segments (with deaths after they were written), a far doc, deaths in the live lists."""
    index = SearchIndex()
    docs = _docs(900, seed=11)
    for i, (seq, c, s, t) in enumerate(docs):
        index.add(seq, c, s, t)
        if i in (299, 599):
            _snapshot(index, str(tmp_path), io)
    index.add(FAR_DOC, "a far doc w1 w2", None, ["tag1"])
    for seq in range(5, 900, 7):
        index.remove(seq)
    index.add(5, "re-added w3", None, [])  # a doc live again, in a new slot
    return index


def test_the_dump_holds_only_the_slots_no_segment_holds_and_loads_the_same(tmp_path):
    io = FileIO()
    index = _index_with_segments(tmp_path, io)
    assert index._parts and all(p.version == segment_mod.VERSION for p in index._parts) and index._mem_lo == 600
    dump = index.dump()
    n = len(index._slot_doc)
    assert dump["slots"] == n and len(dump["alive"]) == (n + 7) // 8
    assert [(lo, hi) for lo, hi, _, _ in dump["docs"]] == [(600, n)]
    assert "slot_doc" not in dump and "docmap" not in dump
    back = SearchIndex.load(msgpack.unpackb(msgpack.packb(dump, use_bin_type=True), raw=False), str(tmp_path), io)
    assert _tables(back) == _tables(index) and back._docmap.extra == {FAR_DOC: index._docmap.get(FAR_DOC)}
    assert (back._live, back._dead, back._total_len, back._nonempty) == (
        index._live, index._dead, index._total_len, index._nonempty)
    _assert_same(index, back)
    # and it goes on as the original does: removes, adds, a segment of what it adds
    for ix in (index, back):
        ix.remove(10)
        ix.add(2000, "w1 w5 after the load", None, [])
        _snapshot(ix, str(tmp_path), io)
    assert _tables(back) == _tables(index)
    _assert_same(index, back)


def test_a_load_in_steps_puts_the_doc_map_together_a_piece_a_step(tmp_path, monkeypatch):
    # the request loop installs a rebuilt index in turns (SearchIndex.load_steps): the doc map too, a
    # piece of its docs a turn; the same tables and map as a load at once
    from storaged import search as search_mod
    io = FileIO()
    index = _index_with_segments(tmp_path, io)
    dump = msgpack.unpackb(msgpack.packb(index.dump(), use_bin_type=True), raw=False)
    whole = SearchIndex.load(dump, str(tmp_path), io)
    monkeypatch.setattr(search_mod, "_LOAD_STEP", 64)
    steps = SearchIndex.load_steps(dump, str(tmp_path), io)
    turns = 0
    try:
        while True:
            next(steps)
            turns += 1
    except StopIteration as done:
        back = done.value
    assert turns > len(index._slot_doc) // 64  # a turn a piece of the docs at least
    assert _tables(back) == _tables(whole) == _tables(index)
    _assert_same(index, back)


def test_a_segment_of_format_2_holds_its_slots_docs_and_lengths(tmp_path):
    io = FileIO()
    index = _index_with_segments(tmp_path, io)
    for seg in index._parts:
        docs, lens = Segment(seg.path, io).per_slot()
        assert docs.tolist() == index._slot_doc[seg.slot_lo:seg.slot_hi].tolist()
        assert [x.tolist() for x in lens] == [lens_f[seg.slot_lo:seg.slot_hi].tolist() for lens_f in index._lens]


def _damaged(dump: dict, how: str) -> dict:
    dump = dict(dump, docs=[list(p) for p in dump["docs"]])
    lo, hi, docs, lens = dump["docs"][0]
    if how == "gap":
        dump["docs"][0] = [lo + 1, hi, docs[8:], [x[4:] for x in lens]]
    elif how == "overlap":
        dump["docs"][0] = [lo - 1, hi, docs[:8] + docs, [x[:4] + x for x in lens]]
    elif how == "short":
        dump["docs"][0] = [lo, hi, docs[:-8], lens]
    elif how == "past the end":
        dump["docs"][0] = [lo, hi + 1, docs + docs[:8], [x + x[:4] for x in lens]]
    elif how == "a doc live twice":  # the last live slot's doc made the first live slot's doc
        dump["docs"][0] = [lo, hi, docs[:-8] + docs[:8], lens]
    elif how == "alive":
        dump["alive"] = dump["alive"][:-1]
    elif how == "doc map length":
        dump["docmap_len"] = -1
    return dump


@pytest.mark.parametrize("how", ["gap", "overlap", "short", "past the end", "a doc live twice", "alive",
                                 "doc map length"])
def test_a_dump_whose_per_slot_tables_do_not_fit_is_refused(tmp_path, how):
    io = FileIO()
    index = SearchIndex()
    for seq, c, s, t in _docs(300, seed=3):
        index.add(seq, c, s, t)
        if seq == 200:
            _snapshot(index, str(tmp_path), io)
    dump = index.dump()
    SearchIndex.load(dump, str(tmp_path), io)  # sound as made
    with pytest.raises(ValueError):
        SearchIndex.load(_damaged(dump, how), str(tmp_path), io)


def test_a_compacted_index_dumps_and_loads_its_renumbered_slots():
    index = SearchIndex()
    for seq, c, s, t in _docs(400, seed=4):
        index.add(seq, c, s, t)
    for seq in range(1, 400, 2):
        index.remove(seq)
    index.compact()
    assert len(index._slot_doc) == index._live == 200
    back = SearchIndex.load(index.dump())
    assert _tables(back) == _tables(index)
    _assert_same(index, back)


def test_an_empty_index_dumps_and_loads():
    back = SearchIndex.load(SearchIndex().dump())
    assert _tables(back) == (b"", [b"", b"", b""], b"", {})
    back.add(1, "w1", None, [])
    assert [h.doc for h in back.search("w1", 5)] == [1]


def test_per_slot_tables_that_do_not_fit_the_slot_range_are_refused(tmp_path):
    """By the writer, and by the reader even in a file whose checksum holds (a head that says one slot
    more than the tables hold, its CRC made to match)."""
    io = FileIO()
    index = _index_of(_docs(50))
    plan = index.plan()
    with pytest.raises(ValueError):
        segment_mod.write(io, str(tmp_path / "index.0000000000000001.seg"), plan.slot_lo, plan.slot_hi,
                          [], [], str, index._slot_doc[:10], index._lens)
    path = index.write_segment(plan, io, str(tmp_path))
    assert Segment(path, io).per_slot() is not None
    raw = bytearray(open(path, "rb").read())
    head = list(segment_mod.HEAD.unpack_from(raw, 0))
    head[-1] += 1  # slot_hi
    segment_mod.HEAD.pack_into(raw, 0, *head)
    size = segment_mod.HEADER_SIZE[segment_mod.VERSION]
    crc = zlib.crc32(bytes(raw[:size - 4]), zlib.crc32(bytes(raw[size:])))
    segment_mod.CRC.pack_into(raw, size - 4, crc)
    with open(path, "wb") as f:
        f.write(raw)
    with pytest.raises(SegmentInvalid, match="per-slot"):
        Segment(path, io)


def test_a_term_lookup_finds_the_first_term_not_below_it(tmp_path):
    """Segment._lower_bound against a plain scan, for every term and for the gaps before, between and
    after them, across several of its sample blocks (segment.SAMPLE terms each), before, while and
    after its samples are made a step at a time."""
    io = FileIO()
    terms = sorted({f"t{i:05d}" for i in range(0, 3 * segment_mod.SAMPLE + 17, 1)} | {"東京", "データ"},
                   key=lambda t: t.encode())
    index = SearchIndex()
    for seq, term in enumerate(terms, 1):
        index.add(seq, term, None, [])
    plan = index.plan()
    seg = Segment(index.write_segment(plan, io, str(tmp_path)), io)
    stored = seg.term_list()
    assert len(stored) == seg.n_terms > 3 * segment_mod.SAMPLE
    raws = [t.encode() for t in stored]
    probes = raws + [r + b"\x00" for r in raws] + [r[:-1] for r in raws] + [b"", b"a", b"t", b"\xff\xff"]
    expected = [sum(1 for r in raws if r < raw) for raw in probes]
    steps = 0
    while True:  # before the samples are made (a plain bisection), while they are, and after
        assert [seg._lower_bound(raw) for raw in probes] == expected
        for t in stored:
            assert seg.lookup(t) == stored.index(t)
        assert seg.lookup("t99999") == -1 and seg.lookup("a") == -1
        if seg.sampled():
            break
        seg.sample_step(1)
        steps += 1
    assert steps == len(range(0, seg.n_terms, segment_mod.SAMPLE)) and seg._samples == raws[::segment_mod.SAMPLE]


def test_the_index_s_idle_steps_make_every_segment_s_samples(tmp_path):
    io = FileIO()
    index = _index_with_segments(tmp_path, io)
    back = SearchIndex.load(index.dump(), str(tmp_path), io)
    assert back._parts and not any(p.sampled() for p in back._parts)
    for _ in range(1000):
        if not back.idle_step():
            break
    assert all(p.sampled() for p in back._parts)
    _assert_same(index, back)



def test_a_load_keeps_sparse_docs_in_the_doc_map_s_array(tmp_path):
    """Docs are seqs, sparse once messages are deleted or replaced: the doc map the load derives must
    keep them in its array as the index did, not in its dict (~30x the bytes a doc), and the docs added
    after the load must go to the array as they did before the dump, not follow them into the dict."""
    io = FileIO()
    index = SearchIndex()
    for seq in range(0, 3000 * 100, 100):  # one live message in 100 seqs
        index.add(seq, f"w{seq % 97} x", None, [])
    _snapshot(index, str(tmp_path), io)
    assert not index._docmap.extra
    back = SearchIndex.load(msgpack.unpackb(msgpack.packb(index.dump(), use_bin_type=True), raw=False),
                            str(tmp_path), io)
    assert _tables(back) == _tables(index)
    for ix in (index, back):
        for seq in range(3000 * 100, 3100 * 100, 100):
            ix.add(seq, "after the load", None, [])
    assert (len(back._docmap.extra), len(index._docmap.extra)) == (0, 0)
