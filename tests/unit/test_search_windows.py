"""The window kernel (SearchIndex._pool_windows: block-max pruning over the window bounds segments
keep) against the array kernel it stands in for: the same hits, the same scores to the bit, the same
per-field breakdowns and own scores of any other doc — over segments with bounds, segments of the
release before (none), frozen and live in-memory parts, tombstones, and an average length that moved
since a segment was written.  Windows are made small here (2**4 slots) so a small index has many."""

import random
import zlib

import numpy as np
import pytest

from storaged import search as S
from storaged import segment as G
from storaged.fileio import FileIO
from storaged.rank import ranked_search
from storaged.search import SearchIndex
from tests.unit.test_search_kernel import neighbours, ranked_cases

JA = ["会議", "議事録", "ありがとう", "東京", "京都", "予定", "確認"]


@pytest.fixture(autouse=True)
def small_windows(monkeypatch):
    monkeypatch.setattr(S, "_WINDOW_SHIFT", 4)
    monkeypatch.setattr(S, "_BOUND_MIN", 8)
    monkeypatch.setattr(S, "_BOUND_DENSITY", 0)


def build(tmp_path, rng, n=3000, segments=3, legacy=False):
    """An index of n docs: `segments` written segments (then more docs in a frozen part and in the
    live lists), some docs removed, some re-added.  Long docs of a few 'clustered' words sit in a few
    windows only, so bounds can prune."""
    vocab = [f"w{i}" for i in range(300)] + ["postgresql", "postgres", "replication"]
    weights = [1 / (i + 1) for i in range(len(vocab))]
    ix = SearchIndex()
    texts = {}
    io = FileIO()
    step = n // (segments + 2)
    for d in range(1, n + 1):
        words = rng.choices(vocab, weights, k=rng.randint(2, 16))
        if d % 7 == 0:
            words.append("".join(rng.sample(JA, 2)))
        if 400 <= d < 440 or 2100 <= d < 2120:
            words += ["clustered"] * rng.randint(1, 30)
        texts[d] = " ".join(words)
        ix.add(d, texts[d], " ".join(rng.choices(vocab, weights, k=3)) if d % 6 == 0 else None,
               (rng.choice(vocab),) if d % 9 == 0 else ())
        if d % step == 0 and d // step <= segments:
            plan = ix.plan()
            ix.write_and_adopt(plan, io, str(tmp_path))
        elif d == step * (segments + 1):
            ix.plan()  # frozen, not written
    for d in rng.sample(range(1, n + 1), 120):
        ix.remove(d)
    for d in rng.sample(range(1, n + 1), 40):
        ix.remove(d)
        texts[d] = " ".join(rng.choices(vocab, weights, k=6))
        ix.add(d, texts[d], None, ())
    queries = [" ".join(rng.choices(vocab, weights, k=rng.randint(1, 6))) for _ in range(40)]
    queries += ["clustered", "clustered w0", "w0 w1 w2", "postgres replication", "会議の東京", "京", "w0"]
    return ix, texts, queries


def both(monkeypatch, fn, first=4, give_up=10.0):
    """fn() with the window kernel for every query (a first round of ``first`` windows; handing
    over to the array kernel when the windows left hold more than ``give_up`` of the postings:
    never, by default), then with the array kernel alone."""
    with monkeypatch.context() as m:
        m.setattr(S, "_WINDOW_MIN_POSTINGS", 0)
        m.setattr(S, "_WINDOW_FIRST", first)
        m.setattr(S, "_WINDOW_GIVE_UP", give_up)
        windows = fn()
    with monkeypatch.context() as m:
        m.setattr(S, "_WINDOW_MIN_POSTINGS", 10**12)
        arrays = fn()
    return windows, arrays


def answered(monkeypatch, name: str) -> list[bool]:
    """Spy on SearchIndex.<name>, a kernel that may hand a query on (None): per call, whether it answered."""
    out: list[bool] = []
    real = getattr(S.SearchIndex, name)

    def spy(self, *a, **kw):
        got = real(self, *a, **kw)
        out.append(got is not None)  # None: handed to the paths that read every list
        return got

    monkeypatch.setattr(S.SearchIndex, name, spy)
    return out


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setattr(S, "_WINDOW_SHIFT", 4)
    mp.setattr(S, "_BOUND_MIN", 8)
    mp.setattr(S, "_BOUND_DENSITY", 0)
    try:
        return build(tmp_path_factory.mktemp("segs"), random.Random(21))
    finally:
        mp.undo()


