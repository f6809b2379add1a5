"""A range of the search index indexed by another process (SearchIndex.reserve / write_range / fill):
the index it leaves answers every query as one built in one go — same hits, same scores to the bit —
whether the range's segment comes from the child or the range is filled in process, with docs removed
while the range was open, and through a snapshot's segment and dump."""
import random

import pytest

from storaged.fileio import FileIO
from storaged.search import SearchIndex
from storaged.segment import Segment, SegmentInvalid, new_name

pytestmark = pytest.mark.timeout(60)

_WORDS = ("deploy", "deploys", "python3", "rust", "migration", "databases", "error", "exit", "code", "42",
          "v2", "cargo", "build", "failed", "データベース移行", "本番", "猫", "caroline's", "1,000")
QUERIES = ("deploy", "python", "rust migration", "exit code 42", "データベース", "猫", "caroline", "build failed v2",
           "databases error")


def _docs(n: int, seed: int = 5) -> list[tuple[int, str, str | None, list[str]]]:
    rnd = random.Random(seed)
    out = []
    for doc in range(n):
        text = " ".join(rnd.choice(_WORDS) for _ in range(rnd.choice((0, 3, 12, 60))))
        summary = rnd.choice((None, None, "deploy summary", "猫の話"))
        tags = rnd.choice(([], [], ["rust"], ["deploy", "ci"]))
        out.append((doc, text, summary, tags))
    return out


def _answers(ix: SearchIndex) -> list:
    return [[(h.doc, h.score, h.content, h.summary, h.tags) for h in ix.search(q, 50)] for q in QUERIES]


def _reference(docs, removed=()) -> SearchIndex:
    ref = SearchIndex()
    for d in docs:
        ref.add(*d)
    for doc in removed:
        ref.remove(doc)
    return ref


@pytest.fixture
def io():
    return FileIO()


def _opened(io, tmp_path, docs, head: int, upto: int) -> tuple[SearchIndex, int, int]:
    """An index with docs[:head] in a segment, docs[head:upto] reserved, the rest added above them."""
    ix = SearchIndex()
    for d in docs[:head]:
        ix.add(*d)
    ix.write_and_adopt(ix.plan(), io, str(tmp_path))
    lo, hi = ix.reserve([d[0] for d in docs[head:upto]])
    assert (lo, hi) == (head, upto) and ix.hole == (lo, hi)
    for d in docs[upto:]:
        ix.add(*d)
    return ix, lo, hi


def test_a_filled_range_answers_as_an_index_built_in_one_go(io, tmp_path):
    docs = _docs(300)
    ix, lo, hi = _opened(io, tmp_path, docs, 100, 220)
    removed = [105, 150, 219, 250]   # in the range (while it is open) and above it
    for doc in removed:
        ix.remove(doc)
    with pytest.raises(ValueError):
        ix.plan()                     # no snapshot of a half-built index
    path = SearchIndex.write_range(lo, docs[lo:hi], io, str(tmp_path), new_name())
    ix.fill(Segment(path, io))
    assert ix.hole is None and ix.doc_count() == 300 - len(removed)
    ref = _reference(docs, removed)
    assert _answers(ix) == _answers(ref)
    # and through a snapshot: the parts written (which drops dead postings, and so moves df, as it
    # does for any index), the dump loaded back with its segments: the same answers as before the load
    ix.write_and_adopt(ix.plan(), io, str(tmp_path))
    written = _answers(ix)
    again = SearchIndex.load(ix.dump(), str(tmp_path), io)
    assert _answers(again) == written and again.doc_count() == ix.doc_count()


def test_a_segment_that_is_not_the_ranges_is_refused_and_changes_nothing(io, tmp_path):
    docs = _docs(120)
    ix, lo, hi = _opened(io, tmp_path, docs, 40, 90)
    other = SearchIndex.write_range(lo, docs[lo + 1:hi + 1], io, str(tmp_path), new_name())   # other docs
    short = SearchIndex.write_range(lo, docs[lo:hi - 1], io, str(tmp_path), new_name())       # other slots
    for path in (other, short):
        with pytest.raises(SegmentInvalid):
            ix.fill(Segment(path, io))
        assert ix.hole == (lo, hi)
    ix.fill(Segment(SearchIndex.write_range(lo, docs[lo:hi], io, str(tmp_path), new_name()), io))
    assert _answers(ix) == _answers(_reference(docs))


def test_an_abandoned_range_gives_its_live_docs_back_and_is_written_empty(io, tmp_path):
    """The child failed: the range's docs leave the index (their slots dead behind an empty part), the
    caller indexes them again above, and a snapshot writes the empty part like any other."""
    docs = _docs(200)
    ix, lo, hi = _opened(io, tmp_path, docs, 50, 130)
    ix.remove(60)
    back = ix.abandon()
    assert back == [d[0] for d in docs[lo:hi] if d[0] != 60] and ix.hole is None
    assert all(doc not in ix for doc in back)
    for doc in back:
        ix.add(*docs[doc])
    ref = _reference(docs, removed=[60])
    assert sorted(h[0] for q in _answers(ix) for h in q) == sorted(h[0] for q in _answers(ref) for h in q)
    ix.write_and_adopt(ix.plan(), io, str(tmp_path))
    again = SearchIndex.load(ix.dump(), str(tmp_path), io)
    assert _answers(again) == _answers(ix) and again.doc_count() == 199


def test_live_lists_are_frozen_below_a_range_and_written_with_it(io, tmp_path):
    """Reserving while the live lists hold docs freezes them into a part below the hole; once the hole
    is filled, the next snapshot's plan writes that part too (with the segment after it)."""
    docs = _docs(150)
    ix = SearchIndex()
    for d in docs[:40]:
        ix.add(*d)
    ix.write_and_adopt(ix.plan(), io, str(tmp_path))
    for d in docs[40:70]:
        ix.add(*d)                    # live lists, not written
    for bad in ([3], [130, 3], [131, 131]):   # already indexed, given twice: refused, nothing changed
        with pytest.raises(ValueError):
            ix.reserve(bad)
        assert ix.hole is None and 130 not in ix and 131 not in ix and ix.doc_count() == 70
    lo, hi = ix.reserve([d[0] for d in docs[70:120]])
    assert (lo, hi) == (70, 120)
    with pytest.raises(ValueError):
        ix.reserve([130])             # one at a time
    for d in docs[120:]:
        ix.add(*d)
    ix.fill(Segment(SearchIndex.write_range(lo, docs[lo:hi], io, str(tmp_path), new_name()), io))
    assert _answers(ix) == _answers(_reference(docs))
    plan = ix.plan()
    assert plan.slot_lo <= 40 and plan.slot_hi == 150   # the frozen part below the range is in the run
    ix.write_and_adopt(plan, io, str(tmp_path))
    again = SearchIndex.load(ix.dump(), str(tmp_path), io)
    assert _answers(again) == _answers(ix)


def test_retired_lists_are_freed_for_a_time_budget_after_each_batch(io, tmp_path):
    """A loop that is never idle (a backfill) frees the lists a segment replaced after each batch of
    requests (``release_step(busy=True)``) for up to _RELEASE_BUSY_S, not one chunk: one chunk a batch
    fell behind the lists a sustained import retires (its memory grew ~2 KB an event)."""
    from storaged import search

    ix = SearchIndex()
    for d in _docs(3000, seed=9):
        ix.add(d[0], d[1] + f" uniq{d[0]}x", d[2], d[3])   # a term of its own per doc: many objects
    ix.write_and_adopt(ix.plan(), io, str(tmp_path))
    part = ix._retired[-1]
    before = sum(map(len, (*part.slots, *part.keys, part.terms)))
    assert before > 3 * search._RELEASE_STEP_BUSY
    ix.release_step(busy=True)
    after = sum(map(len, (*part.slots, *part.keys, part.terms))) if ix._retired else 0
    assert before - after > search._RELEASE_STEP_BUSY   # more than one chunk in one call
    calls = 1
    while ix._retired:
        ix.release_step(busy=True)
        calls += 1
    assert calls < before // search._RELEASE_STEP_BUSY   # one chunk a call would take this many