def test_segments_hold_bounds_that_bound_every_posting(corpus):
    ix, _, _ = corpus
    segs = [p for p in ix._parts if isinstance(p, G.Segment)]
    assert len(segs) >= 2 and all(s.window_shift == 4 for s in segs)
    checked = 0
    for seg in segs:
        for f in range(3):
            table = np.array(S._impact_table(seg._win_avg[f]))
            tids, counts, slots, keys = seg.export(f)
            off = np.concatenate(([0], np.cumsum(counts)))
            for t, a, b in zip(tids.tolist(), off[:-1].tolist(), off[1:].tolist()):
                got = seg.bounds(f, t)
                if b - a < 8:
                    assert got is None
                    continue
                w_lo, q, bmax, row, first, group = got
                assert first == a and group is seg.window_group(f)
                bv, bc = group.bval[row], group.bcnt[row]
                win = (slots[a:b].astype(np.int64) >> 4) - w_lo
                best = np.zeros(len(bv))
                np.maximum.at(best, win, table[keys[a:b]])
                assert bmax >= best.max() and np.isclose(bmax, best.max(), rtol=1e-6)
                bound = float(bmax) * bv.astype(np.float64) / 255.0
                assert (bound >= best).all()
                assert (bound <= best + bmax / 255.0 + 1e-9).all()  # at most a step above
                assert (bv[best == 0] == 0).all()  # a window the list does not touch adds nothing
                assert bc.tolist() == np.bincount(win, minlength=len(bc)).tolist()
                checked += 1
    assert checked > 20


def test_window_kernel_gives_the_array_kernels_hits_and_scores_to_the_bit(corpus, monkeypatch):
    ix, _, queries = corpus
    for q in queries:
        for limit, fields in ((10, (0, 1, 2)), (1, (0, 1, 2)), (5, (0,)), (7, (1, 2)), (400, (0, 1, 2))):
            a, b = both(monkeypatch, lambda: ix.search(q, limit, fields=fields))
            assert a == b, (q, limit)
            a, b = both(monkeypatch, lambda: ix.search_own(q, limit, fields=fields)[0])
            assert a == b, (q, limit)


def test_a_query_the_bounds_hardly_prune_is_handed_to_the_array_kernel(corpus, monkeypatch):
    ix, _, queries = corpus
    handed = []
    real = S.SearchIndex._pool_arrays

    def spy(self, *a, **kw):
        handed.append(a)
        return real(self, *a, **kw)

    monkeypatch.setattr(S.SearchIndex, "_pool_arrays", spy)
    for q in queries:
        for limit in (10, 400):
            a, b = both(monkeypatch, lambda: ix.search(q, limit), give_up=S._WINDOW_GIVE_UP)
            assert a == b, (q, limit)
    assert 0 < len(handed) - len(queries) * 2 < len(queries) * 2  # some, not all


def test_window_scorer_gives_the_same_own_scores_and_breakdowns(corpus, monkeypatch):
    ix, _, queries = corpus
    rng = random.Random(3)
    for q in queries:
        docs = {d for c in rng.sample(range(1, 3001), 30) for d in range(c - 4, c + 5)} | {0, 99999, -3}
        (_, sa), (_, sb) = both(monkeypatch, lambda: ix.search_scored(q, 20))
        assert isinstance(sa, S._WindowScores) and not isinstance(sb, S._WindowScores)
        assert sa.totals(docs) == sb.totals(docs), q
        assert sa.fields(docs) == sb.fields(docs), q
        arr = np.array(sorted(docs) + [-1], np.int64)
        assert sa.own(arr).tolist() == sb.own(arr).tolist(), q


def test_ranked_search_is_unchanged_by_the_window_kernel(corpus, monkeypatch):
    ix, texts, queries = corpus
    for q in queries:
        for kw in ranked_cases(texts):
            a, b = both(monkeypatch, lambda: ranked_search(ix, q, 12, neighbours=neighbours, **kw))
            assert a == b, (q, kw)


def test_the_window_kernel_reads_fewer_postings_when_the_best_docs_cluster(corpus, monkeypatch):
    # "clustered" sits, many times over, in docs 400-439 and 2100-2119 only (a few windows), beside
    # w0, the most common word: the windows without it are bounded by w0 alone, below the cut
    ix, _, _ = corpus
    monkeypatch.setattr(S, "_WINDOW_MIN_POSTINGS", 0)
    monkeypatch.setattr(S, "_WINDOW_FIRST", 2)
    seen = []
    real = S.SearchIndex._window_sources

    def spy(self, base, accept_docs=None):
        got = real(self, base, accept_docs)
        seen.append((sum(len(s[0]) for s in got[0]), got[3]))
        return got

    monkeypatch.setattr(S.SearchIndex, "_window_sources", spy)
    hits, scorer = ix.search_scored("clustered w0", 10)
    assert all(400 <= h.doc < 440 or 2100 <= h.doc < 2120 for h in hits)
    total, bound = seen[-1]
    read = scorer._done.sum()
    assert read < 0.25 * np.count_nonzero(bound), (read, np.count_nonzero(bound))


def test_bounds_hold_after_the_average_length_moved(tmp_path, monkeypatch):
    # a segment's bounds were computed at the average length of its writing; docs added since
    # (much longer ones here) move the average, and the drift factor keeps the bounds above
    rng = random.Random(8)
    ix, texts, queries = build(tmp_path, rng, n=1200, segments=2)
    for d in range(1201, 1800):
        ix.add(d, " ".join(rng.choices(["w0", "w1", "w2", "w7", "long"], k=rng.randint(60, 200))), None, ())
    segs = [p for p in ix._parts if isinstance(p, G.Segment)]
    assert any(S._drift(s._win_avg[0], ix._field_q(0)) > 1.0 for s in segs)
    for q in queries + ["long w0", "w7 w2"]:
        for limit in (3, 10, 50):
            a, b = both(monkeypatch, lambda: ix.search(q, limit))
            assert a == b, (q, limit)


def test_segments_without_bounds_search_the_same(tmp_path, monkeypatch):
    # a segment with no bounds (as a version 2 one, the release before): its lists add their exact
    # window maxima, computed at query time
    real = G.write

    def bare(io, path, lo, hi, terms, fields, chars_of, slot_doc, lens, windows=None):
        return real(io, path, lo, hi, terms, fields, chars_of, slot_doc, lens, None)

    monkeypatch.setattr(S, "segment_write", bare)
    ix, _, queries = build(tmp_path, random.Random(9), n=1500, segments=2)
    segs = [p for p in ix._parts if isinstance(p, G.Segment)]
    assert segs and all(s.window_shift is None and s.bounds(0, 0) is None for s in segs)
    for q in queries:
        a, b = both(monkeypatch, lambda: ix.search(q, 10))
        assert a == b, q


def test_a_reopened_segment_keeps_its_bounds_and_refuses_bad_ones(corpus, tmp_path):
    ix, _, _ = corpus
    seg = next(p for p in ix._parts if isinstance(p, G.Segment))
    again = G.Segment(seg.path, FileIO())
    assert again.version == 3 and again.window_shift == 4
    t = next(t for t in range(again.n_terms) if again.bounds(0, t) is not None)
    row = again.bounds(0, t)[3]
    assert row == seg.bounds(0, t)[3]
    assert again.window_group(0).bval[row].tolist() == seg.window_group(0).bval[row].tolist()
    with pytest.raises(ValueError):  # bounds of a wrong length are not written
        G.write(FileIO(), str(tmp_path / "x.seg"), 0, 40, ["a"], [(np.array([0, 1]), np.array([3]), np.array([1]),
                                                                  np.array([0]))] * 3,
                lambda t: (), np.zeros(40, np.uint64), [np.zeros(40, np.uint32)] * 3,
                (4, [1.0, 1.0, 1.0], [(np.array([0], np.uint32), np.ones(1, np.float32), np.zeros(2, np.uint8),
                                       np.zeros(3, np.uint8))] * 3))
    with pytest.raises(ValueError, match="fit a byte"):  # windows too wide for a byte's count
        G.write(FileIO(), str(tmp_path / "y.seg"), 0, 40, ["a"], [(np.array([0, 1]), np.array([3]), np.array([1]),
                                                                  np.array([0]))] * 3,
                lambda t: (), np.zeros(40, np.uint64), [np.zeros(40, np.uint32)] * 3,
                (G.MAX_WINDOW_SHIFT + 1, [1.0, 1.0, 1.0], [(np.array([0], np.uint32), np.ones(1, np.float32),
                                                            np.zeros(1, np.uint8), np.zeros(1, np.uint8))] * 3))
    assert not (tmp_path / "x.seg").exists() and not (tmp_path / "y.seg").exists()


def test_a_segment_whose_bounds_do_not_fit_is_refused_even_when_its_checksum_holds(corpus, tmp_path):
    ix, _, _ = corpus
    seg = next(p for p in ix._parts if isinstance(p, G.Segment) and len(p._bterm[0]))
    raw = bytearray(open(seg.path, "rb").read())
    sections = G.SECTIONS[3].unpack_from(raw, G.HEAD.size)
    bterm0 = 2 * (4 + 4 * G.NFIELDS + 1 + G.NFIELDS + 1)  # field 0's bterm (offset, length)
    assert sections[bterm0 + 1] == 4 * len(seg._bterm[0])
    off, length = sections[bterm0], sections[bterm0 + 1]
    np.frombuffer(raw, np.uint32, length // 4, off)[-1:] = seg.n_terms  # a term past the last
    size = G.HEADER_SIZE[3]
    crc = zlib.crc32(bytes(raw[:size - 4]), zlib.crc32(bytes(raw[size:])))
    G.CRC.pack_into(raw, size - 4, crc)
    path = tmp_path / seg.name
    path.write_bytes(bytes(raw))
    with pytest.raises(G.SegmentInvalid, match="window bounds"):
        G.Segment(str(path), FileIO())


def test_a_phrase_bonus_with_no_doc_beside_bounded_lists_is_no_crash(tmp_path, monkeypatch):
    # the two bigrams never share a doc: the phrase bonus is empty, and (all else in a segment with
    # bounds) the only list without bounds
    ix = SearchIndex()
    for d in range(1, 401):
        ix.add(d, "会議" if d % 2 else "議会", None, ())
    ix.write_and_adopt(ix.plan(), FileIO(), str(tmp_path))
    a, b = both(monkeypatch, lambda: ix.search("会議会", 5))
    assert a == b and len(a) == 5


def test_the_index_grows_while_a_window_scorer_is_held(corpus, monkeypatch):
    # the scorer keeps the query's lists: in-memory ones as copies (a view would stop add() from
    # growing them), a segment's as views of its mapping
    ix, _, _ = corpus
    monkeypatch.setattr(S, "_WINDOW_MIN_POSTINGS", 0)
    monkeypatch.setattr(S, "_WINDOW_GIVE_UP", 10.0)
    hits, scorer = ix.search_scored("w0 w1 clustered", 5)
    assert isinstance(scorer, S._WindowScores) and hits
    before = scorer.totals(range(1, 3001))
    for d in range(5000, 5300):
        ix.add(d, "w0 w1 clustered", None, ())
    assert scorer.totals(range(1, 3001)) == before
    for d in range(5000, 5300):
        ix.remove(d)


def test_past_the_budget_the_window_kernel_stops_with_exact_scores(corpus, monkeypatch):
    ix, _, _ = corpus
    monkeypatch.setattr(S, "_WINDOW_MIN_POSTINGS", 0)
    monkeypatch.setattr(S, "_WINDOW_GIVE_UP", 10.0)
    monkeypatch.setattr(S, "_WINDOW_FIRST", 4)
    exact = {h.doc: h for h in ix.search("w0 w1 w2 w3", 3000)}
    for budget in (2000, 500, 1):
        monkeypatch.setattr(S, "_WINDOW_BUDGET", budget)
        hits, scorer = ix.search_scored("w0 w1 w2 w3", 10)
        # the rounds stop at the budget: the last one takes its best windows while it lasts (one at
        # least: a window holds at most a posting a list and slot)
        assert isinstance(scorer, S._WindowScores)
        assert scorer.postings_read <= budget + (len(scorer._sources) << S._WINDOW_SHIFT)
        assert hits and all(exact[h.doc] == h for h in hits)  # fewer or other docs, never other scores
        with monkeypatch.context() as m:
            m.setattr(S, "_WINDOW_MIN_POSTINGS", 10**12)
            _, arrays = ix.search_scored("w0 w1 w2 w3", 10)
        docs = list(range(1, 3001))
        assert scorer.totals(docs) == arrays.totals(docs)  # any doc's own score, read or probed


def test_the_production_density_rule_leaves_short_lists_to_the_query(tmp_path, monkeypatch):
    # the real rule (at least _BOUND_MIN postings and _BOUND_DENSITY a window) with small windows:
    # only the commonest words get bounds, the rest are read whole, and answers stay the array kernel's
    monkeypatch.setattr(S, "_BOUND_MIN", 64)
    monkeypatch.setattr(S, "_BOUND_DENSITY", 2)
    ix, _, queries = build(tmp_path, random.Random(12), n=2400, segments=2)
    segs = [p for p in ix._parts if isinstance(p, G.Segment)]
    kept = [len(s._bterm[0]) for s in segs]
    assert all(0 < k < s.n_terms / 10 for k, s in zip(kept, segs))
    for q in queries:
        a, b = both(monkeypatch, lambda: ix.search(q, 10))
        assert a == b, q


@pytest.mark.parametrize("damage", ["no empty slot", "average 0", "average nan", "bmax 0"])
def test_a_segment_whose_tables_are_impossible_is_refused_or_answers_without_hanging(corpus, tmp_path, damage):
    ix, _, _ = corpus
    seg = next(p for p in ix._parts if isinstance(p, G.Segment) and len(p._bterm[0]))
    raw = bytearray(open(seg.path, "rb").read())
    sections = G.SECTIONS[3].unpack_from(raw, G.HEAD.size)
    meta = 2 * (4 + 4 * G.NFIELDS + 1 + G.NFIELDS)
    bmax0 = meta + 2 * 2
    table = 2 * (G.N_SECTIONS[3] - 1)
    if damage == "no empty slot":  # every slot taken by the first term: a lookup of any other term ends
        np.frombuffer(raw, np.uint32, sections[table + 1] // 4, sections[table])[:] = 1
    elif damage.startswith("average"):
        np.frombuffer(raw, np.float64, 1, sections[meta] + 8)[:] = 0.0 if damage == "average 0" else np.nan
    else:
        np.frombuffer(raw, np.float32, 1, sections[bmax0])[:] = 0.0
    size = G.HEADER_SIZE[3]
    G.CRC.pack_into(raw, size - 4, zlib.crc32(bytes(raw[:size - 4]), zlib.crc32(bytes(raw[size:]))))
    path = tmp_path / seg.name
    path.write_bytes(bytes(raw))
    if damage == "no empty slot":
        bad = G.Segment(str(path), FileIO())
        first = bad.term_list()[0]
        assert bad.lookup(first) == 0 and bad.lookup(first + "never") == -1
    else:
        with pytest.raises(G.SegmentInvalid):
            G.Segment(str(path), FileIO())


def test_a_filter_over_arrays_of_docs_takes_the_window_kernel_with_the_same_answers(corpus, monkeypatch):
    # search_sessions filters by event type over whole arrays of docs (accept_docs): the window kernel
    # asks it about the docs of the windows it reads and cuts at the limit-th best acceptable score
    ix, _, queries = corpus
    taken = answered(monkeypatch, "_pool_windows")
    for name, keep in (("a third", lambda d: d % 3 == 0), ("one in 40", lambda d: d % 40 == 7), ("none", lambda d: False)):
        accept = lambda d, keep=keep: bool(keep(d))  # noqa: E731
        accept_docs = lambda docs, keep=keep: keep(docs)  # noqa: E731
        for q in queries:
            for limit in (1, 10, 50):
                a, b = both(monkeypatch, lambda: ix.search_own(q, limit, accept, accept_docs=accept_docs)[0])
                assert a == b, (name, q, limit)
                assert all(keep(d) for d, _ in a)
            a, b = both(monkeypatch, lambda: ranked_search(ix, q, 12, accept=accept, neighbours=neighbours,
                                                           accept_docs=accept_docs))
            assert a == b, (name, q)
    assert True in taken and False in taken  # a broad filter is pruned; "none" leaves the cut low: handed on


def test_counts_that_do_not_add_up_to_a_list_leave_it_to_be_read_whole(tmp_path, monkeypatch):
    # a list whose window counts do not sum to its length (no writer makes one; the CRC would have
    # to match) is read as a list without bounds: the same answers, no error
    ix, _, queries = build(tmp_path, random.Random(31), n=1500, segments=2)
    seg = next(p for p in ix._parts if isinstance(p, G.Segment) and len(p._bterm[0]))
    raw = bytearray(open(seg.path, "rb").read())
    sections = G.SECTIONS[3].unpack_from(raw, G.HEAD.size)
    bcnt0 = 2 * (4 + 4 * G.NFIELDS + 1 + G.NFIELDS + 1 + 3)
    np.frombuffer(raw, np.uint8, sections[bcnt0 + 1], sections[bcnt0])[::seg._n_win] += 1  # each row's first window
    size = G.HEADER_SIZE[3]
    G.CRC.pack_into(raw, size - 4, zlib.crc32(bytes(raw[:size - 4]), zlib.crc32(bytes(raw[size:]))))
    path = tmp_path / "bad" / seg.name
    path.parent.mkdir()
    path.write_bytes(bytes(raw))
    ix._parts[ix._parts.index(seg)] = G.Segment(str(path), FileIO())
    for q in queries:
        a, b = both(monkeypatch, lambda: ix.search(q, 10))
        assert a == b, q


def keyed(keep, key):
    """An accept_docs with a cache_key (as Store.etype_filter makes): the index may keep what it
    learns of it (its verdict by slot, bounds over its docs) under that key."""
    def accept_docs(docs):
        return keep(docs)
    accept_docs.cache_key = key
    return accept_docs


FILTERS = (("a third", lambda d: d % 3 == 0), ("one in 40", lambda d: d % 40 == 7), ("none", lambda d: d < 0))


def rows_taken(monkeypatch) -> list[tuple[int, int]]:
    """Spy on SearchIndex._accepted_bounds: per call, (rows read whole, rows of kept postings)."""
    out: list[tuple[int, int]] = []
    real = S.SearchIndex._accepted_bounds

    def spy(self, *a, **kw):
        add, full, krows = real(self, *a, **kw)
        out.append((int(full.sum()), len(krows)))
        return add, full, krows

    monkeypatch.setattr(S.SearchIndex, "_accepted_bounds", spy)
    return out


def test_bounds_over_a_filters_docs_bound_every_kept_posting(corpus):
    # storaged/filterbounds.py: per window, the highest impact of a kept posting, in 255ths of the
    # row's highest rounded up: never below what it bounds, a window with none kept adds nothing;
    # beside them, where the kept postings are in the list and how many each window holds
    from storaged.filterbounds import accepted_row
    ix, _, _ = corpus
    slot_doc = np.frombuffer(ix._slot_doc, np.uint64).astype(np.int64)
    checked = 0
    for _, keep in FILTERS:
        kept = keep(slot_doc)
        for seg in [p for p in ix._parts if isinstance(p, G.Segment)]:
            for f in range(3):
                table = np.array(S._impact_table(ix._field_q(f)))
                tids, counts, slots, keys = seg.export(f)
                off = np.concatenate(([0], np.cumsum(counts)))
                for t, a, b in zip(tids.tolist(), off[:-1].tolist(), off[1:].tolist()):
                    if seg.bounds(f, t) is None:
                        continue
                    group = seg.window_group(f)
                    row = accepted_row(group.slots[a:b], group.keys[a:b], table, kept, 4, group.w_lo, group.n_win, 1.0)
                    top, cells = row.top, row.cells
                    win = (slots[a:b].astype(np.int64) >> 4) - group.w_lo
                    best = np.zeros(group.n_win)
                    on = kept[slots[a:b]]
                    assert row.at.tolist() == np.flatnonzero(on).tolist()
                    assert row.counts.tolist() == np.bincount(win[on], minlength=group.n_win).tolist()
                    np.maximum.at(best, win[on], table[keys[a:b]][on])
                    bound = top * cells.astype(np.float64) / 255.0
                    assert (bound >= best).all() and top >= best.max()
                    assert (cells[best == 0] == 0).all()
                    checked += 1
    assert checked > 60


def test_a_filter_with_a_key_gives_the_answers_of_one_without(corpus, monkeypatch):
    # with a cache_key, the window kernel bounds windows over the filter's docs and the array kernel
    # sums only the postings of the slots it keeps: the same pool and scores to the bit as a filter
    # the index learns nothing of, asked of the docs it reached
    ix, _, queries = corpus
    taken = answered(monkeypatch, "_pool_windows")
    rows = rows_taken(monkeypatch)
    made = ix._filtered.made
    for i, (name, keep) in enumerate(FILTERS):
        accept = lambda d, keep=keep: bool(keep(d))  # noqa: E731
        plain = lambda docs, keep=keep: keep(docs)  # noqa: E731
        fast = keyed(keep, ("test", i))
        for q in queries:
            for limit in (1, 10, 50):
                want = both(monkeypatch, lambda: ix.search_own(q, limit, accept, accept_docs=plain)[0])[1]
                a, b = both(monkeypatch, lambda: ix.search_own(q, limit, accept, accept_docs=fast)[0])
                assert a == want and b == want, (name, q, limit)
            want = both(monkeypatch, lambda: ranked_search(ix, q, 12, accept=accept, neighbours=neighbours,
                                                           accept_docs=plain))[1]
            a, b = both(monkeypatch, lambda: ranked_search(ix, q, 12, accept=accept, neighbours=neighbours,
                                                           accept_docs=fast))
            assert a == want and b == want, (name, q)
    assert ix._filtered.made > made and True in taken
    assert any(k for _, k in rows) and not any(f for f, _ in rows)  # within the budget: kept postings only


def test_a_kept_filter_follows_slots_added_after_it_was_first_used(tmp_path, monkeypatch):
    ix, texts, queries = build(tmp_path, random.Random(5), n=1200)
    keep = lambda d: d % 4 == 1  # noqa: E731
    accept = lambda d: bool(keep(d))  # noqa: E731
    fast = keyed(keep, ("grow", 0))

    def check():
        for q in queries:
            want = both(monkeypatch, lambda: ix.search_own(q, 10, accept, accept_docs=lambda docs: keep(docs))[0])[1]
            assert both(monkeypatch, lambda: ix.search_own(q, 10, accept, accept_docs=fast)[0]) == (want, want), q

    check()
    n = len(ix._slot_doc)
    for d in range(5001, 5301):  # new slots, several of each query's words, kept and not
        ix.add(d, " ".join(texts[d - 5000].split() * 3), None, ())
    for d in range(1, 40):  # and some old docs again: their old slots die, new ones are added
        if d in ix:
            ix.remove(d)
            ix.add(d, texts[d], None, ())
    assert len(ix._slot_doc) > n
    check()
    assert ix._filtered.covered(("grow", 0)) == len(ix._slot_doc)


def test_a_filters_verdicts_made_ahead_in_steps_are_the_ones_a_query_makes(tmp_path, monkeypatch):
    # the daemon's idle steps make the usual filter's verdicts ahead (SearchIndex.keep_ahead), a
    # step of slots at a time; a query then finds them made, and answers as if it made them itself
    ix, _, queries = build(tmp_path, random.Random(8), n=900)
    keep = lambda d: d % 3 != 0  # noqa: E731
    fast = keyed(keep, ("ahead", 0))
    steps = 0
    while ix.keep_ahead(fast, step=100):
        steps += 1
        assert ix._filtered.covered(("ahead", 0)) == 100 * steps
    n = len(ix._slot_doc)
    assert steps == (n - 1) // 100 and ix._filtered.covered(("ahead", 0)) == n
    slot_doc = np.frombuffer(ix._slot_doc, np.uint64).astype(np.int64)
    assert ix._filtered.kept(("ahead", 0), slot_doc, fast).tolist() == keep(slot_doc).tolist()
    accept = lambda d: bool(keep(d))  # noqa: E731
    for q in queries:
        want = both(monkeypatch, lambda: ix.search_own(q, 10, accept, accept_docs=lambda docs: keep(docs))[0])[1]
        assert both(monkeypatch, lambda: ix.search_own(q, 10, accept, accept_docs=fast)[0]) == (want, want), q


def test_a_filtered_query_past_the_array_budget_sums_its_kept_postings_if_they_fit(corpus, monkeypatch):
    # past _ARRAY_POSTINGS a query is MaxScore's (a Python step a posting); a keyed filter's query
    # whose kept postings fit the budget is summed in C instead, with the same answers
    ix, _, queries = corpus
    monkeypatch.setattr(S, "_WINDOW_MIN_POSTINGS", 10**12)
    monkeypatch.setattr(S, "_SCAN_BUDGET", 10**12)  # MaxScore reads every list: exact
    outcomes = answered(monkeypatch, "_pool_arrays_kept")
    for i, (name, keep) in enumerate(FILTERS[:2]):
        accept = lambda d, keep=keep: bool(keep(d))  # noqa: E731
        fast = keyed(keep, ("budget", i))
        for q in queries:
            monkeypatch.setattr(S, "_ARRAY_POSTINGS", 10**12)
            want = ix.search_own(q, 10, accept, accept_docs=lambda docs, keep=keep: keep(docs))[0]
            monkeypatch.setattr(S, "_ARRAY_POSTINGS", 60)
            assert ix.search_own(q, 10, accept, accept_docs=fast)[0] == want, (name, q)
    assert True in outcomes and False in outcomes  # one in 40 fits the budget; a third often does not


@pytest.mark.parametrize("budget", [0, 40])
def test_bounds_over_a_filter_past_a_querys_budget_are_the_segments_own(corpus, monkeypatch, budget):
    # a query may read _FILTER_BOUNDS_BUDGET postings to make bounds over a new filter's docs; a row
    # past it adds the segment's bounds over all docs (sound, if looser): the same answers, and a
    # client that asks a new filter with each query never has every bounded list read whole for it
    ix, _, queries = corpus
    monkeypatch.setattr(S, "_FILTER_BOUNDS_BUDGET", budget)
    keep = lambda d: d % 5 == 2  # noqa: E731
    accept = lambda d: bool(keep(d))  # noqa: E731
    rows = rows_taken(monkeypatch)
    made = []
    for i, q in enumerate(queries):
        fast = keyed(keep, ("budget-rows", budget, i))  # a new key each query: nothing made before
        before = ix._filtered.made
        want = both(monkeypatch, lambda: ix.search_own(q, 10, accept, accept_docs=lambda docs: keep(docs))[0])[1]
        assert both(monkeypatch, lambda: ix.search_own(q, 10, accept, accept_docs=fast)[0]) == (want, want), q
        made.append(ix._filtered.made - before)
    if budget == 0:
        assert not any(made) and not any(k for _, k in rows)
    else:
        assert any(made) and max(made) <= 40 // 8  # a bounded list holds at least _BOUND_MIN (8) postings
        assert any(f and k for f, k in rows)  # a query that gathers kept postings of some rows, all of others


def test_a_keyed_filters_scorer_gives_every_docs_own_score(corpus, monkeypatch):
    # under a keyed filter the window kernel sums only the kept slots' postings of the windows it
    # reads; its scorer still gives any doc's own score, kept or not, read or not (storaged/rank.py
    # asks it of a hit's neighbours, whatever their type), as the unfiltered kernel's does
    ix, _, queries = corpus
    rng = random.Random(4)
    taken = answered(monkeypatch, "_pool_windows")
    for i, (name, keep) in enumerate(FILTERS[:2]):
        accept = lambda d, keep=keep: bool(keep(d))  # noqa: E731
        fast = keyed(keep, ("scorer", i))
        for q in queries:
            docs = {d for c in rng.sample(range(1, 3001), 30) for d in range(c - 4, c + 5)} | {0, 99999, -3}
            (_, sa), _ = both(monkeypatch, lambda: ix.search_own(q, 10, accept, accept_docs=fast))
            (_, sb) = both(monkeypatch, lambda: ix.search_scored(q, 10))[1]
            assert sa.totals(docs) == sb.totals(docs), (name, q)
            assert sa.fields(docs) == sb.fields(docs), (name, q)
            arr = np.array(sorted(docs) + [-1], np.int64)
            assert sa.own(arr).tolist() == sb.own(arr).tolist(), (name, q)
    assert True in taken


def test_a_prepared_query_searched_twice_answers_as_its_text_does(corpus, monkeypatch):
    # storaged/rank.py looks a query's lists up once (SearchIndex.prepare) for its two searches, the
    # pool unfiltered and then a filter's: each answers as a search of the text, scorer included
    ix, _, queries = corpus
    rng = random.Random(6)
    keep = FILTERS[0][1]
    accept = lambda d: bool(keep(d))  # noqa: E731
    fast = keyed(keep, ("prepared", 0))
    for q in queries:
        docs = np.array(sorted({d for c in rng.sample(range(1, 3001), 20) for d in range(c - 3, c + 4)}), np.int64)
        for fields in ((0, 1, 2), (0,)):
            def twice(text):
                p = ix.prepare(q, fields) if not text else q
                a, sa = ix.search_own(p, 12, None, None, fields)
                b, sb = ix.search_own(p, 12, accept, None, fields, fast)
                c, sc = ix.search_own(p, 12, None, None, fields)  # the filter's search changed nothing shared
                assert c == a and sc.own(docs).tolist() == sa.own(docs).tolist()
                return a, b, sa.own(docs).tolist(), sb.own(docs).tolist()
            assert both(monkeypatch, lambda: twice(False)) == both(monkeypatch, lambda: twice(True)), (q, fields)
    with pytest.raises(ValueError):
        ix.search_own(ix.prepare("w0", (0,)), 5, fields=(0, 1, 2))


def test_a_keyed_query_past_the_window_budget_is_handed_to_the_paths_that_read_lists_whole(corpus, monkeypatch):
    # with every row over a filter made, the window kernel gathers only kept postings and never gives
    # a query up for pruning too little; one that would read past _WINDOW_BUDGET is still handed over
    # (the array kernel: exact here), not cut to the best windows read
    ix, _, queries = corpus
    keep = FILTERS[0][1]
    accept = lambda d: bool(keep(d))  # noqa: E731
    fast = keyed(keep, ("past the budget", 0))
    taken = answered(monkeypatch, "_pool_windows")
    for q in ["w0 w1 w2 w3", *queries]:
        want = both(monkeypatch, lambda: ix.search_own(q, 10, accept, accept_docs=lambda docs: keep(docs))[0])[1]
        both(monkeypatch, lambda: ix.search_own(q, 10, accept, accept_docs=fast))  # its rows made
        with monkeypatch.context() as m:
            m.setattr(S, "_WINDOW_BUDGET", 300)
            assert both(monkeypatch, lambda: ix.search_own(q, 10, accept, accept_docs=fast)[0])[0] == want, q
    assert False in taken


def test_a_limit_of_zero_or_less_finds_nothing_whatever_the_tiebreak(corpus):
    ix, _, _ = corpus
    for limit in (0, -1):
        assert ix.search_own("w0 w1", limit, tiebreak=lambda d: (d,))[0] == []
