"""In-memory inverted index with BM25 ranking over three fields (content, summary, tags).

Layout (chosen for memory at 1M messages and for query speed):

* Every add() gets a new dense *slot*; postings hold slots, so each posting list is sorted by
  construction (binary search works) even when docs arrive out of order, and a re-added doc never
  collides with its old postings.  `_slot_doc` maps slot → doc, `_docmap` doc → slot.
* Per field, per term id: `None`, a bare int (the one slot of a term seen once — most terms), or
  an `array('I')` of slots with a parallel `array('H')` of keys.  A key packs a quantised term
  frequency (5 bits) and doc length (11 bits: exact below 1024, then 1 % steps), so the BM25
  impact of a posting is one lookup in a 64K table that depends only on the field's average length.
  No per-posting objects exist at rest: ~6 bytes a posting.
* remove() tombstones the slot (`_alive`; queries skip dead slots) and takes the doc out of the
  collection statistics at once (N and average length per field are exact for live docs).  Its
  postings are purged lazily by a sweeper that advances a bounded step (~2K postings) on each
  add()/remove() once enough docs died (≥ 1/8 of the live count): under update churn the posting
  memory stays within ~1/8 of the live postings plus one pass.  Until the sweeper reaches a list,
  that term's df still counts the dead postings.  Slot-indexed arrays (~21 bytes a slot) are
  renumbered by compact(), which runs by itself only when dead slots outnumber live ones (one
  pass over all postings; the store may also call it when convenient).  dump() saves the state
  as is, so scores after load() are identical.

Query evaluation, for a query whose lists hold at most _ARRAY_POSTINGS postings in all (every
LoCoMo question, nearly every query at 200k agent events): the array kernel (SearchIndex._pool_arrays, numpy).  All of its
postings go into one array, in list order, and one np.bincount sums them per slot: in C, and the
same additions in the same order as scanning list after list, so the same scores to the bit.  The
posting arrays are read through views that never outlive the call (a live view would stop add()
from growing them).  Longer queries: term-at-a-time MaxScore in Python, which reads fewer
postings: lists are taken in decreasing order of their upper bound; once `limit` acceptable docs score more than everything the remaining lists could still
give a newcomer, the remaining (long, low-idf) lists are only probed by binary search for the
surviving candidates instead of being scanned.  Results are exact (not approximate top-k) unless a
query hits one of the budgets that bound the work of every call (many common words: postings
scanned, probe steps; a filter that rejects nearly everything: filter calls; many one-character
CJK runs: expansion postings).  Then the docs returned may not be the exact top-k, but their
scores are; SearchIndex.search says which queries are guaranteed exact.

Block-max pruning (the window kernel, SearchIndex._pool_windows): a query of at least
_WINDOW_MIN_POSTINGS postings, unfiltered or filtered over arrays of docs, is not summed whole.  The slots are cut into windows of 64; a segment
keeps, for each of its long lists, the list's highest impact and postings in each window, so a query
knows, per window, the most its lists together can add to one doc there.  Windows are scored best
bound first, a round at a time, and the search stops when no window left can reach the pool's worst
score: the array kernel's pool and scores to the bit, from a few percent of the postings on the
queries that matter (a common word beside a rarer one).  A query the bounds prune too little is
handed back to the paths that read every list.

A filter with a key (Store.etype_filter: search_sessions' event types) is one the index may learn:
its verdict by slot (a byte a slot, made once and kept, ahead in the daemon's idle steps for the
usual one), so that the array kernel sums only the postings of the slots it keeps (~3% of a common
query's at 5M events), and window bounds over its docs for the long lists a query reads, made on
first need and kept in a bounded cache (storaged/filterbounds.py) — a segment's bounds are over all
docs, and under a filter that keeps a minority they prune nothing.  The same pool and scores to the
bit as asking the filter of each doc reached.

CJK: a query run's bigrams are OR-ed terms; in addition, a doc whose field holds every bigram of a
run (the phrase, or all its pieces) gets a bonus equal to the most any doc could score from those
bigrams in that field, so in that field it ranks above every doc holding only some of them.  A
one-character run also matches the bigrams containing that character.

Segments: the lists above are the index's live, in-memory part.  At each snapshot they are frozen
(plan(): new docs go to fresh lists, queries read the frozen ones meanwhile) and written as an
immutable segment file that the snapshot names (write_segment(), storaged/segment.py), which then
replaces them (adopt()); a new segment takes in the smaller ones before it (geometric merging, which
also drops dead postings).  A start maps the segments instead of rebuilding anything.  Every part
(segments, frozen lists, live lists) covers its own range of slots, in order, so a term's postings in
the index are its lists in the parts one after the other: a query makes one list per part that holds
the term, all with the term's idf over the whole index and its bound over all parts — the scores of
one list of them all.  Slot numbers are fixed once a segment holds them (compact() then only sweeps
the live lists), and so are each slot's doc and lengths: a segment holds those of its slots, and
the dump only those of the slots no segment holds (dump()).

All state lives on the instance, so one thread may fill a fresh index while another queries an
old one (a rebuild's worker does it in a forked child: compaction.run_child).
"""

from __future__ import annotations

import math
import os
import re
import sys
import time
from array import array
from bisect import bisect_left, insort
from collections import Counter
from functools import lru_cache
from heapq import heapify, heappop, nlargest
from itertools import accumulate, compress, repeat
from operator import and_, itemgetter
from typing import Any, Callable, Generator, Iterable, NamedTuple, Sequence

import numpy as np

from protocol.requests import run_steps
from storaged.fileio import DROP_WINDOW_PAGES
from storaged.filterbounds import FilteredBounds, accepted_row
from storaged.segment import (Segment, SegmentInvalid, is_index_segment_name, new_name as new_segment_name,
                              window_range as segment_window_range, write as segment_write)
from storaged.tokenize import ASCII_WORD_CLASS, TERMS_MAX, WORD_TERMS, index_terms, posting_items, query_runs

# storaged/postings.c, built at install where a C compiler is (setup.py); CONVMEM_NO_NATIVE_POSTINGS=1 leaves
# it unused (the Python path: the same lists, ~1.6x slower), should it ever be suspected
NATIVE_POSTINGS_ENV = "CONVMEM_NO_NATIVE_POSTINGS"
NATIVE_POSTINGS_OFF = os.environ.get(NATIVE_POSTINGS_ENV, "") not in ("", "0")
_native_post = None
if not NATIVE_POSTINGS_OFF:
    try:
        from convmem_postings import configure as _native_configure, post as _native_post
    except ImportError:
        pass


def native_postings() -> bool:
    """Whether add() appends postings in C (the daemon says so at start when it does not)."""
    return _native_post is not None

__all__ = ["DumpOutdated", "Hit", "QueryScores", "SearchIndex", "SegmentPlan"]

FIELDS = ("content", "summary", "tags")

# Tuned on LoCoMo (bench/search_quality.py): short conversational messages want a low k1 and weak
# length normalisation.  Summary/tags weights tuned with LoCoMo "observations" as summaries.
K1 = 0.8
B = 0.3
FIELD_WEIGHTS = (1.0, 0.8, 0.6)

_TF_BITS = 5
_DL_BITS = 11
_DL_EXACT = 1024  # doc lengths below this are exact
_DL_STEP = 1.01  # above, geometric buckets
_TF_EXACT = 16
_TF_STEP = 1.6
_KEY_DL_MASK = (1 << _DL_BITS) - 1

# Tombstone sweeping: a pass over all posting lists starts once this many docs died since the
# last pass (and at least 1/8 of the live count), and advances by _SWEEP_BUDGET postings per
# add()/remove() call.  Slots are renumbered (one stop-the-world pass) only when dead slots
# outnumber live ones.
_SWEEP_MIN_DEAD = 256
_SWEEP_BUDGET = 2048
_RENUMBER_MIN_DEAD = 4096
_CHAR_EXPANSION_BUDGET = 100_000  # postings read for all the one-character CJK runs of a query
# The work of one query, so that no query can stall the daemon's loop for everyone else (35 common
# words at 200k messages took 1.6-2.4 s). Lists are scanned best bound first (rare terms first) while
# the postings scanned stay within _SCAN_BUDGET; the lists left over are then only probed for the best
# acceptable docs found so far: _PROBE_CANDIDATES of them, fewer if probing would take more than
# _PROBE_BUDGET steps. The caller's filter is asked about at most _ACCEPT_BUDGET docs. The scores of
# the docs returned stay exact; what is lost past a budget is a doc that the scanned terms rank low
# (see SearchIndex.search). Ordinary queries read far fewer postings and are exact
# (bench/search_quality.py: identical figures).
_SCAN_BUDGET = 100_000
_PROBE_CANDIDATES = 1_000
_PROBE_BUDGET = 100_000
_ACCEPT_BUDGET = _SCAN_BUDGET  # >= the docs any query within the scan budget can reach: those stay exact
# A query whose lists hold at most this many postings in all is scored by the array kernel
# (SearchIndex._pool_arrays: every list summed at once in C, exact); longer ones by MaxScore in Python
# (within the budgets above). The kernel reads every posting but at C speed: on the 200k-event agent
# corpus (bench.scale's 400 queries, in-process) p95/p99/max 127/294/403 ms with MaxScore above 100k
# postings, 13/21/56 ms with the kernel up to 4M; its transient arrays are ~14 bytes a posting.
_ARRAY_POSTINGS = 4_000_000
# Window bounds (block-max pruning): a segment keeps, for each list of at least _BOUND_MIN postings,
# its highest impact in each window of 2**_WINDOW_SHIFT slots (and _BOUND_DENSITY postings a window on
# average). A query of at least _WINDOW_MIN_POSTINGS postings (unfiltered, or filtered over arrays of
# docs) is then scored a few windows at a time, best bound first, and stops at
# the first window whose bound cannot reach its best docs (SearchIndex._pool_windows): the same pool
# and scores as the array kernel, without reading most of the long lists (bench/SPIKES.md part 10).
_WINDOW_SHIFT = 6
_BOUND_MIN = 1024
_BOUND_DENSITY = 2
_WINDOW_MIN_POSTINGS = 1 << 17
_WINDOW_FIRST = 1024  # windows scored in the first round; each later round four times more
_WINDOW_GIVE_UP = 0.5  # ... unless the windows still in the running hold more than this share of the postings
_WINDOW_BUDGET = _ARRAY_POSTINGS  # postings it reads at most (the array kernel's budget; the rest probed)
# postings a query may read to make window bounds over a keyed filter's docs (_accepted_bounds; ~5 ms at 5M)
_FILTER_BOUNDS_BUDGET = 2_000_000
# slots a load run in steps (SearchIndex.load_steps: a rebuild's install) handles a turn of the loop:
# per-slot tables copied, the index's arrays made, docs put in the doc map
_LOAD_STEP = 1 << 18
_BOUND_CHUNK = 1 << 22  # postings a segment writer turns into bounds at once (its transient arrays)
# Its accumulator is a float per slot (np.bincount, O(slots)) unless the index has more slots than
# 8 per posting plus this many; then the postings are sorted instead (np.unique, O(P log P)).
_DENSE_SLOTS = 65536
# Sub-word/prefix matches: a Latin query word of at least _PREFIX_MIN characters (stemmed, or as
# typed) also matches the longer vocabulary terms it begins ("postgres", "Postgre", "ｐｏｓｔｇｒｅｓ" →
# postgresql): the _PREFIX_TERMS of them with the most docs, found among the first _PREFIX_SCAN in
# sorted order, each weighted _PREFIX_WEIGHT × its idf capped by the exact term's, so a prefix match
# never outweighs the same doc holding the exact term.  Tuned on LoCoMo dev (bench/search_quality.py):
# with these values no category loses at recall@5 or @10 (more terms or a higher weight each cost a
# question somewhere).  A query looks at most _PREFIX_QUERY_BUDGET vocabulary terms for all its words.
_PREFIX_MIN = 6
_PREFIX_TERMS = 1
_PREFIX_SCAN = 256
_PREFIX_QUERY_BUDGET = 2048
_PREFIX_WEIGHT = 0.35
# The sorted prefix list is built off the query path, this many vocabulary terms per step (~5 ms at
# 1M terms on the project's VM): a query advances the build by one step and, until it is done, runs
# without prefix expansion; a vocabulary of up to this many terms is ready on its first query.
_PREFIX_BUILD_STEP = 16384
_CJK_CHAR = re.compile(
    "[\u3005-\u3007\u3041-\u309f\u30a0-\u30ff\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
    "\u1100-\u11ff\u3130-\u318f\ua960-\ua97f\uac00-\ud7af\ud7b0-\ud7ff"
    "\U00020000-\U0002fa1f\U00030000-\U0003134f]"
)

# The dump's format string names the layout AND the tokenizer whose terms it holds: a dump is only
# valid for the stemmer that made its terms.  /1: terms of the hand-written Porter stemmer; /2: of
# PyStemmer's English Snowball (storaged/tokenize.py).
# /3: and the list of segments the postings below mem_lo are in; /4: the segments hold their slots'
# docs and lengths too, the dump only those of the slots no segment holds, the alive flags as bits, and
# no doc map (dump()).
_FORMAT = "convmem-search/4"
_READABLE_FORMATS = ("convmem-search/2", "convmem-search/3", _FORMAT)  # a /2 dump is a /3 one without segments
_OUTDATED_FORMATS = ("convmem-search/1",)
# Segment merging (SearchIndex.plan): a new segment takes in the segments before it while the one
# before is at most _MERGE_RATIO times its postings (sizes then grow geometrically: a posting is
# rewritten about log(n) times), and when more than _MAX_SEGMENTS would remain — but never past
# _MERGE_MAX_POSTINGS postings, so that one merge (in the snapshot child, which holds its inputs'
# vocabularies and ~40 bytes a posting of numpy temporaries, and is stopped after
# server.SNAPSHOT_CHILD_MAX_S) stays bounded whatever the store's size: a big store has several
# segments of that size (a query looks a term up in each: ~15 us a segment).
_MERGE_RATIO = 2
_MAX_SEGMENTS = 10
_MERGE_MAX_POSTINGS = 32_000_000
# ... and a snapshot written by the daemon itself (a clean stop, a migration: the request loop's thread,
# a supervisor's stop timeout) merges only up to this (~1 s): bigger merges are the snapshot child's
_INLINE_MERGE_MAX_POSTINGS = 2_000_000
_RELEASE_STEP = 8192  # objects of replaced frozen lists freed per idle step (~1 ms)
_RELEASE_STEP_BUSY = 1024  # ... and after each batch of requests, whose clients are waiting (~0.1 ms),
# chunks of which are freed for up to _RELEASE_BUSY_S then: a sustained import (a backfill: the loop is
# never idle) retires the lists of a snapshot every few seconds, ~100k objects a second, and one chunk a
# batch freed a tenth of that — the retired lists piled up at ~2 KB an event (anonymous RSS 0.9 GiB at
# 500k events of bench.scale's corpus)
_RELEASE_BUSY_S = 0.002
# live postings that make a snapshot due by themselves (~40k agent events, ~60 MB of lists): what a
# burst of writes left in memory is written as a segment by the next background snapshot
_FLUSH_POSTINGS = 4_000_000


class DumpOutdated(ValueError):
    """A dump written by an earlier release (other terms): the store replays its log instead and
    replaces the snapshot at once, as for a snapshot of an earlier format."""


class Hit(NamedTuple):
    doc: int
    score: float
    content: float
    summary: float
    tags: float


def _tf_bucket(tf: int) -> int:
    if tf <= _TF_EXACT:
        return tf - 1
    return min((1 << _TF_BITS) - 1, _TF_EXACT + int(math.log(tf / _TF_EXACT, _TF_STEP)))


def _dl_bucket(dl: int) -> int:
    if dl < _DL_EXACT:
        return dl
    return min(_KEY_DL_MASK, _DL_EXACT + int(math.log(dl / _DL_EXACT, _DL_STEP)))


_TF_REP = [
    float(q + 1) if q < _TF_EXACT else _TF_EXACT * _TF_STEP ** (q - _TF_EXACT + 0.5)
    for q in range(1 << _TF_BITS)
]
_DL_REP = [
    float(q) if q < _DL_EXACT else _DL_EXACT * _DL_STEP ** (q - _DL_EXACT + 0.5)
    for q in range(1 << _DL_BITS)
]
# Doc-length bucket for lengths < _DL_EXACT is the length itself; precompute the rest lazily.
_SIZEOF_INT = sys.getsizeof(1 << 40)
_SIZEOF_ARRAY = sys.getsizeof(array("I"))
_SIZEOF_FLOAT = sys.getsizeof(1.5)
if _native_post is not None:
    _native_configure(_DL_EXACT, _TF_EXACT, _DL_BITS, _dl_bucket, _tf_bucket, ASCII_WORD_CLASS, WORD_TERMS, TERMS_MAX)


def _impact_table(q: float, rows: int = 1 << _TF_BITS) -> list[float]:
    """Impact by key (tf bucket << _DL_BITS | length bucket): BM25's tf part at average length q,
    for the first ``rows`` tf buckets, zeros for the rest."""
    c0 = K1 * (1.0 - B)
    c1 = K1 * B / q
    k1p = K1 + 1.0
    t = []
    for tf in _TF_REP[:rows]:
        num = tf * k1p
        base = tf + c0
        t.extend([num / (base + c1 * dl) for dl in _DL_REP])
    t.extend([0.0] * ((len(_TF_REP) - rows) << _DL_BITS))
    return t


def _array_in_steps(code: str, values: np.ndarray) -> Generator[None, None, array]:
    """``values`` as an array.array of ``code`` (the index's own tables are arrays, grown in place by
    add()), _LOAD_STEP items a step: 5M slots' docs at once, 42 MB, took 17-66 ms of the loop."""
    out = array(code)
    raw = memoryview(values).cast("B")
    step = _LOAD_STEP * out.itemsize
    for a in range(0, len(raw), step):
        out.frombytes(raw[a:a + step])
        yield
    return out


def _concat_ranges(starts: np.ndarray, lens: np.ndarray, total: int) -> np.ndarray:
    """The positions [starts[i], starts[i] + lens[i]) of every i, one after the other (``total``: the
    lengths' sum): how the window kernel and the bounds writer gather many lists' pieces at once."""
    return np.repeat(starts - (np.cumsum(lens) - lens), lens) + np.arange(total)


@lru_cache(maxsize=64)
def _drift(q_then: float, q_now: float) -> float:
    """The most any impact at average length q_now exceeds the same key's at q_then (>= 1): a window
    bound a segment wrote at q_then, times this, bounds the window at q_now."""
    if q_then == q_now:
        return 1.0
    then = np.array(_impact_table(q_then))
    now = np.array(_impact_table(q_now))
    return max(1.0, float(np.max(now / then)) * (1.0 + 1e-12))


def _window_bounds(off: np.ndarray, slots: np.ndarray, keys: np.ndarray, lo: int, hi: int,
                   impacts: np.ndarray) -> tuple[np.ndarray, ...]:
    """(bterm, bmax, bval, bcnt) of one field of a segment (storaged/segment.py) at ``impacts`` (the
    impact table by key): the terms whose list holds at least _BOUND_MIN postings and _BOUND_DENSITY
    a window on average (a shorter list costs less to read than its bounds), each one's highest
    impact (float32, rounded up), and per window of the range its highest there in 255ths of that
    (rounded up: a bound is never below the impact it bounds) and its postings there."""
    counts = np.diff(off)
    w_lo, w_hi = segment_window_range(lo, hi, _WINDOW_SHIFT)
    nw = w_hi - w_lo
    long = np.flatnonzero(counts >= max(_BOUND_MIN, _BOUND_DENSITY * nw))
    bmax = np.zeros(len(long), np.float32)
    bval = np.zeros(len(long) * nw, np.uint8)
    bcnt = np.zeros(len(long) * nw, np.uint8)
    i = 0
    while i < len(long):  # a chunk of long terms at a time: ~_BOUND_CHUNK postings of transients
        j = i + 1
        size = int(counts[long[i]])
        while j < len(long) and size + counts[long[j]] <= _BOUND_CHUNK:
            size += int(counts[long[j]])
            j += 1
        run = long[i:j]
        starts, lens = off[run].astype(np.int64), counts[run].astype(np.int64)
        at = _concat_ranges(starts, lens, int(lens.sum()))
        rank = np.repeat(np.arange(i, j, dtype=np.int64), lens)
        cell = rank * nw + ((slots[at].astype(np.int64) >> _WINDOW_SHIFT) - w_lo)  # ascending: lists in slot order
        imp = impacts[keys[at]]
        first = np.flatnonzero(np.concatenate(([True], cell[1:] != cell[:-1])))
        best = np.maximum.reduceat(imp, first)
        top = np.maximum.reduceat(imp, np.concatenate(([0], np.cumsum(lens)[:-1])))
        t32 = top.astype(np.float32)
        low = t32.astype(np.float64) < top
        t32[low] = np.nextafter(t32[low], np.float32(np.inf))
        bmax[i:j] = t32
        groups = cell[first]
        scale = t32.astype(np.float64)[groups // nw - i]
        bval[groups] = np.minimum(np.ceil(best / scale * 255.0 * (1.0 + 1e-9)), 255).astype(np.uint8)
        bcnt[groups] = np.diff(np.append(first, len(cell)))
        i = j
    return long.astype(np.uint32), bmax, bval, bcnt


def _idf(df: int, n: int) -> float:
    # df may still count tombstoned docs the sweeper has not reached (n never does): keep the
    # weight positive, which the pruning in search() relies on.
    return max(math.log(1.0 + (n - df + 0.5) / (df + 0.5)), 1e-3)


class _DocMap:
    """doc → slot.  Docs are creation sequence numbers, so a flat array is ~4 bytes a doc;
    docs far beyond the array's end (not expected) go to a dict instead of inflating it."""

    __slots__ = ("arr", "extra")

    def __init__(self) -> None:
        self.arr = array("i")
        self.extra: dict[int, int] = {}

    def get(self, doc: int) -> int:
        arr = self.arr
        if 0 <= doc < len(arr):
            return arr[doc]
        return self.extra.get(doc, -1)

    def set(self, doc: int, slot: int) -> None:
        arr = self.arr
        n = len(arr)
        if doc >= n and doc < 2 * n + (1 << 16):
            arr.extend(array("i", [-1]) * (doc + 1 - n + (doc >> 4)))
            if self.extra:  # pull overflow entries that now fit
                for d in [d for d in self.extra if d < len(arr)]:
                    arr[d] = self.extra.pop(d)
        if doc < len(arr):
            arr[doc] = slot
        elif slot < 0:
            self.extra.pop(doc, None)
        else:
            self.extra[doc] = slot

    def nbytes(self) -> int:
        return sys.getsizeof(self.arr) + sys.getsizeof(self.extra) + len(self.extra) * 2 * _SIZEOF_INT


# --- query-time posting lists -------------------------------------------------------------------
# Each knows its field, an upper bound `ub` of what it adds to one doc, a size (postings), and can
# scan itself into an accumulator, probe sorted candidates, or give one doc's contribution.


class _TermList:
    __slots__ = ("field", "ub", "size", "w", "slots", "keys", "table", "win")

    def __init__(self, field, slots, keys, w, table, maxtf, win=None):
        self.field = field
        self.slots = slots
        self.keys = keys
        self.w = w
        self.table = table
        self.size = _list_size(slots)
        self.ub = w * table[(maxtf << _DL_BITS) | 1]
        self.win = win  # its bounds in a segment (Segment.bounds), or None

    def scan_into(self, acc: dict) -> None:
        w, table, slots = self.w, self.table, self.slots
        if type(slots) is int:
            acc[slots] = acc.get(slots, 0.0) + w * table[self.keys]
        elif not acc:
            acc.update(zip(slots, map(w.__mul__, map(table.__getitem__, self.keys))))
        else:
            get = acc.get
            for s, k in zip(slots, self.keys):
                acc[s] = get(s, 0.0) + w * table[k]

    def arrays(self, impacts: np.ndarray):
        """(slots, contributions) as arrays (or one-item lists), ``impacts`` the table as an array.
        The slots are a view of the posting array: the caller must drop it before the index next
        changes (while a view exists, add() cannot grow the array)."""
        slots = self.slots
        if type(slots) is int:
            return [slots], [self.w * self.table[self.keys]]
        if impacts is None:  # the index dropped its cached tables since this list was made
            impacts = np.array(self.table)
        return np.frombuffer(slots, np.uint32), impacts[np.frombuffer(self.keys, np.uint16)] * self.w

    def probe(self, cands: list, scores: list) -> None:
        slots = self.slots
        w, table = self.w, self.table
        if type(slots) is int:
            i = bisect_left(cands, slots)
            if i < len(cands) and cands[i] == slots:
                scores[i] += w * table[self.keys]
            return
        n = len(slots)
        keys = self.keys
        if n < len(cands):  # a short list: walk it, not the candidates
            get = dict(zip(cands, range(len(cands)))).get
            for s, k in zip(slots, keys):
                i = get(s)
                if i is not None:
                    scores[i] += w * table[k]
        elif len(cands) * 4 < n:
            lo = 0
            for i, s in enumerate(cands):
                lo = bisect_left(slots, s, lo)
                if lo == n:
                    break
                if slots[lo] == s:
                    scores[i] += w * table[keys[lo]]
        else:
            where = dict(zip(slots, keys))
            get = where.get
            for i, s in enumerate(cands):
                k = get(s)
                if k is not None:
                    scores[i] += w * table[k]

    def merge_into(self, cands: list, scores: list) -> None:
        """probe() for candidates that come in runs of near slots (session windows): a galloping
        merge of the two sorted sequences, a binary search on each side per gap, so the cost
        follows the matches and the runs, never the length of the list."""
        slots = self.slots
        if type(slots) is int or len(slots) < len(cands):
            self.probe(cands, scores)
            return
        w, table, keys = self.w, self.table, self.keys
        n, m = len(slots), len(cands)
        i = j = 0
        while i < m:
            j = bisect_left(slots, cands[i], j)
            if j == n:
                return
            s = slots[j]
            if cands[i] != s:
                i = bisect_left(cands, s, i + 1)
                if i == m or cands[i] != s:
                    continue
            scores[i] += w * table[keys[j]]
            i += 1
            j += 1

    def value(self, s: int) -> float:
        slots = self.slots
        if type(slots) is int:
            return self.w * self.table[self.keys] if slots == s else 0.0
        i = bisect_left(slots, s)
        if i < len(slots) and slots[i] == s:
            return self.w * self.table[self.keys[i]]
        return 0.0


def _contains(slots, s: int) -> bool:
    if type(slots) is int:
        return slots == s
    i = bisect_left(slots, s)
    return i < len(slots) and slots[i] == s


class _PhraseBonus:
    """Docs holding every bigram of a CJK query run in this field.  ``grams``: per bigram, its
    posting lists (one per part of the index that holds it: a doc is in one of them)."""

    __slots__ = ("field", "ub", "size", "grams", "_slots", "_docs")

    def __init__(self, field, grams, bonus):
        self.field = field
        self.grams = sorted(grams, key=_gram_size)
        self.ub = bonus
        self.size = _gram_size(self.grams[0])
        self._slots = None
        self._docs = None

    def slots(self) -> np.ndarray:
        """The slots in every bigram's lists, ascending: the rarest bigram's, then those of them in
        each next one by binary search (in C; a set per bigram cost ~6 ms a Japanese query at 5M)."""
        if self._slots is None:
            first, *rest = self.grams
            cur = _gram_slots(first)
            for g in rest:
                if not len(cur):
                    break
                other = _gram_slots(g)
                if not len(other):
                    cur = other
                    break
                at = np.minimum(np.searchsorted(other, cur), len(other) - 1)
                cur = cur[other[at] == cur]
            self._slots = cur
        return self._slots

    def docs(self) -> set:
        if self._docs is None:
            self._docs = set(self.slots().tolist())
        return self._docs

    def scan_into(self, acc: dict) -> None:
        v = self.ub
        get = acc.get
        for s in self.docs():
            acc[s] = get(s, 0.0) + v

    def arrays(self, impacts=None):
        slots = self.slots()
        return slots, np.full(len(slots), self.ub)

    def probe(self, cands: list, scores: list) -> None:
        v = self.ub
        for i, s in enumerate(cands):
            if self.value(s):
                scores[i] += v

    def value(self, s: int) -> float:
        if self._docs is not None:
            return self.ub if s in self._docs else 0.0
        return self.ub if all(any(_contains(p, s) for p in g) for g in self.grams) else 0.0


def _list_size(p) -> int:
    """Postings in a list as the index keeps it: a bare int (one posting) or an array/memoryview."""
    return 1 if type(p) is int else len(p)


def _gram_size(lists) -> int:
    return sum(map(_list_size, lists))


def _df_of(got: list) -> int:
    """Postings of a term in one field over the parts holding it (``_term_postings``' lists)."""
    return sum(_list_size(g[0]) for g in got)


def _gram_slots(lists) -> np.ndarray:
    """One bigram's slots, ascending: its lists are one a part, and the parts cover ascending ranges
    of slots (copied out: a view of a live list would stop add() from growing it)."""
    parts = [np.array([p], np.int64) if type(p) is int else np.frombuffer(p, np.uint32).astype(np.int64)
             for p in lists]
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


class _MaterialList:
    """A synthetic list held as slot → contribution (one-character CJK query expansions)."""

    __slots__ = ("field", "ub", "size", "vals")

    def __init__(self, field, vals: dict):
        self.field = field
        self.vals = vals
        self.size = len(vals)
        self.ub = max(vals.values())

    def scan_into(self, acc: dict) -> None:
        get = acc.get
        for s, v in self.vals.items():
            acc[s] = get(s, 0.0) + v

    def arrays(self, impacts=None):
        vals = self.vals
        return np.fromiter(vals, np.int64, len(vals)), np.fromiter(vals.values(), np.float64, len(vals))

    def probe(self, cands: list, scores: list) -> None:
        get = self.vals.get
        for i, s in enumerate(cands):
            v = get(s)
            if v is not None:
                scores[i] += v

    def value(self, s: int) -> float:
        return self.vals.get(s, 0.0)


def _field_scores(lists: list, cands: list) -> list[list[float]]:
    """Per field, the exact scores of the sorted slots ``cands``: each list merged once with them
    (probe walks the shorter side), not a binary search per (slot, list)."""
    per = [[0.0] * len(cands) for _ in FIELDS]
    if cands:
        for tl in lists:
            tl.probe(cands, per[tl.field])
    return per


def _best_first(acc: dict, slots):
    """Slots in descending score order, lazily: a heap (O(n) to build, in C), not a full sort."""
    heap = list(zip(map(float.__neg__, map(acc.__getitem__, slots)), slots))
    heapify(heap)
    while heap:
        yield heappop(heap)[1]


def _verdicts(alive, slot_doc, accept: Callable[[int], bool] | None) -> Callable[[int], bool]:
    """ok(slot): is the slot live and acceptable?  ``accept`` (the caller's filter, arbitrary
    Python) is asked once per slot and at most _ACCEPT_BUDGET times per query.  Past that,
    unjudged slots count as not acceptable and ``ok.spent`` is set, so that walks over the score
    table stop instead of going on to its end."""
    if accept is None:
        def ok(s: int) -> bool:
            return alive[s] == 1
    else:
        cache: dict[int, bool] = {}
        left = [_ACCEPT_BUDGET]

        def ok(s: int) -> bool:
            v = cache.get(s)
            if v is None:
                if not alive[s]:
                    return False
                if left[0] <= 0:
                    ok.spent = True
                    return False
                left[0] -= 1
                v = cache[s] = bool(accept(slot_doc[s]))
            return v
    ok.spent = False
    return ok


def _probe_cost(lists: list, i: int, m: int) -> int:
    """About the steps probing lists[i:] for m candidates takes (each walks the smaller side)."""
    return sum(min(tl.size, m) for tl in lists[i:])


def _probe_count(lists: list, i: int, limit: int) -> int:
    """How many candidates to probe lists[i:] for: _PROBE_CANDIDATES, halved while that would
    cost more than _PROBE_BUDGET steps (a query of very many long terms), never below what the
    final pool needs."""
    floor = 2 * limit + 8
    m = max(_PROBE_CANDIDATES, floor)
    while m > floor and _probe_cost(lists, i, m) > _PROBE_BUDGET:
        m //= 2
    return max(m, floor)


def _ranked(acc: dict, first: int):
    """Slots of acc in descending score order, lazily and mostly in C, as lists (bands) of
    about `first`, then 4x, 16x ... slots, each cut from acc by a threshold read off a sorted sample of the
    scores (one C pass over acc per band) and sorted on its own; the whole of acc is never
    sorted unless the walk really goes that far."""
    n = len(acc)
    if n <= 4 * first:
        yield sorted(acc, key=acc.__getitem__, reverse=True)
        return
    vals = list(acc.values())
    step = max(1, n // 2048)
    sample = sorted(vals[::step], reverse=True)
    hi = None
    rank = first
    while True:
        k = rank // step
        if k >= len(sample) or rank * 4 >= n:
            lo_mask = None
        else:
            cut = sample[k]
            lo_mask = map(cut.__le__, vals)
        if hi is None:
            band = list(compress(acc, lo_mask)) if lo_mask is not None else list(acc)
        elif lo_mask is None:
            band = list(compress(acc, map(hi.__gt__, vals)))
        else:
            band = list(compress(acc, map(and_, lo_mask, map(hi.__gt__, vals))))
        band.sort(key=acc.__getitem__, reverse=True)
        yield band
        if lo_mask is None:
            return
        hi = cut
        rank *= 4


def _note_char_term(ct: dict[str, array], term: str, tid: int) -> None:
    """Index a CJK bigram under each of its characters, so that a one-character query finds it."""
    for c in _bigram_chars(term):
        a = ct.get(c)
        if a is None:
            ct[c] = array("I", (tid,))
        else:
            a.append(tid)


class QueryScores:
    """Own scores (the same numbers search() gives) of any doc for one query, read off what the
    search already computed, for stages that score docs it did not return (storaged/rank.py:
    session neighbours of the candidates).

    Why: the array kernel summed every list for every doc it reached (sorted slots, totals): a
    doc's score is a binary search there, in C, and its per-field breakdown a pass over the
    query's postings kept with them.  After MaxScore, search() scanned lists[:i] in full into its
    accumulator (slot → partial score), so a doc's score is one dict lookup there, plus, only for
    the lists MaxScore left unscanned (long, low-idf ones), one merge of the sorted docs with each
    such list (_TermList.probe) — not a binary search per (doc, list).  Valid until the index next
    changes (it is used within one request)."""

    __slots__ = ("_index", "_lists", "_acc", "_rest", "_arrays")

    def __init__(self, index: "SearchIndex", lists: list, acc: dict, i: int, arrays=None) -> None:
        self._index = index
        self._lists = lists
        self._acc = acc
        self._rest = lists[i:]
        # from SearchIndex._pool_arrays: (sorted slots, their totals, all postings, their
        # contributions, postings per list), else None
        self._arrays = arrays

    def _slots(self, docs) -> dict[int, int]:
        """slot → doc for the docs that are indexed and live."""
        dm, alive = self._index._docmap, self._index._alive
        arr, extra = dm.arr, dm.extra.get
        n = len(arr)
        out = {}
        for d in docs:
            s = arr[d] if 0 <= d < n else extra(d, -1)
            if s >= 0 and alive[s]:
                out[s] = d
        return out

    def totals(self, docs) -> dict[int, float]:
        """doc → own score over all searched fields, for the given docs that score anything."""
        docs = list(docs)
        if not docs:
            return {}
        if self._arrays is not None:
            return self._array_totals(docs)
        dm = self._index._docmap
        if not dm.extra and 0 <= min(docs) and max(docs) < len(dm.arr):
            # docmap holds live slots only (-1 for the rest, which acc never holds): all in C
            slots = list(map(dm.arr.__getitem__, docs))
            if not self._rest:
                vals = list(map(self._acc.get, slots, repeat(0.0)))
                return dict(compress(zip(docs, vals), vals))
            by_slot = dict(zip(slots, docs))
            by_slot.pop(-1, None)
        else:
            by_slot = self._slots(docs)
        if not by_slot:
            return {}
        get = self._acc.get
        if not self._rest:
            return {d: v for s, d in by_slot.items() if (v := get(s))}
        cands = sorted(by_slot)
        scores = [get(s, 0.0) for s in cands]
        for tl in self._rest:
            getattr(tl, "merge_into", tl.probe)(cands, scores)
        return {by_slot[s]: v for s, v in zip(cands, scores) if v}

    def _array_totals(self, docs: list) -> dict[int, float]:
        """totals() when the search summed every list into arrays."""
        vals = self.own(np.array(docs, np.int64)).tolist()
        return dict(compress(zip(docs, vals), vals))

    def own(self, docs: np.ndarray) -> np.ndarray:
        """The own score of each of ``docs`` (an int64 array; 0.0 for a doc that scores nothing,
        is not indexed or is negative: -1 pads storaged/rank.py's rows), as totals() gives it.
        After the array kernel, docs → slots and a binary search per slot in its sorted slots,
        all in C."""
        if self._arrays is None:
            row = docs.tolist()
            got = self.totals({d for d in row if d >= 0})
            return np.fromiter(map(got.get, row, repeat(0.0)), np.float64, len(row))
        if not len(docs):
            return np.zeros(0)
        dm = self._index._docmap
        n = len(dm.arr)
        inside = (docs >= 0) & (docs < n)
        view = np.frombuffer(dm.arr, np.int32)  # dropped at once: add() must grow the map
        slots = np.where(inside, view[np.where(inside, docs, 0)], -1)  # -1: not indexed or removed
        del view
        if dm.extra:  # docs beyond the flat map (not expected)
            for i in np.flatnonzero(docs >= n).tolist():
                slots[i] = dm.extra.get(int(docs[i]), -1)
        return self._lookup(slots)

    def _lookup(self, slots: np.ndarray) -> np.ndarray:
        """The kernel's totals of ``slots`` (0.0 for a slot it did not reach, or -1)."""
        touched, scores = self._arrays[:2]
        if not len(touched):
            return np.zeros(len(slots))
        at = np.minimum(np.searchsorted(touched, slots), len(touched) - 1)
        return np.where(touched[at] == slots, scores[at], 0.0)

    def fields(self, docs) -> dict[int, tuple[float, float, float]]:
        """doc → exact own score per field (content, summary, tags), summed as search() sums its
        hits, for the given docs that score anything."""
        by_slot = self._slots(docs)
        cands = sorted(by_slot)
        c, s, t = self.per_field(cands)
        return {by_slot[x]: (c[j], s[j], t[j]) for j, x in enumerate(cands) if c[j] or s[j] or t[j]}

    def per_field(self, cands: list[int]) -> list[list[float]]:
        """Per field, the exact scores of the sorted slots ``cands`` (_field_scores).  After the
        array kernel, read off its postings in C: each list's postings of the candidates, summed
        per field in list order by np.bincount, the same additions as probing list after list."""
        if self._arrays is None or not cands:
            return _field_scores(self._lists, cands)
        postings, values, lengths = self._arrays[2:]
        ca = np.fromiter(cands, np.int64, len(cands))
        lists = self._lists
        present = {tl.field for tl in lists}
        if len(present) == 1:  # one field's lists: its score is the total, summed alike
            (f,) = present
            return [self._lookup(ca).tolist() if g == f else [0.0] * len(ca) for g in range(len(FIELDS))]
        at = np.minimum(np.searchsorted(ca, postings), len(ca) - 1)
        sel = np.flatnonzero(ca[at] == postings)  # postings of the candidates, in list order
        at, values = at[sel], values[sel]
        fieldvec = np.repeat(np.array([tl.field for tl in lists], np.int8), lengths)[sel]
        out = []
        for f in range(len(FIELDS)):
            mine = fieldvec == f
            out.append(np.bincount(at[mine], values[mine], len(ca)).tolist() if f in present else [0.0] * len(ca))
        return out


class _WindowScores(QueryScores):
    """QueryScores after the window kernel (SearchIndex._pool_windows): a doc in a window it read
    has its total there (sorted slots, as after the array kernel); any other doc's score and
    every per-field breakdown are probed in the query's lists (a binary search per doc and list,
    in C), adding each list's contribution in list order: the same sums as the kernel's."""

    __slots__ = ("_sources", "_done", "_kept", "postings_read")

    def __init__(self, index: "SearchIndex", lists: list, sources: list, done: np.ndarray,
                 slots: np.ndarray, scores: np.ndarray, postings_read: int, kept: np.ndarray | None = None) -> None:
        super().__init__(index, lists, {}, len(lists), (slots, scores, None, None, None))
        self._sources = sources
        self._done = done
        self._kept = kept  # under a keyed filter: the slots whose postings the kernel summed
        self.postings_read = postings_read  # what the kernel scored (bench/search_kernels.py reports it)

    def _lookup(self, slots: np.ndarray) -> np.ndarray:
        slots = np.asarray(slots, np.int64)
        win = slots >> _WINDOW_SHIFT
        read = (slots >= 0) & (win < len(self._done))
        read[read] = self._done[win[read]]
        if self._kept is not None:  # a slot the filter drops was not summed, window read or not
            k = self._kept
            read &= slots < len(k)
            read[read] = k[slots[read]]
        out = super()._lookup(np.where(read, slots, -1))
        other = np.flatnonzero(~read & (slots >= 0))
        if len(other):
            out[other] = self._probe(slots[other], False)[0]
        return out

    def _probe(self, slots: np.ndarray, by_field: bool) -> list[np.ndarray]:
        """The scores of ``slots``, summed over the lists in list order: per field (``by_field``)
        or in all (one array)."""
        out = [np.zeros(len(slots)) for _ in (FIELDS if by_field else (0,))]
        for tl, (sl, ks, w, imp, vals) in zip(self._lists, self._sources):
            if not len(sl):
                continue
            at = np.minimum(np.searchsorted(sl, slots), len(sl) - 1)
            hit = np.flatnonzero(sl[at] == slots)
            if len(hit):
                at = at[hit]
                out[tl.field if by_field else 0][hit] += imp[ks[at]] * w if vals is None else vals[at]
        return out

    def per_field(self, cands: list[int]) -> list[list[float]]:
        ca = np.fromiter(cands, np.int64, len(cands))
        present = {tl.field for tl in self._lists}
        if len(present) == 1:  # one field's lists: its score is the total, summed alike
            (f,) = present
            return [self._lookup(ca).tolist() if g == f else [0.0] * len(ca) for g in range(len(FIELDS))]
        return [p.tolist() for p in self._probe(ca, True)]


class _WindowBase(NamedTuple):
    """SearchIndex._window_base: what the window kernel gathers from a query's lists, whatever the filter."""
    nwin: int       # windows of the index
    sources: list   # per list: (slots, keys, w, impacts, values)
    groups: list    # per segment field: (group, impacts, field, list numbers, rows, w, scales, counts, starts)
    bulk: tuple | None  # the lists without bounds: (slots, values, list number), lists in order


class PreparedQuery:
    """A query's lists, looked up once for the searches one call makes of the same query and fields
    (storaged/rank.py: the pool unfiltered, then the filter's when too few of it passed), and what
    the window kernel gathers from them whatever the filter (made by the first search that needs it).
    Good until the index next changes: made and used within one call on the request loop's thread
    (SearchIndex.prepare)."""

    __slots__ = ("fields", "lists", "window_base")

    def __init__(self, fields: tuple[int, ...], lists: list) -> None:
        self.fields = fields
        self.lists = lists
        self.window_base: _WindowBase | None = None


def _prefix_candidate(term: str) -> bool:
    """Whether a vocabulary term can be reached by a prefix: longer than the shortest prefix (so
    never a CJK term: those are one or two characters) and starting with a letter (reference
    numbers are never listed)."""
    return len(term) > _PREFIX_MIN and term[0].isalpha()


class _PrefixVocab:
    """The vocabulary's prefix-matchable terms in sorted order, for prefix expansion.

    Why runs: sorting the whole vocabulary at once (0.9 s at 1M terms) would stall every client of
    the daemon for that long.  So the list is built in bounded steps (build_step(): the next
    _PREFIX_BUILD_STEP terms by tid, sorted into a run of their own), started at load() or by the
    first query that needs it, advanced by each query, by the daemon's idle loop (idle_step) and,
    a little, by each add().  Until the
    last step is done the index is not ``ready`` and queries run without prefix expansion.
    expansions() reads the runs as the one sorted list they make together (a bisect per run), so
    what a query finds does not depend on how the runs were cut.  Not saved by dump().

    Terms new since the build started go to a small sorted side list (insort), which becomes a run
    of its own once it outgrows 1/16 of the rest; freed terms stay listed and are skipped by
    checking the vocabulary, until they are a quarter of the list and a fresh build (in steps, the
    old list serving meanwhile) replaces it.  Costs one list slot (8 bytes) per listed term: the
    strings are the vocabulary's own."""

    __slots__ = ("runs", "size", "side", "stale", "_terms", "_pos", "_end")

    def __init__(self, terms: list) -> None:
        self.runs: list[list[str]] = []  # each sorted; together the listed terms
        self.size = 0  # terms in runs
        self.side: list[str] = []
        self.stale = 0
        self._terms: list | None = terms  # the index's tid → term list, read in steps until ready
        self._pos = 0
        self._end = len(terms)  # terms added later reach add()

    @property
    def ready(self) -> bool:
        return self._terms is None

    def build_step(self, budget: int = None) -> bool:
        """Sort the next ``budget`` (default _PREFIX_BUILD_STEP) terms by tid into a run; True
        once every term that existed at the start is listed."""
        terms = self._terms
        if terms is None:
            return True
        hi = min(self._end, self._pos + (budget or _PREFIX_BUILD_STEP))
        n = _PREFIX_MIN
        # _prefix_candidate, inlined (freed tids hold None)
        run = sorted([t for t in terms[self._pos:hi] if t and len(t) > n and t[0].isalpha()])
        if run:
            self.runs.append(run)
            self.size += len(run)
        self._pos = hi
        if hi >= self._end:
            self._terms = None
        return self._terms is None

    def add(self, term: str) -> None:
        if _prefix_candidate(term):
            insort(self.side, term)
            if len(self.side) > 1024 + (self.size >> 4):
                self.runs.append(self.side)
                self.size += len(self.side)
                self.side = []

    def readers(self) -> list:
        """Readers of the sorted lists (the runs and the side list) for _expansions."""
        return [_list_reader(r) for r in (*self.runs, self.side)]

    def nbytes(self) -> int:
        return sum(map(sys.getsizeof, self.runs)) + sys.getsizeof(self.runs) + sys.getsizeof(self.side)


def _list_reader(lst: list[str]) -> Callable:
    """A reader of one sorted term list for _expansions: (terms in [prefix, end), at most ``take``;
    how many sort at or after ``prefix``; None: their dfs are not known here)."""
    def read(prefix: str, end: str, take: int) -> tuple[list[str], int, None]:
        i = bisect_left(lst, prefix)
        return lst[i:min(i + take, bisect_left(lst, end, i))], len(lst) - i, None
    return read


def _expansions(prefix: str, readers: list, budget: list[int], dfs: dict[str, int] | None = None) -> list[str]:
    """Live terms longer than ``prefix`` that begin with it, from every part's sorted term lists read
    as the one sorted list they make together (a bisect each): at most _PREFIX_SCAN terms are looked
    at, and charged to ``budget[0]`` for the whole query (spent in place).  ``readers``: (read, live)
    pairs — a sorted list's reader (_list_reader, Segment._read_prefix) and its part's test of
    whether a listed term still has postings there.  ``dfs``: filled with each term's df summed over
    the readers that know it (the segments'; a term among the first ``take`` of all is among the first
    ``take`` of each part holding it, so every segment holding it adds its df)."""
    take = min(_PREFIX_SCAN, budget[0])
    if take <= 0:
        return []
    end = prefix + "\U0010ffff"  # every term beginning with prefix sorts below this
    after = 0  # terms sorting at or after prefix: what one sorted list would show
    live: dict[str, bool] = {}
    for read, is_live in readers:
        got, n, counts = read(prefix, end, take)
        after += n
        for t in got:
            live[t] = live.get(t, False) or is_live(t)
        if dfs is not None and counts is not None:
            for t, c in zip(got, counts):
                dfs[t] = dfs.get(t, 0) + c
    budget[0] -= min(take, after)
    return [t for t in sorted(live)[:take] if t != prefix and live[t]]


def _export_lists(slots_f: list, keys_f: list) -> tuple[array, array, array, array]:
    """(tids, postings per tid, all slots, all keys) of one field's lists, concatenated in tid
    order: the dump's layout, and what a segment is written from."""
    tids = array("I")
    counts = array("I")
    all_slots = array("I")
    all_keys = array("H")
    for tid, p in enumerate(slots_f):
        if p is None:
            continue
        tids.append(tid)
        if type(p) is int:
            counts.append(1)
            all_slots.append(p)
            all_keys.append(keys_f[tid])
        else:
            counts.append(len(p))
            all_slots.extend(p)
            all_keys.extend(keys_f[tid])
    return tids, counts, all_slots, all_keys


def _joined_terms(terms: list) -> str:
    """The dump's ``terms``: every term by tid, one a line (a freed one empty). Joined 64K terms at a
    time, then the pieces: one join of 2M terms was one C call of ~0.4 s (1.2 s with its generator) that
    held the GIL while a rebuild's worker wrote its snapshot beside the request loop."""
    terms = [t if t is not None else "" for t in terms]
    step = 1 << 16
    return "\n".join(["\n".join(terms[i:i + step]) for i in range(0, len(terms), step)])


class _PagesLetGo:
    """The segments of an index a rebuild installed, whose resident pages are let go a window of
    DROP_WINDOW_PAGES (16 MiB) a release step (Segment.release_pages): the install read every slot's
    tables through them, ~190 MB at 5M events the kernel would count as the daemon's for as long as it
    runs — and advised at once, a segment's took a step of tens of ms. Held in the index's release
    queue after the segments it replaced are gone."""

    __slots__ = ("segments", "at")
    nbytes = 0

    def __init__(self, segments: list) -> None:
        self.segments = segments
        self.at = 0   # the next page of the last segment

    def release_step(self, n: int) -> bool:
        """One window of the last segment's pages (whatever ``n``, which counts a part's objects); a
        segment whose pages are all let go leaves the list. False once none is left."""
        if not self.segments:
            return False
        segment = self.segments[-1]
        if self.at < segment.page_count():
            segment.release_pages(self.at, DROP_WINDOW_PAGES)
            self.at += DROP_WINDOW_PAGES
            if self.at < segment.page_count():
                return True
        self.segments.pop()
        self.at = 0
        return bool(self.segments)


class _Unmapped(_PagesLetGo):
    """The segments of an index a rebuild replaced (SearchIndex.retire), let go a step at a time: their
    pages a window a step, then the segment itself (unmapped once nothing holds it: with nothing
    resident left, at once). Unmapping them together — 17 of them at 5M events, 2.6 GB of their pages
    resident — held the request loop ~33 ms of a 67 ms install, and one with a GB resident alone would
    hold it as long."""

    __slots__ = ()


class _MemPart:
    """Postings held as Python objects by term id (the layout the module docstring describes),
    as a part of the index that queries read: the index's own live lists (a view made per query),
    or lists frozen by SearchIndex.plan() until they are written as a segment.  A Segment offers
    the same methods over its file."""

    __slots__ = ("vocab", "terms", "slots", "keys", "maxtf", "prefix", "slot_lo", "slot_hi", "nbytes", "postings_count",
                 "_char_index")
    verified = True  # made in this process (a Segment opened DEFERRED is not, until checked)

    def __init__(self, vocab, terms, slots, keys, maxtf, prefix, char_index, slot_lo, slot_hi,
                 nbytes=0, postings_count=0):
        self.vocab, self.terms, self.slots, self.keys, self.maxtf = vocab, terms, slots, keys, maxtf
        self.prefix = prefix  # a _PrefixVocab, or None: no prefix expansion from this part
        self._char_index = char_index  # () -> {character: array of tids}
        self.slot_lo, self.slot_hi = slot_lo, slot_hi
        self.nbytes, self.postings_count = nbytes, postings_count

    def lookup(self, term: str) -> int:
        return self.vocab.get(term, -1)

    def postings(self, f: int, t: int):
        p = self.slots[f][t]
        if p is None:
            return None
        return p, self.keys[f][t], self.maxtf[f][t]

    def df(self, t: int) -> int:
        return sum(_list_size(p) for p in (sl[t] for sl in self.slots) if p is not None)

    def char_terms(self, ch: str):
        return self._char_index().get(ch, ())

    def prefix_readers(self) -> list:
        """(read, live) pairs over this part's sorted prefix lists, for _expansions."""
        pv = self.prefix
        if pv is None or not pv.ready:
            return []
        return [(read, self.vocab.__contains__) for read in pv.readers()]

    def release_step(self, n: int) -> bool:
        """Free about ``n`` of the lists' objects (a part a segment replaced, owned by nobody else);
        False once nothing is left."""
        for lst in (*self.slots, *self.keys, self.terms):
            if lst:
                del lst[-n:]
                return True
        vocab = self.vocab
        if vocab:
            for _ in range(min(n, len(vocab))):
                vocab.popitem()
            return True
        if self.prefix is not None:  # its sorted runs hold the last references to the term strings
            for run in (*self.prefix.runs, self.prefix.side):
                if run:
                    del run[-n:]
                    return True
        self.prefix = None
        self._char_index = dict
        self.nbytes = 0
        return False

    def export(self, f: int) -> tuple:
        """Segment.export for these lists (numpy arrays)."""
        tids, counts, slots, keys = _export_lists(self.slots[f], self.keys[f])
        return (np.frombuffer(tids, np.uint32), np.frombuffer(counts, np.uint32),
                np.frombuffer(slots, np.uint32), np.frombuffer(keys, np.uint16))

    def term_list(self) -> list:
        return self.terms


def _char_index_from(vocab: dict) -> dict[str, array]:
    """Character → the ids of the CJK bigrams holding it, over a whole vocabulary."""
    ct: dict[str, array] = {}
    for term, tid in vocab.items():
        _note_char_term(ct, term, tid)
    return ct


def _char_index_of(vocab: dict) -> Callable[[], dict]:
    """A frozen part's character index, built on first use (a one-character CJK query)."""
    cache: list = []

    def get() -> dict:
        if not cache:
            cache.append(_char_index_from(vocab))
        return cache[0]
    return get


def _bigram_chars(term: str) -> set[str]:
    """The characters a one-character query finds ``term`` by (_note_char_term's rule)."""
    if len(term) == 2 and _CJK_CHAR.match(term):
        return {term[0], term[1]}
    return set()


def _merged_vocabulary(lists: list[list]) -> tuple[list[str], list[np.ndarray]]:
    """(the sorted union of the term lists, and for each list the union's number of each of its
    terms — -1 for a freed term id, None).  One sort of all the terms (by index, so the numbers come
    out of it), equal neighbours found in C."""
    arrays, valid = [], []
    for lst in lists:
        a = np.empty(len(lst), object)
        a[:] = lst
        ok = a != None  # noqa: E711 (elementwise)
        arrays.append(a)
        valid.append(ok)
    allt = np.concatenate([a[ok] for a, ok in zip(arrays, valid)]) if arrays else np.empty(0, object)
    order = np.array(sorted(range(len(allt)), key=allt.tolist().__getitem__), np.int64)
    ranked = allt[order]
    first = np.ones(len(ranked), bool)
    first[1:] = ranked[1:] != ranked[:-1]
    number = np.empty(len(allt), np.int64)
    number[order] = np.cumsum(first) - 1
    maps, at = [], 0
    for ok in valid:
        m = np.full(len(ok), -1, np.int64)
        k = int(ok.sum())
        m[ok] = number[at:at + k]
        at += k
        maps.append(m)
    return ranked[first].tolist(), maps


def _range_index(lo: int, items: Iterable[tuple[int, str, str | None, Sequence[str]]]) -> "SearchIndex":
    """A scratch index whose live lists hold ``items`` in slots from ``lo`` on (the slots below are
    dead padding: the segment made of it covers [lo, end) only)."""
    ix = SearchIndex()
    ix._slot_doc = array("Q", bytes(8 * lo))
    ix._alive = bytearray(lo)
    ix._lens = [array("I", bytes(4 * lo)) for _ in FIELDS]
    ix._mem_lo = lo
    for doc, content, summary, tags in items:
        ix.add(doc, content, summary, tags)
    return ix


class SegmentPlan(NamedTuple):
    """What the next segment holds (SearchIndex.plan): a run of the index's immutable parts, in
    slot order, and the file name to write it under."""
    parts: tuple
    name: str
    slot_lo: int
    slot_hi: int


def _segment_path(directory: str, name: Any) -> str | None:
    """Where a dump's segment ``name`` lies, or None when it is not a plain segment name."""
    if not isinstance(name, str) or not is_index_segment_name(name) or os.sep in name:
        return None
    return os.path.join(directory, name)


class SearchIndex:
    """BM25 over content, summary and tags of each doc; see the module docstring for the layout."""

    def __init__(self) -> None:
        nf = len(FIELDS)
        self._new_lists()
        self._maxtf_all = [0] * nf  # field → max tf bucket of any posting (sizes the impact table)
        self._slot_doc = array("Q")
        self._alive = bytearray()
        self._lens = [array("I") for _ in range(nf)]  # field → slot → length in terms
        self._total_len = [0] * nf  # over live docs
        self._nonempty = [0] * nf  # live docs with a non-empty field
        self._docmap = _DocMap()
        self._live = 0
        self._dead = 0  # tombstoned slots
        self._sweep_covers = 0
        self._tables: dict[tuple[float, int], list[float]] = {}
        self._impacts: dict[int, np.ndarray] = {}  # id(table) → its used rows as an array
        self._filtered = FilteredBounds()  # window bounds over the docs of a filter (_accepted_bounds)
        # The postings of slots below _mem_lo are in immutable parts, in slot order: Segments (files)
        # and, until a snapshot writes them, frozen _MemParts (see plan()).  The lists above hold
        # the slots from _mem_lo on.
        self._parts: list = []
        self._mem_lo = 0
        self._retired: list[_MemPart | _Unmapped | _PagesLetGo] = []  # frozen lists a segment replaced, freed by idle_step() (and the like)
        self._hole: _MemPart | None = None  # the empty part of a reserved range (reserve())

    def _new_lists(self) -> None:
        """Empty live lists, and what serves and accounts for them (at creation; after a freeze)."""
        nf = len(FIELDS)
        self._vocab: dict[str, int] = {}
        self._terms: list[str | None] = []  # tid → term (None once freed)
        self._free_tids: list[int] = []
        self._slots: list[list] = [[] for _ in range(nf)]  # field → tid → None | int | array('I')
        self._keys: list[list] = [[] for _ in range(nf)]  # field → tid → None | int | array('H')
        self._maxtf: list[bytearray] = [bytearray() for _ in range(nf)]  # field → tid → max tf bucket
        self._char_terms: dict[str, array] | None = None  # built on first one-char CJK query
        self._prefix: _PrefixVocab | None = None  # started by the first query, built in steps
        self._prefix_next: _PrefixVocab | None = None  # a rebuild under way (the old one serves)
        self._unswept = 0  # deaths not yet covered by a finished sweep pass
        self._sweep_pos: tuple[int, int] | None = None  # (field, tid) of a running pass
        # memory accounting, maintained incrementally
        self._n_postings = 0
        self._n_arrays = 0
        self._n_single = 0
        self._term_bytes = 0

    def _live_postings(self) -> int:
        return self._n_postings + self._n_single

    # --- writing ------------------------------------------------------------------------------

    def _new_tid(self, term: str) -> int:
        if self._free_tids:
            tid = self._free_tids.pop()
            self._terms[tid] = term
        else:
            tid = len(self._terms)
            self._terms.append(term)
            for f in range(len(FIELDS)):
                self._slots[f].append(None)
                self._keys[f].append(None)
                self._maxtf[f].append(0)
        self._vocab[term] = tid
        self._term_bytes += sys.getsizeof(term)
        if self._char_terms is not None:
            _note_char_term(self._char_terms, term, tid)
        if self._prefix is not None:
            self._prefix.add(term)
            if self._prefix_next is not None:
                self._prefix_next.add(term)
        return tid

    def add(self, doc: int, content: str, summary: str | None, tags: Sequence[str]) -> None:
        if doc < 0:
            raise ValueError("doc must be non-negative")
        if self._docmap.get(doc) >= 0:
            raise ValueError(f"doc {doc} is already indexed; remove it first")
        slot = len(self._slot_doc)
        self._slot_doc.append(doc)
        self._alive.append(1)
        self._docmap.set(doc, slot)
        self._live += 1
        texts = (content, summary, "\n".join(tags) if tags else "")
        post = self._post_native if _native_post is not None else self._post_python
        for f, text in enumerate(texts):
            try:
                n, single, arrays, posted, tq = post(f, text, slot) if text else (0, 0, 0, 0, 0)
            except BaseException:
                # a failure partway (memory) may leave some terms' tf maxima raised: the field's bound on
                # them, which sizes its impact table, must still cover them
                self._maxtf_all[f] = max(self._maxtf_all[f], max(self._maxtf[f], default=0))
                raise
            self._lens[f].append(n)
            if not n:
                continue
            self._total_len[f] += n
            self._nonempty[f] += 1
            if tq > self._maxtf_all[f]:
                self._maxtf_all[f] = tq
            self._n_single += single
            self._n_arrays += arrays
            self._n_postings += posted
        if self._unswept:
            self._maintain()

    def _post_native(self, f: int, text: str, slot: int) -> tuple[int, int, int, int, int]:
        """One field's postings through storaged/postings.c: _post_python's steps, word by word in C."""
        items, word_terms, alnum_parts = posting_items(text)
        return _native_post(items, word_terms, alnum_parts, self._vocab, self._new_tid, self._slots[f],
                            self._keys[f], self._maxtf[f], slot)

    def _post_python(self, f: int, text: str, slot: int) -> tuple[int, int, int, int, int]:
        """One field's postings where the native builder was not built (no C compiler at install): the
        definition that tests/unit/test_native_postings.py holds the native one to. (the field's length
        in terms, what the single-posting, array and posting counters gain, the highest tf bucket that
        raised a term's maximum)"""
        terms = index_terms(text)
        n = len(terms)
        if not n:
            return 0, 0, 0, 0, 0
        vocab = self._vocab
        dlq = n if n < _DL_EXACT else _dl_bucket(n)
        slots_f, keys_f, maxtf_f = self._slots[f], self._keys[f], self._maxtf[f]
        single = posted = arrays = max_tq = 0
        for term, tf in (Counter(terms).items() if n > 1 else ((terms[0], 1),)):
            tid = vocab.get(term)
            if tid is None:
                tid = self._new_tid(term)
            if tf == 1:
                key = dlq
            else:
                tq = tf - 1 if tf <= _TF_EXACT else _tf_bucket(tf)
                key = (tq << _DL_BITS) | dlq
                if tq > maxtf_f[tid]:
                    maxtf_f[tid] = tq
                    max_tq = max(max_tq, tq)
            p = slots_f[tid]
            if p is None:
                slots_f[tid] = slot
                keys_f[tid] = key
                single += 1
            elif type(p) is int:
                slots_f[tid] = array("I", (p, slot))
                keys_f[tid] = array("H", (keys_f[tid], key))
                single -= 1
                arrays += 2
                posted += 2
            else:
                p.append(slot)
                keys_f[tid].append(key)
                posted += 1
        return n, single, arrays, posted, max_tq

    def remove(self, doc: int) -> None:
        slot = self._docmap.get(doc)
        if slot < 0:
            return
        self._docmap.set(doc, -1)
        self._alive[slot] = 0
        self._live -= 1
        self._dead += 1
        if slot >= self._mem_lo:  # the sweeper purges the in-memory lists only
            self._unswept += 1
        for f, lens in enumerate(self._lens):
            n = lens[slot]
            if n:
                self._total_len[f] -= n
                self._nonempty[f] -= 1
        self._maintain()

    def _maintain(self) -> None:
        """Bounded background work on the write path: advance (or start) a sweep pass."""
        if self._sweep_pos is None:
            if self._unswept < max(_SWEEP_MIN_DEAD, self._live >> 3):
                return
            self._sweep_pos = (0, 0)
            self._sweep_covers = self._unswept
        if not self._sweep(_SWEEP_BUDGET):
            return
        self._sweep_pos = None
        self._unswept -= self._sweep_covers
        if self._dead >= _RENUMBER_MIN_DEAD and self._dead >= self._live and not self._parts:
            self.compact()

    def _sweep(self, budget: int) -> bool:
        """Purge dead postings from lists from the saved position on; True once past the end."""
        f, tid = self._sweep_pos
        alive = self._alive
        while f < len(FIELDS):
            slots_f = self._slots[f]
            while tid < len(slots_f):
                if budget <= 0:
                    self._sweep_pos = (f, tid)
                    return False
                p = slots_f[tid]
                if p is None:
                    budget -= 1
                elif type(p) is int:
                    budget -= 1
                    if not alive[p]:
                        self._drop(f, tid)
                        self._n_single -= 1
                else:
                    budget -= len(p) + 16
                    mask = bytes(map(alive.__getitem__, p))
                    if 0 in mask:
                        self._purge(f, tid, p, mask)
                tid += 1
            f, tid = f + 1, 0
        return True

    def _purge(self, f: int, tid: int, p: array, mask: bytes) -> None:
        keys_f = self._keys[f]
        ks = array("H", compress(keys_f[tid], mask))
        self._n_postings -= len(p)
        self._n_arrays -= 2
        if len(ks) > 1:
            self._slots[f][tid] = array("I", compress(p, mask))
            keys_f[tid] = ks
            self._n_postings += len(ks)
            self._n_arrays += 2
        elif ks:
            self._slots[f][tid] = next(compress(p, mask))
            keys_f[tid] = ks[0]
            self._n_single += 1
        else:
            self._drop(f, tid)

    def _drop(self, f: int, tid: int) -> None:
        self._slots[f][tid] = self._keys[f][tid] = None
        self._maxtf[f][tid] = 0
        if all(self._slots[g][tid] is None for g in range(len(FIELDS))):
            term = self._terms[tid]
            del self._vocab[term]
            self._terms[tid] = None
            self._free_tids.append(tid)
            self._term_bytes -= sys.getsizeof(term)
            self._char_terms = None  # it may list this tid, which will be reused
            if self._prefix is not None:
                self._prefix.stale += 1  # the term stays listed until a rebuild; lookups check vocab
            if self._prefix_next is not None:
                self._prefix_next.stale += 1

    def compact(self) -> None:
        """Drop all tombstoned postings now, renumber slots densely, free terms left without
        postings.  One pass over all postings, mostly in C (measured in bench/search_speed.py);
        runs by itself only when dead slots outnumber live ones.  Once segments hold some slots,
        their numbers are fixed: then only the in-memory lists are swept (segment merges drop the
        segments' dead postings)."""
        if self._parts:
            self._sweep_pos = (0, 0)
            self._sweep(1 << 62)
            self._sweep_pos = None
            self._unswept = 0
            return
        self._sweep_pos = None
        self._unswept = 0
        if not self._dead:
            return
        alive = self._alive
        # newslot[s] = live slots before s (meaningful for live s only); the trailing -1 makes
        # remap(-1) == -1, so the doc map (-1 = absent) is remapped in one C-level pass.
        newslot = array("i", accumulate(alive, initial=-1))
        del newslot[0]
        newslot.append(-1)
        remap = newslot.__getitem__
        self._slot_doc = array("Q", compress(self._slot_doc, alive))
        self._filtered.clear()  # its verdicts are by slot number
        self._lens = [array("I", compress(lens, alive)) for lens in self._lens]
        self._alive = bytearray(b"\x01") * len(self._slot_doc)
        self._dead = 0
        dm = self._docmap
        dm.arr = array("i", map(remap, dm.arr))
        dm.extra = {d: remap(s) for d, s in dm.extra.items()}
        n_post = n_arr = n_single = 0
        used = bytearray(len(self._terms))
        for f in range(len(FIELDS)):
            slots_f, keys_f, maxtf_f = self._slots[f], self._keys[f], self._maxtf[f]
            for tid, p in enumerate(slots_f):
                if p is None:
                    continue
                if type(p) is int:
                    if alive[p]:
                        slots_f[tid] = newslot[p]
                        n_single += 1
                        used[tid] = 1
                    else:
                        slots_f[tid] = keys_f[tid] = None
                        maxtf_f[tid] = 0
                    continue
                mask = bytes(map(alive.__getitem__, p))
                ks = array("H", compress(keys_f[tid], mask))
                if len(ks) > 1:
                    slots_f[tid] = array("I", map(remap, compress(p, mask)))
                    keys_f[tid] = ks
                    maxtf_f[tid] = max(ks) >> _DL_BITS
                    n_post += len(ks)
                    n_arr += 2
                    used[tid] = 1
                elif len(ks) == 1:
                    slots_f[tid] = remap(next(compress(p, mask)))
                    keys_f[tid] = ks[0]
                    maxtf_f[tid] = ks[0] >> _DL_BITS
                    n_single += 1
                    used[tid] = 1
                else:
                    slots_f[tid] = keys_f[tid] = None
                    maxtf_f[tid] = 0
        freed = 0
        for tid, term in enumerate(self._terms):
            if term is not None and not used[tid]:
                del self._vocab[term]
                self._terms[tid] = None
                self._free_tids.append(tid)
                self._term_bytes -= sys.getsizeof(term)
                freed += 1
        self._n_postings, self._n_arrays, self._n_single = n_post, n_arr, n_single
        self._maxtf_all = [max(m, default=0) for m in self._maxtf]
        self._char_terms = None
        for pv in (self._prefix, self._prefix_next):
            if pv is not None:  # it lists strings, not tids: still valid, the freed terms stale
                pv.stale += freed

    # --- reading ------------------------------------------------------------------------------

    def doc_count(self) -> int:
        return self._live

    def unwritten_bytes(self) -> int:
        """Heap bytes of the postings no segment holds yet (the live lists): what a writer that
        builds a whole index (a rebuild's worker) writes out as a segment before it grows too big."""
        return self._lists_bytes() + sum(p.nbytes for p in self._parts if isinstance(p, _MemPart))

    def segment_releasers(self) -> list[tuple[Callable[[int, int], int], int]]:
        """Each segment's release_pages and its page count, to call a window at a time
        (Store.release_pages_step)."""
        return [(p.release_pages, p.page_count()) for p in self._parts if isinstance(p, Segment)]

    def release_pages(self) -> int:
        """Let the process's resident pages of the segments' mappings go (Segment.release_pages): a load
        read each one's per-slot tables through it once. Bytes advised."""
        return sum(p.release_pages() for p in self._parts if isinstance(p, Segment))

    def memory_bytes(self) -> int:
        """Heap bytes: the live lists, the frozen parts, the per-slot arrays and the tables (a
        segment's mapping is the page cache's: mapped_bytes())."""
        nf = len(FIELDS)
        b = self._lists_bytes() + sum(p.nbytes for p in self._parts) + sum(p.nbytes for p in self._retired)
        for f in range(nf):
            b += sys.getsizeof(self._lens[f])
        b += sys.getsizeof(self._slot_doc) + sys.getsizeof(self._alive) + self._docmap.nbytes()
        for (_, rows), t in self._tables.items():
            b += sys.getsizeof(t) + (rows << _DL_BITS) * _SIZEOF_FLOAT
        b += sum(a.nbytes for a in self._impacts.values()) + self._filtered.nbytes
        return b

    def mapped_bytes(self) -> int:
        """Bytes of segment files mapped (what the kernel pages in as queries read them)."""
        return sum(p.size for p in self._parts if isinstance(p, Segment))

    def _lists_bytes(self) -> int:
        """Heap bytes of the live lists and what serves them (vocabulary, prefix and char lists)."""
        b = sys.getsizeof(self._vocab) + self._term_bytes + sys.getsizeof(self._terms)
        b += sys.getsizeof(self._free_tids)
        b += len(self._vocab) * _SIZEOF_INT  # tid ints (small ones are shared; overestimates a bit)
        for f in range(len(FIELDS)):
            b += sys.getsizeof(self._slots[f]) + sys.getsizeof(self._keys[f]) + sys.getsizeof(self._maxtf[f])
        # posting arrays: data (+1/16 growth slack of array.append) and headers; a lone posting
        # is a slot int plus a key int that is mostly a cached small int (tf 1, length < 256)
        b += self._n_arrays * _SIZEOF_ARRAY + (self._n_postings * 6 * 17) // 16
        b += (self._n_single * _SIZEOF_INT * 5) // 4
        for pv in (self._prefix, self._prefix_next):
            if pv is not None:
                b += pv.nbytes()
        if self._char_terms is not None:
            b += sys.getsizeof(self._char_terms) + sum(
                sys.getsizeof(a) + 2 * _SIZEOF_INT for a in self._char_terms.values()
            )
        return b

    # --- segments -----------------------------------------------------------------------------

    def plan(self, inline: bool = False) -> "SegmentPlan | None":
        """Freeze the live lists into an immutable part (new docs go to fresh lists) and choose what
        the next segment holds: every frozen part not yet written, with the segments just before
        them while each is at most _MERGE_RATIO times the postings gathered so far (and while more
        than _MAX_SEGMENTS would remain), up to _MERGE_MAX_POSTINGS (_INLINE_MERGE_MAX_POSTINGS for a
        snapshot the daemon's own thread writes: ``inline``).  None when nothing is left unwritten.

        Why freeze: the snapshot that names the segment is written by a forked child (or inline at
        a stop); the frozen lists are what it writes, and until adopt() swaps the file in, queries
        read the frozen lists, so there is no moment when a posting is in two parts or none."""
        if self._hole is not None:
            raise ValueError("the index has a reserved range not filled yet")
        n = len(self._slot_doc)
        if n > self._mem_lo:
            self._freeze(n)
        parts = self._parts
        # every frozen part not yet written (the last ones, and one a reserved range was put behind,
        # with the parts after it)
        i = next((k for k, p in enumerate(parts) if isinstance(p, _MemPart)), len(parts))
        if i == len(parts):
            return None
        size = sum(p.postings_count for p in parts[i:])
        cap = _INLINE_MERGE_MAX_POSTINGS if inline else _MERGE_MAX_POSTINGS
        # (never over a segment whose deferred CRC check is still to come: a merge would copy its damage
        # under a fresh CRC)
        while i and parts[i - 1].verified and size + parts[i - 1].postings_count <= cap and (
                parts[i - 1].postings_count <= _MERGE_RATIO * size or i >= _MAX_SEGMENTS):
            i -= 1
            size += parts[i].postings_count
        run = tuple(parts[i:])
        return SegmentPlan(run, new_segment_name(), run[0].slot_lo, run[-1].slot_hi)

    def plan_live(self, name: str) -> "SegmentPlan | None":
        """Freeze the live lists into a part of their own and plan it alone (no merge) as the
        segment ``name``; None when they hold no doc. A background snapshot's child indexes the
        messages still queued and writes them this way, under a name its parent chose (so that the
        parent keeps the file the snapshot names)."""
        n = len(self._slot_doc)
        if n <= self._mem_lo:
            return None
        self._freeze(n)
        part = self._parts[-1]
        return SegmentPlan((part,), name, part.slot_lo, part.slot_hi)

    def _freeze(self, n: int) -> None:
        pv = self._prefix if self._prefix is not None and self._prefix.ready else None
        ct = self._char_terms
        part = _MemPart(self._vocab, self._terms, self._slots, self._keys, self._maxtf, pv,
                        _char_index_of(self._vocab) if ct is None else (lambda: ct), self._mem_lo, n,
                        nbytes=self._lists_bytes(), postings_count=self._live_postings())
        self._parts.append(part)
        self._mem_lo = n
        self._new_lists()

    def write_segment(self, plan: "SegmentPlan", io, directory: str) -> str:
        """Write ``plan``'s parts as one segment file in ``directory`` (fsynced; the caller fsyncs
        the directory before a snapshot names it), without the postings of docs dead by now.
        Reads only immutable parts, so a forked child may write what its parent froze.  Returns
        the file's path.

        In numpy, but for the vocabulary: the parts' terms are merged into one sorted list, each
        part's postings (in term-id order) get their terms' new numbers, and each posting is put
        straight at its place — its term's start, plus what the parts before put there, plus its
        rank in its list — so the lists stay in slot order (the parts are) without any sort."""
        run = plan.parts
        vocab, maps = _merged_vocabulary([part.term_list() for part in run])
        nt = len(vocab)
        alive = np.frombuffer(bytes(self._alive[plan.slot_lo:plan.slot_hi]), np.uint8)
        clean = bool(alive.all())
        fields = []
        used = np.zeros(nt, bool)
        for f in range(len(FIELDS)):
            pieces = []
            counts = np.zeros(nt, np.int64)
            for part, tmap in zip(run, maps):
                tids, lengths, slots, keys = part.export(f)
                term_of = np.repeat(tmap[tids.astype(np.int64)], lengths.astype(np.int64))
                if not clean:
                    keep = alive[slots.astype(np.int64) - plan.slot_lo] != 0
                    term_of, slots, keys = term_of[keep], slots[keep], keys[keep]
                # each posting's rank in its list: a part's lists are runs of one term each (two of its
                # terms never share a number in the merged vocabulary)
                firsts = np.ones(len(term_of), bool)
                firsts[1:] = term_of[1:] != term_of[:-1]
                starts = np.flatnonzero(firsts)
                rank = np.arange(len(term_of)) - np.repeat(starts, np.diff(np.append(starts, len(term_of))))
                pieces.append((term_of, rank, slots, keys))
                counts += np.bincount(term_of, minlength=nt)
            off = np.zeros(nt + 1, np.int64)
            np.cumsum(counts, out=off[1:])
            out_slots = np.empty(off[-1], np.uint32)
            out_keys = np.empty(off[-1], np.uint16)
            filled = np.zeros(nt, np.int64)
            for term_of, rank, slots, keys in pieces:
                at = off[term_of] + filled[term_of] + rank
                out_slots[at] = slots
                out_keys[at] = keys
                filled += np.bincount(term_of, minlength=nt)
            del pieces
            maxtf = np.zeros(nt, np.uint8)
            nonempty = np.flatnonzero(counts)
            if len(nonempty):
                maxtf[nonempty] = np.maximum.reduceat(out_keys >> _DL_BITS, off[nonempty]).astype(np.uint8)
            used |= counts > 0
            fields.append([off, out_slots, out_keys, maxtf])
        if not used.all():  # terms whose every posting died: left out
            keep = np.flatnonzero(used)
            vocab = [vocab[i] for i in keep.tolist()]
            for fd in fields:
                fd[0] = np.append(fd[0][:-1][keep], fd[0][-1])
                fd[3] = fd[3][keep]
        path = os.path.join(directory, plan.name)
        lo, hi = plan.slot_lo, plan.slot_hi
        # copies of the range (array slices), never views of the growing tables: a view left alive
        # (by a traceback, say) would make every later add() fail to grow them
        qs = [self._field_q(f) for f in range(len(FIELDS))]
        bounds = [_window_bounds(fd[0], fd[1], fd[2], lo, hi, np.array(_impact_table(q)))
                  for fd, q in zip(fields, qs)]
        segment_write(io, path, lo, hi, vocab, fields, _bigram_chars,
                      np.frombuffer(self._slot_doc[lo:hi], np.uint64),
                      [np.frombuffer(lens[lo:hi], np.uint32) for lens in self._lens],
                      (_WINDOW_SHIFT, qs, bounds))
        return path

    def write_and_adopt(self, plan: "SegmentPlan", io, directory: str) -> None:
        """write_segment, make the file's name durable (before any snapshot names it), and adopt it:
        what a process that wrote its own segment does (a snapshot's writer, a rebuild's worker)."""
        path = self.write_segment(plan, io, directory)
        io.sync_dir(directory)
        self.adopt(plan, Segment(path, io, verify=False))

    def adopt(self, plan: "SegmentPlan", segment: Segment) -> bool:
        """Put the written ``segment`` in place of the parts it was made from; False if they are
        no longer this index's (it was replaced by a rebuild meanwhile, or the plan was adopted)."""
        parts, run = self._parts, plan.parts
        k = len(run)
        if (segment.slot_lo, segment.slot_hi) != (plan.slot_lo, plan.slot_hi):
            raise SegmentInvalid(f"segment {segment.name} covers other slots than its plan")
        for i in range(len(parts) - k + 1):
            if all(parts[i + j] is run[j] for j in range(k)):
                parts[i:i + k] = [segment]
                # frozen lists are freed in idle steps: millions of objects at once would stall the loop
                self._retired.extend(p for p in run if isinstance(p, _MemPart))
                return True
        return False

    # --- a range indexed by another process ---------------------------------------------------
    # Indexing is ~200 us of one core a message: a start after a crash must index the log it replays
    # before it answers a search, and a backfill's imports wait on the index. When the queue is long the
    # daemon hands its first part to a forked child (its own core) and indexes the rest itself: ``reserve`` gives the
    # child's docs their slots now, in order, with an empty part in their place (the hole), so the
    # daemon's own lists go on above it; ``fill`` puts the segment the child wrote there (``abandon``
    # gives the range up if none comes). While a hole is open the index is not whole: the store answers
    # searches BUSY and takes no snapshot.

    def reserve(self, docs: Sequence[int]) -> tuple[int, int]:
        """Give ``docs`` (not yet in the index) the next slots, alive, with no postings and no lengths
        yet, behind an empty part; the daemon's live lists go on above them. Returns the slot range,
        which ``fill`` completes (or ``abandon`` gives up). One hole at a time."""
        if self._hole is not None:
            raise ValueError("the index already has a range reserved")
        for doc in docs:   # all checked before anything changes
            if doc < 0 or self._docmap.get(doc) >= 0:
                raise ValueError(f"doc {doc} is already indexed")
        if len(set(docs)) != len(docs):
            raise ValueError("a doc is given twice")
        n = len(self._slot_doc)
        if n > self._mem_lo:   # the live lists become a frozen part below the hole (plan() writes it)
            self._freeze(n)
        lo, hi = n, n + len(docs)
        for slot, doc in enumerate(docs, lo):
            self._docmap.set(doc, slot)
        self._slot_doc.extend(docs)
        self._alive.extend(b"\x01" * len(docs))
        for lens in self._lens:
            lens.extend(array("I", bytes(4 * len(docs))))
        self._live += len(docs)
        hole = _MemPart({}, [], [[] for _ in FIELDS], [[] for _ in FIELDS], [bytearray() for _ in FIELDS],
                        None, dict, lo, hi)
        self._parts.append(hole)
        self._mem_lo = hi
        self._hole = hole
        return lo, hi

    @property
    def hole(self) -> tuple[int, int] | None:
        """The reserved slot range not filled yet (see ``reserve``), or None."""
        return None if self._hole is None else (self._hole.slot_lo, self._hole.slot_hi)

    def fill(self, segment: Segment) -> None:
        """Put ``segment`` (written by ``write_range`` for the hole) in the hole's place: its postings,
        and its lengths for the slots still alive (a doc removed meanwhile counted none). Raises
        SegmentInvalid, changing nothing, if it is not the hole's (other slots, other docs)."""
        hole = self._hole
        lo, hi = (hole.slot_lo, hole.slot_hi) if hole is not None else (-1, -1)
        per_slot = segment.per_slot()
        if (segment.slot_lo, segment.slot_hi) != (lo, hi) or per_slot is None or \
                per_slot[0].tolist() != self._slot_doc[lo:hi].tolist():
            raise SegmentInvalid(f"segment {segment.name} is not the reserved range's")
        self._set_lengths(lo, hi, [lens.tolist() for lens in per_slot[1]])
        self._parts[self._parts.index(hole)] = segment
        self._maxtf_all = [max(a, b) for a, b in zip(self._maxtf_all, segment.maxtf_all)]
        self._hole = None

    def abandon(self) -> list[int]:
        """Give the hole up (its segment will not come: the child failed, or a stop could not wait):
        its docs leave the index — their slots stay, dead, behind an empty part — and are returned, in
        slot order, for the caller to index again (those removed meanwhile are not)."""
        hole = self._hole
        lo, hi = hole.slot_lo, hole.slot_hi
        docs = []
        for slot in range(lo, hi):
            if self._alive[slot]:
                doc = self._slot_doc[slot]
                self._docmap.set(doc, -1)
                self._alive[slot] = 0
                self._live -= 1
                self._dead += 1
                docs.append(doc)
        self._hole = None
        return docs

    def _set_lengths(self, lo: int, hi: int, lens: list[list[int]]) -> None:
        alive = self._alive
        for f, (mine, theirs) in enumerate(zip(self._lens, lens)):
            mine[lo:hi] = array("I", theirs)
            counted = [n for slot, n in enumerate(theirs, lo) if n and alive[slot]]
            self._total_len[f] += sum(counted)
            self._nonempty[f] += len(counted)

    @staticmethod
    def write_range(lo: int, items: Iterable[tuple[int, str, str | None, Sequence[str]]], io, directory: str,
                    name: str) -> str:
        """Index ``items`` (doc, content, summary, tags) into slots from ``lo`` on and write them as the
        segment ``name`` (fsynced, its name too): what a child does for a reserved range."""
        ix = _range_index(lo, items)
        plan = ix.plan_live(name)
        if plan is None:
            raise ValueError("a range of no docs")
        path = ix.write_segment(plan, io, directory)
        io.sync_dir(directory)
        return path

    def drop_retired(self) -> None:
        """Free at once the frozen lists segments replaced: for a process with no request loop to keep
        responsive (a rebuild's worker), where release_step would never run and they would pile up."""
        self._retired.clear()

    def release_step(self, busy: bool = False) -> None:
        """Free one bounded chunk of the frozen lists segments replaced (see idle_step); the daemon
        also calls it after each batch of requests (``busy``: small chunks for up to _RELEASE_BUSY_S,
        clients are waiting), so that a loop that is never idle frees them as fast as they come."""
        if not busy:
            if self._retired and not self._retired[-1].release_step(_RELEASE_STEP):
                self._retired.pop()
            return
        deadline = time.monotonic() + _RELEASE_BUSY_S
        while self._retired:
            if not self._retired[-1].release_step(_RELEASE_STEP_BUSY):
                self._retired.pop()
            if time.monotonic() > deadline:
                return

    def retire(self, old: "SearchIndex") -> None:
        """Free ``old`` (the index this one replaces: a rebuild's install) in steps with the frozen
        lists (release_step), not at once: its live lists at 200k messages are millions of objects,
        ~0.2 s of the request loop to free together."""
        own = [p for p in self._parts if isinstance(p, Segment)]
        if own:
            self._retired.insert(0, _PagesLetGo(own))  # (the last: after the old ones are gone)
        self._retired.extend(p for p in old._parts if isinstance(p, _MemPart))
        self._retired.extend(old._retired)
        self._retired.append(_MemPart(old._vocab, old._terms, old._slots, old._keys, old._maxtf, old._prefix,
                                      dict, 0, 0))
        segments = [p for p in old._parts if isinstance(p, Segment)]
        if segments:
            self._retired.append(_Unmapped(segments))  # (let go first)
        old._parts, old._retired = [], []
        old._new_lists()

    def flush_due(self) -> bool:
        """Whether the live lists hold _FLUSH_POSTINGS or more: worth a snapshot of their own, which
        writes them as a segment (a long burst of writes, or an index built in one go in memory)."""
        return self._live_postings() >= _FLUSH_POSTINGS

    def segment_names(self) -> list[str]:
        return [p.name for p in self._parts if isinstance(p, Segment)]

    def _alive_mask(self) -> np.ndarray:
        """Which slots are live, as booleans (of a copy: no view holds the bytearray, which grows)."""
        return np.frombuffer(bytes(self._alive), np.uint8) != 0

    def live_docs(self) -> np.ndarray:
        """The docs of the live slots (a copy)."""
        alive = self._alive_mask()
        return np.frombuffer(self._slot_doc, np.uint64)[: len(alive)][alive].astype(np.int64)

    def lengths_agree(self) -> bool:
        """The live slots' lengths in each field sum to the field's total and count its non-empty docs
        as the dump says (what BM25's average length is made of; the index keeps both in step)."""
        alive = self._alive_mask()
        for f, lens in enumerate(self._lens):
            live = np.frombuffer(lens, np.uint32)[: len(alive)][alive]
            if int(live.sum(dtype=np.int64)) != self._total_len[f] or int(np.count_nonzero(live)) != self._nonempty[f]:
                return False
        return True

    def unverified_segments(self) -> list[Segment]:
        """The segments opened ``DEFERRED`` whose CRC has not been checked yet (``Segment.check_body``)."""
        return [p for p in self._parts if isinstance(p, Segment) and not p.verified]

    def names_after(self, plan: "SegmentPlan | None") -> list[str]:
        """The segments the index will consist of once ``plan`` (just made) is adopted."""
        if plan is None:
            return self.segment_names()
        return [p.name for p in self._parts[:len(self._parts) - len(plan.parts)]] + [plan.name]

    def _field_q(self, f: int) -> float:
        """Field f's average length over live docs, quantised to 1/64 octave (so the impact table
        is rebuilt only when the average really moves)."""
        nonempty = self._nonempty[f]
        avg = self._total_len[f] / nonempty if nonempty else 1.0
        return 2.0 ** (round(math.log2(max(avg, 1e-9)) * 64) / 64)

    def _table(self, f: int) -> list[float]:
        """Impact by key for field f: BM25's tf part at the field's average length (_field_q).
        Rows for tf buckets no posting of the field uses are left as shared zeros."""
        q = self._field_q(f)
        rows = self._maxtf_all[f] + 1
        t = self._tables.get((q, rows))
        if t is None:
            if len(self._tables) >= 4:
                self._tables.clear()
                self._impacts.clear()
            t = _impact_table(q, rows)
            self._tables[(q, rows)] = t
            self._impacts[id(t)] = np.array(t[:rows << _DL_BITS])
        return t

    def _char_index(self) -> dict[str, array]:
        if self._char_terms is None:
            self._char_terms = _char_index_from(self._vocab)
        return self._char_terms

    def __contains__(self, doc: int) -> bool:
        return self._docmap.get(doc) >= 0

    def idle_step(self) -> bool:
        """One bounded step of the work no request waits for (freeing lists a segment replaced; the
        samples of a segment's terms; the prefix list's build, started here if no query started it);
        True while some remains. The
        daemon calls it when its loop is idle, so that the first prefix query finds the list built."""
        if self._retired:
            self.release_step()
            return True
        for part in self._parts:  # the samples a segment's term lookups bisect first (Segment.sample_step)
            if isinstance(part, Segment) and not part.sampled():
                part.sample_step()
                return True
        if self._prefix is None and not self._terms:
            return False
        self._prefix_step()
        return not self._prefix.ready or self._prefix_next is not None

    def keep_ahead(self, accept_docs, step: int = 1 << 18) -> bool:
        """Make ``step`` more slots' verdicts of a filter that has a ``cache_key`` (what a search
        under it keeps: FilteredBounds.kept); True while slots remain. The daemon's idle steps run
        it for the usual search's filter, so its first query after a start does not make the lot."""
        upto = self._filtered.covered(accept_docs.cache_key) + step
        return len(self._kept(accept_docs, upto)) < len(self._slot_doc)

    def _kept(self, accept_docs, upto: int | None = None) -> np.ndarray:
        """FilteredBounds.kept of a keyed filter over this index's slots (all, or the first ``upto``)."""
        slot_doc = np.frombuffer(self._slot_doc, np.uint64)  # dropped on return: add() must grow it
        return self._filtered.kept(accept_docs.cache_key, slot_doc, accept_docs, upto)

    def _prefix_step(self) -> _PrefixVocab | None:
        """Advance the prefix list's build (or a rebuild) by one bounded step (see _PrefixVocab);
        the list to expand prefixes with, or None while the first build is under way."""
        pv = self._prefix
        if pv is None:
            pv = self._prefix = _PrefixVocab(self._terms)
        elif pv.ready and self._prefix_next is None and pv.stale * 4 > pv.size + 4096:
            self._prefix_next = _PrefixVocab(self._terms)
        if not pv.ready:
            pv.build_step()
        elif self._prefix_next is not None and self._prefix_next.build_step():
            pv = self._prefix = self._prefix_next
            self._prefix_next = None
        return pv if pv.ready else None

    def _sources(self, prefix_vocab: _PrefixVocab | None) -> list:
        """The parts a query reads, in slot order: the immutable ones, then a view of the live
        lists (with ``prefix_vocab``, the live prefix list if it is ready)."""
        live = _MemPart(self._vocab, self._terms, self._slots, self._keys, self._maxtf, prefix_vocab,
                        self._char_index, self._mem_lo, None)
        return [*self._parts, live] if self._parts else [live]

    @staticmethod
    def _term_postings(sources: list, term: str, fields) -> dict[int, list]:
        """field → [(slots, keys, maxtf, window bounds or None)] of ``term`` in each part holding it there."""
        out: dict[int, list] = {}
        for part in sources:
            t = part.lookup(term)
            if t < 0:
                continue
            windowed = getattr(part, "window_shift", None) == _WINDOW_SHIFT
            for f in fields:
                got = part.postings(f, t)
                if got is not None:
                    out.setdefault(f, []).append((*got, part.bounds(f, t) if windowed else None))
        return out

    @staticmethod
    def _lists_of(f: int, got: list, w: float, table) -> list:
        """One _TermList per part for a term's postings in field f (a doc is in one part only),
        each with the term's bound over all parts (what the term can add to a doc, whichever
        part holds it: the same bound as one list of them all)."""
        maxtf = max(g[2] for g in got)
        return [_TermList(f, p, k, w, table, maxtf, b) for p, k, _, b in got]

    def _query_lists(self, query: str, fields: tuple[int, ...] = (0, 1, 2)) -> list:
        prefix_vocab = self._prefix_step()  # every query advances a build under way
        runs = query_runs(query)
        if not runs:
            return []
        weights: Counter = Counter()
        phrases: list[tuple[str, ...]] = []
        singles: list[str] = []
        for run in runs:
            if run.cjk:
                grams = tuple(dict.fromkeys(run.terms))
                weights.update(grams)
                if len(grams) > 1:
                    phrases.append(grams)
                elif len(grams[0]) == 1:
                    singles.append(grams[0])
            else:
                weights.update(run.terms)
        nf = len(FIELDS)
        tables = [self._table(f) if f in fields else None for f in range(nf)]
        sources = self._sources(prefix_vocab)
        lists: list = []
        by_term: dict[tuple[str, int], list] = {}
        for term, qtf in weights.items():
            for f, got in self._term_postings(sources, term, fields).items():
                df = _df_of(got)
                w = FIELD_WEIGHTS[f] * _idf(df, self._nonempty[f]) * qtf
                tls = self._lists_of(f, got, w, tables[f])
                lists.extend(tls)
                by_term[(term, f)] = tls
        for grams in dict.fromkeys(phrases):
            for f in fields:
                parts = [by_term.get((g, f)) for g in grams]
                if all(parts):
                    bonus = sum(tls[0].ub for tls in parts)
                    lists.append(_PhraseBonus(f, [[tl.slots for tl in tls] for tls in parts], bonus))
        prefixes: dict[str, str] = {}  # prefix → the exact term of the word it came from
        for run in runs:
            if not run.cjk:
                for p in (run.terms[0], run.word):
                    if len(p) >= _PREFIX_MIN and p.isalpha():  # words, not codes ("inv2023")
                        prefixes.setdefault(p, run.terms[0])
        if prefixes:
            readers = [r for part in sources for r in part.prefix_readers()]
            if readers:
                lists.extend(self._prefix_lists(sources, readers, prefixes, weights, tables, fields))
        budget = [_CHAR_EXPANSION_BUDGET]  # shared by all the query's one-character runs
        for ch in dict.fromkeys(singles):
            lists.extend(self._char_lists(sources, ch, tables, weights[ch], fields, budget))
        return lists

    def _prefix_lists(self, sources: list, readers: list, prefixes: dict[str, str], exact: Counter, tables,
                      fields) -> list:
        """Lists for the vocabulary terms the query's words begin (see _PREFIX_MIN): per prefix the
        _PREFIX_TERMS with the most docs among its first _PREFIX_SCAN, each once per query, never a
        term the query holds exactly.  Weight _PREFIX_WEIGHT × idf, the idf capped by the exact
        term's where the exact term is indexed in that field, so a prefix match always counts for
        less than the exact word.  The lists are ordinary lists: the scan and probe budgets of
        search() bound their work like any other."""
        chosen: dict[str, str] = {}  # term → the exact query term it stands in for
        budget = [_PREFIX_QUERY_BUDGET]
        in_memory = [part for part in sources if not isinstance(part, Segment)]
        for p, base in prefixes.items():
            if budget[0] <= 0:
                break
            dfs: dict[str, int] = {}  # df in the segments, read with the terms
            found = [t for t in _expansions(p, readers, budget, dfs) if t not in exact and t not in chosen]
            if len(found) > _PREFIX_TERMS:
                found = nlargest(_PREFIX_TERMS, found, key=lambda t: (dfs.get(t, 0) + self._df(in_memory, t), t))
            for t in found:
                chosen[t] = base
        out = []
        for t, base in chosen.items():
            qtf = exact[base]
            base_got = self._term_postings(sources, base, fields)
            for f, got in self._term_postings(sources, t, fields).items():
                n = self._nonempty[f]
                idf = _idf(_df_of(got), n)
                bg = base_got.get(f)
                if bg:
                    idf = min(idf, _idf(_df_of(bg), n))
                w = _PREFIX_WEIGHT * FIELD_WEIGHTS[f] * idf * qtf
                out.extend(self._lists_of(f, got, w, tables[f]))
        return out

    @staticmethod
    def _df(sources: list, term: str) -> int:
        total = 0
        for part in sources:
            t = part.lookup(term)
            if t >= 0:
                total += part.df(t)
        return total

    def _char_lists(self, sources: list, ch: str, tables, qtf: int, fields: tuple[int, ...], budget: list[int]) -> list:
        """One-character CJK query: besides its unigram (indexed only where the character stood
        alone), the bigrams holding the character, merged into one synthetic term per field
        whose df is the number of docs reached; a doc counts its best posting among them.
        All of a query's one-character runs together read at most ~_CHAR_EXPANSION_BUDGET
        postings (``budget``, spent in place), so a very common character is partial and a query
        of many characters cannot multiply the work; past it, a character keeps its unigram only."""
        # newest part first: past the budget, a common character keeps its most recent docs
        tids = [(part, part.char_terms(ch)) for part in reversed(sources)]
        out = []
        for f in fields:
            t = tables[f]
            best: dict[int, float] = {}  # slot → best impact among the expansions
            if budget[0] <= 0:
                break
            for part, refs in tids:
                for tid in refs:
                    got = part.postings(f, tid)
                    if got is None:
                        continue
                    p, k, _ = got
                    if type(p) is int:
                        v = t[k]
                        if best.get(p, -1.0) < v:
                            best[p] = v
                        budget[0] -= 1
                    else:
                        get = best.get
                        for s, k1 in zip(p, k):
                            v = t[k1]
                            if get(s, -1.0) < v:
                                best[s] = v
                        budget[0] -= len(p)
                    if budget[0] <= 0:
                        break
                if budget[0] <= 0:
                    break
            if not best:
                continue
            w = FIELD_WEIGHTS[f] * _idf(len(best), self._nonempty[f]) * qtf
            out.append(_MaterialList(f, {s: w * v for s, v in best.items()}))
        return out

    def search(
        self,
        query: str,
        limit: int,
        accept: Callable[[int], bool] | None = None,
        tiebreak: Callable[[int], tuple] | None = None,
        fields: tuple[int, ...] = (0, 1, 2),
    ) -> list[Hit]:
        """See search_scored(): the same hits, without the scorer."""
        return self.search_scored(query, limit, accept, tiebreak, fields)[0]

    def search_scored(
        self,
        query: str,
        limit: int,
        accept: Callable[[int], bool] | None = None,
        tiebreak: Callable[[int], tuple] | None = None,
        fields: tuple[int, ...] = (0, 1, 2),
    ) -> tuple[list[Hit], "QueryScores"]:
        """(hits, scorer): ``scorer`` (QueryScores) gives the own score of any other doc for the
        same query from what this search already computed (for storaged/rank.py).  ``hits``: the ``limit`` best acceptable docs ordered by score then ``tiebreak`` (default: doc), both
        descending. ``fields`` (indexes into FIELDS) restricts which fields may match.

        The work of one call is bounded, so no query can stall the daemon for everyone else:

        * Postings: lists are scanned best bound first (rarest terms first) while the postings
          read stay within _SCAN_BUDGET (the first list is always read).  If lists are left, the
          best _PROBE_CANDIDATES acceptable docs so far (fewer if probing them would exceed
          _PROBE_BUDGET) are probed in them by binary search.  A doc holding none of the scanned
          terms, or ranked below those candidates by the scanned terms, is then not found.
        * Filter: ``accept`` is asked about at most _ACCEPT_BUDGET docs, best scored first; the
          docs past that count as not acceptable (so fewer than ``limit`` may come back).

        Guaranteed exact, with or without ``accept``: every query whose lists hold at most
        _SCAN_BUDGET postings in all (such a query reaches at most that many docs, and
        _ACCEPT_BUDGET is no smaller) — every LoCoMo question even at 200k messages, and
        bench/search_quality.py is unchanged.  Past a budget the result is approximate in which
        docs are returned, never in their scores: every Hit's score and breakdown are exact.
        """
        pool, _, lists, scorer = self._pool(query, limit, accept, fields)
        if not pool:
            return [], scorer
        slot_doc = self._slot_doc

        # Exact per-field scores for the finalists, then the final order.
        pool.sort()
        c, sm, t = scorer.per_field(pool)
        hits = [Hit(slot_doc[s], c[j] + sm[j] + t[j], c[j], sm[j], t[j]) for j, s in enumerate(pool)]
        if tiebreak is None:
            return nlargest(limit, hits, key=lambda h: (h.score, h.doc)), scorer
        return nlargest(limit, hits, key=lambda h: (h.score, tiebreak(h.doc))), scorer

    def prepare(self, query: str, fields: tuple[int, ...] = (0, 1, 2)) -> PreparedQuery:
        """The query's lists, for several search_own() calls in a row with no change to the index
        between them (PreparedQuery)."""
        lists = self._query_lists(query, fields) if self._live else []
        lists.sort(key=lambda tl: -tl.ub)
        return PreparedQuery(fields, lists)

    def search_own(
        self,
        query: str | PreparedQuery,
        limit: int,
        accept: Callable[[int], bool] | None = None,
        tiebreak: Callable[[int], tuple] | None = None,
        fields: tuple[int, ...] = (0, 1, 2),
        accept_docs: Callable[[np.ndarray], np.ndarray] | None = None,
    ) -> tuple[list[tuple[int, float]], "QueryScores"]:
        """search_scored() without the per-field breakdown: ([(doc, score)], scorer), each score
        the doc's total as the scorer sums it (QueryScores.totals: lists in query order, where a
        Hit sums per field first, so the two may differ in the last bit and docs tied to it may
        swap).  For stages that rerank a pool and want the breakdown of their own finalists only
        (QueryScores.fields; storaged/rank.py): it saves probing every list for the whole pool.
        ``accept_docs``: ``accept`` for a whole array of docs at once (a bool array), which the
        array kernel then uses in place of asking ``accept`` doc by doc. ``query``: its text, or
        prepare()'s lists of it (for the same ``fields``). A ``tiebreak`` may carry ``first``: the
        first item of its tuple for an array of docs at once (_tied_first)."""
        pool, totals, _, scorer = self._pool(query, limit, accept, fields, accept_docs)
        slot_doc = self._slot_doc
        own = [(slot_doc[s], v) for s, v in zip(pool, totals)]
        if tiebreak is None:  # (score, doc) is unique: a sort is nlargest's order, in C
            own.sort(key=itemgetter(1, 0), reverse=True)
            return own[:limit], scorer
        if 0 < limit < len(own):
            # the tiebreak (a Python call a doc) only for the docs that can make the page: those
            # scoring at least the limit-th best; the others, in order, as nlargest would see them
            theta = nlargest(limit, map(itemgetter(1), own))[-1]
            own = [h for h in own if h[1] >= theta]
            first = getattr(tiebreak, "first", None)
            if first is not None and len(own) > 2 * limit:
                own = self._tied_first(own, limit, first)
        return nlargest(limit, own, key=lambda h: (h[1], tiebreak(h[0]))), scorer

    @staticmethod
    def _tied_first(own: list[tuple[int, float]], limit: int, first: Callable[[np.ndarray], np.ndarray]
                    ) -> list[tuple[int, float]]:
        """The (doc, score) of ``own`` that can make a page of ``limit`` by (score, tiebreak(doc)),
        in their order, ``first`` giving the tiebreak's first item for an array of docs at once: those
        at or above the limit-th best (score, first item). Why: agent history repeats itself (the same
        error, the same tool output), and a query's pool may hold thousands of docs tied at its cut:
        a tiebreak asked of each (~4 us) took 40 ms of such a search_sessions call."""
        docs = np.fromiter(map(itemgetter(0), own), np.int64, len(own))
        scores = np.fromiter(map(itemgetter(1), own), np.float64, len(own))
        keys = np.asarray(first(docs))
        m = np.lexsort((keys, scores))[len(own) - limit]  # the limit-th best by score, then first item
        worth = (scores > scores[m]) | ((scores == scores[m]) & (keys >= keys[m]))
        return [own[i] for i in np.flatnonzero(worth).tolist()]

    def _pool(self, query: str, limit: int, accept, fields,
              accept_docs=None) -> tuple[list[int], list[float], list, "QueryScores"]:
        """(pool, totals, lists, scorer): the slots of the acceptable docs scoring within float
        noise of the limit-th best (see _top_pool), their exact totals (lists summed in the order
        they are sorted here, best bound first), the query's lists.  The body of search_scored(),
        whose docstring tells the budgets; a query within _ARRAY_POSTINGS goes to _pool_arrays, and
        one under a keyed filter past it too when the postings the filter keeps are within it."""
        if limit <= 0 or not self._live:
            return [], [], [], QueryScores(self, [], {}, 0)
        prepared = None
        if isinstance(query, PreparedQuery):
            if query.fields != fields:
                raise ValueError("a prepared query searched in other fields than it was prepared for")
            prepared, lists = query, query.lists
        else:
            lists = self._query_lists(query, fields)
            lists.sort(key=lambda tl: -tl.ub)
        if not lists:
            return [], [], [], QueryScores(self, [], {}, 0)
        n = len(lists)
        rem_size = [0] * (n + 1)
        for i in range(n - 1, -1, -1):
            rem_size[i] = rem_size[i + 1] + lists[i].size

        alive = self._alive
        slot_doc = self._slot_doc
        ok = _verdicts(alive, slot_doc, accept)
        if ((accept is None or accept_docs is not None) and rem_size[0] >= _WINDOW_MIN_POSTINGS and n < 1 << 15
                and sum(tl.size for tl in lists if getattr(tl, "win", None) is None) <= _ARRAY_POSTINGS):
            # (the lists without bounds are read whole: past the array kernel's budget, MaxScore's)
            got = self._pool_windows(lists, limit, accept_docs, prepared)
            if got is not None:
                return got
            # the bounds prune too little for this query: the paths below read its lists whole
        if rem_size[0] <= _ARRAY_POSTINGS:
            return self._pool_arrays(lists, limit, ok if accept is not None else None, accept_docs)
        if getattr(accept_docs, "cache_key", None) is not None:  # past the budget, yet the postings it keeps may fit
            got = self._pool_arrays_kept(lists, limit, accept_docs, _ARRAY_POSTINGS)
            if got is not None:
                return got
        rem = [0.0] * (n + 1)  # rem[i]: the most lists[i:] can add to one doc
        for i in range(n - 1, -1, -1):
            rem[i] = rem[i + 1] + lists[i].ub

        acc: dict[int, float] = {}
        i = 0
        top = None
        total = rem[0]
        scanned = 0
        since_check = 0  # postings scanned since the last shut-out check
        while i < n:
            # Worth checking whether newcomers are already shut out only if that saves real work,
            # only possible once what was scanned can outweigh what is left, and (as a check walks
            # all of acc, in C: ~1/5 of the cost of scanning a posting) only if the scanning since
            # the last check, or the next list's, pays for it: checks never cost more than scans.
            if (i and total - rem[i] > rem[i] and len(acc) >= limit and rem_size[i] > len(acc)
                    and (4 * since_check >= len(acc) or lists[i].size >= len(acc))):
                since_check = 0
                top = self._shut_out(acc, rem[i], limit, ok)
                if top is not None:
                    break
            size = lists[i].size
            if i and scanned + size > _SCAN_BUDGET:
                break  # the budget is spent: the rest is probed for the best candidates below
            lists[i].scan_into(acc)
            scanned += size
            since_check += size
            i += 1

        scorer = QueryScores(self, lists, acc, i)  # acc holds lists[:i] in full, for every doc
        if top is not None:
            # MaxScore's second phase: no doc outside acc can reach the `limit` verified docs in
            # `top`, so the remaining lists are only probed for the docs of acc that still can.
            theta = min(map(acc.__getitem__, top))
            cut = (theta - rem[i]) * (1.0 - 1e-9) - 1e-12
            cands = list(filter(alive.__getitem__, compress(acc, map(cut.__le__, acc.values()))))
            m = _probe_count(lists, i, limit)
            if len(cands) > m and _probe_cost(lists, i, len(cands)) > _PROBE_BUDGET:
                top = None  # too many docs still in the running: keep the best only (below)
            else:
                cands.sort()
                scores = list(map(acc.__getitem__, cands))
                for j in range(i, n):
                    lists[j].probe(cands, scores)
                    if j + 1 == n:
                        break
                    # top's scores only rise, so their minimum is a valid, rising threshold
                    theta = min(scores[bisect_left(cands, s)] for s in top)
                    cut = (theta - rem[j + 1]) * (1.0 - 1e-9) - 1e-12
                    mask = list(map(cut.__le__, scores))
                    if not all(mask):
                        cands = list(compress(cands, mask))
                        scores = list(compress(scores, mask))
                acc = dict(zip(cands, scores))
        if top is None and i < n:
            cands = sorted(self._best_acceptable(acc, _probe_count(lists, i, limit), ok))
            scores = list(map(acc.__getitem__, cands))
            for j in range(i, n):
                lists[j].probe(cands, scores)
            acc = dict(zip(cands, scores))
        pool = self._top_pool(acc, limit, ok)
        return pool, list(map(acc.__getitem__, pool)), lists, scorer

    def _pool_arrays(self, lists: list, limit: int, ok, accept_docs=None) -> tuple[list[int], list[float], list, "QueryScores"]:
        """_pool() for a query within _ARRAY_POSTINGS: every list at once, in C.

        Why: MaxScore saves postings, but each one it reads costs a Python step (~1 µs); here all
        of the query's postings go into one pair of arrays (slots, contributions, lists in their
        sorted order) and one np.bincount sums them per slot: the same additions in the same order
        as scanning list after list into a dict, so the same totals to the bit, for every doc the
        query reaches.  The accumulator is dense (a float per slot) when that is cheaper than
        sorting the postings (np.unique), which only a small query on a big index is.  The pool
        is then picked as _top_pool does: `ok` (None: no filter, liveness checked in C) asked
        best-first, about as few docs as it can."""
        impacts = self._impacts
        if getattr(accept_docs, "cache_key", None) is not None:
            return self._pool_arrays_kept(lists, limit, accept_docs)
        table = getattr(lists[0], "table", None)
        if all(type(tl) is _TermList and tl.table is table for tl in lists) and id(table) in impacts:
            # one field's terms (the usual query): one table lookup and one product for them all
            postings = np.concatenate([[tl.slots] if type(tl.slots) is int else np.frombuffer(tl.slots, np.uint32)
                                       for tl in lists])
            keys = np.concatenate([[tl.keys] if type(tl.slots) is int else np.frombuffer(tl.keys, np.uint16)
                                   for tl in lists])
            lengths = [tl.size for tl in lists]
            values = impacts[id(table)][keys] * np.repeat([tl.w for tl in lists], lengths)
        else:
            parts = [tl.arrays(impacts.get(id(getattr(tl, "table", None)))) for tl in lists]
            postings = np.concatenate([p[0] for p in parts])
            values = np.concatenate([p[1] for p in parts])
            lengths = [len(p[0]) for p in parts]
            del parts
        nslots = len(self._slot_doc)
        if nslots <= 8 * len(postings) + _DENSE_SLOTS:
            acc = np.bincount(postings, values, nslots)
            touched = np.flatnonzero(acc > 0)  # every contribution is positive; (bool: 6x faster)
            scores = acc[touched]
            del acc
        else:
            touched, inverse = np.unique(postings, return_inverse=True)
            scores = np.bincount(inverse, values)
        scorer = QueryScores(self, lists, {}, len(lists), (touched, scores, postings, values, lengths))
        if ok is None or accept_docs is not None:  # no filter, or one asked of all docs at once
            if self._dead or accept_docs is not None:
                view = np.frombuffer(self._alive, np.uint8)  # dropped at once: add() must grow it
                live = view[touched] != 0
                del view
                if accept_docs is not None:
                    view = np.frombuffer(self._slot_doc, np.uint64)
                    docs = view[touched].astype(np.int64)
                    del view
                    live &= accept_docs(docs)
                n_live = int(np.count_nonzero(live))
                if n_live > limit:
                    theta = np.partition(scores[live], n_live - limit)[n_live - limit]
                    live &= scores >= theta * (1.0 - 1e-9) - 1e-12
                top = np.flatnonzero(live)
            elif len(scores) > limit:
                theta = np.partition(scores, len(scores) - limit)[len(scores) - limit]
                top = np.flatnonzero(scores >= theta * (1.0 - 1e-9) - 1e-12)
            else:
                return touched.tolist(), scores.tolist(), lists, scorer
            return touched[top].tolist(), scores[top].tolist(), lists, scorer
        t = len(touched)
        k = min(t, 2 * limit + 8)
        theta = None
        while True:  # the best k by score, widened until `limit` of them are acceptable
            top = np.argpartition(scores, t - k)[t - k:] if k < t else np.arange(t)
            top = top[np.argsort(scores[top])[::-1]]
            good = 0
            for s, v in zip(touched[top].tolist(), scores[top].tolist()):
                if ok(s):
                    good += 1
                    if good == limit:
                        theta = v
                        break
                elif ok.spent:
                    break
            if theta is not None or k == t or ok.spent:
                break
            k = min(t, 4 * k)
        if theta is not None:  # every acceptable doc within float noise of the limit-th best
            cut = theta * (1.0 - 1e-9) - 1e-12
            top = np.flatnonzero(scores >= cut)
        pool, totals = [], []
        for s, v in zip(touched[top].tolist(), scores[top].tolist()):
            if ok(s):
                pool.append(s)
                totals.append(v)
        return pool, totals, lists, scorer

    def _pool_arrays_kept(self, lists: list, limit: int, accept_docs, budget: int | None = None
                          ) -> tuple[list[int], list[float], list, "QueryScores"] | None:
        """_pool_arrays() under a filter that has a ``cache_key``: only the postings of the slots
        it keeps (storaged/filterbounds.py's mask, one byte a slot) are summed. A doc's postings are
        all kept or all not, in their order, so its total is the array kernel's to the bit. None if
        the kept postings pass ``budget`` (a query past the array kernel's: MaxScore's, then).

        Why: search_sessions keeps prompts and answers, ~3% of a common query's postings at 5M
        events; summing only those takes the query from ~60 ms to a few. The scorer it returns
        probes the lists (it has no sums for the docs the filter dropped)."""
        impacts = self._impacts
        kept = self._kept(accept_docs)
        parts_s, parts_v = [], []
        total = 0
        for tl in lists:
            if budget is not None and total > budget:
                return None
            if type(tl) is _TermList:
                if type(tl.slots) is int:
                    if kept[tl.slots]:
                        parts_s.append(np.array([tl.slots], np.int64))
                        parts_v.append(np.array([tl.w * tl.table[tl.keys]]))
                    continue
                sl = np.frombuffer(tl.slots, np.uint32)
                at = np.flatnonzero(kept[sl])
                if not len(at):
                    continue
                imp = impacts.get(id(tl.table))
                if imp is None:  # the index dropped its cached tables since this list was made
                    imp = np.array(tl.table)
                parts_s.append(sl[at])
                parts_v.append(imp[np.frombuffer(tl.keys, np.uint16)[at]] * tl.w)
                total += len(at)
                del sl
            else:
                sl, vals = tl.arrays(impacts.get(id(getattr(tl, "table", None))))
                sl, vals = np.asarray(sl, np.int64), np.asarray(vals, np.float64)
                at = np.flatnonzero(kept[sl])
                parts_s.append(sl[at])
                parts_v.append(vals[at])
                total += len(at)
        if budget is not None and total > budget:
            return None
        scorer = QueryScores(self, lists, {}, 0)
        if not parts_s:
            return [], [], lists, scorer
        postings = np.concatenate(parts_s)
        values = np.concatenate(parts_v)
        del parts_s, parts_v
        touched, inverse = np.unique(postings, return_inverse=True)
        scores = np.bincount(inverse, values)
        view = np.frombuffer(self._alive, np.uint8)  # dropped at once: add() must grow it
        live = view[touched] != 0
        del view
        view = np.frombuffer(self._slot_doc, np.uint64)
        live &= accept_docs(view[touched].astype(np.int64))  # the mask's verdicts, asked again of the few
        del view
        n_live = int(np.count_nonzero(live))
        if n_live > limit:
            theta = np.partition(scores[live], n_live - limit)[n_live - limit]
            live &= scores >= theta * (1.0 - 1e-9) - 1e-12
        top = np.flatnonzero(live)
        return touched[top].tolist(), scores[top].tolist(), lists, scorer

    def _window_base(self, lists: list) -> "_WindowBase":
        """What the window kernel gathers from a query's lists whatever the filter: each list's
        arrays, the lists with bounds by segment field with where each one's postings of each window
        begin, and the other lists' postings as one set of arrays (_window_sources tells them)."""
        shift = _WINDOW_SHIFT
        nwin = (len(self._slot_doc) >> shift) + 1
        impacts = self._impacts
        sources = []
        grouped: dict[int, tuple] = {}  # the lists with bounds, by segment and field (WindowGroup)
        # the lists without bounds, gathered as the array kernel gathers them: slots and keys
        # concatenated, each key looked up in its table (the tables side by side) times its w
        bulk_s, bulk_k, bulk_n, bulk_len, bulk_w, bulk_t = [], [], [], [], [], []
        bulk_v: dict[int, np.ndarray] = {}  # list number → values, for the lists that are not term lists
        tables: dict[int, int] = {}  # id(impacts) → its offset among the tables side by side
        table_arrays = []

        def to_bulk(i: int, sl: np.ndarray, ks: np.ndarray, w: float, imp: np.ndarray | None) -> None:
            off = 0
            if imp is not None:
                off = tables.get(id(imp))
                if off is None:
                    off = tables[id(imp)] = sum(map(len, table_arrays))
                    table_arrays.append(imp)
            bulk_s.append(sl)
            bulk_k.append(ks)
            bulk_w.append(w)
            bulk_t.append(off)
            bulk_n.append(i)
            bulk_len.append(len(sl))

        for i, tl in enumerate(lists):
            if type(tl) is _TermList:
                imp = impacts.get(id(tl.table))
                if imp is None:  # the index dropped its cached tables since this list was made
                    imp = np.array(tl.table)
                if type(tl.slots) is int:
                    sl, ks = np.array([tl.slots], np.uint32), np.array([tl.keys], np.uint16)
                elif type(tl.slots) is memoryview:  # a segment's mapping: never changes
                    sl, ks = np.frombuffer(tl.slots, np.uint32), np.frombuffer(tl.keys, np.uint16)
                else:  # in-memory lists, copied: the scorer keeps them, and a view would stop add()
                    sl, ks = np.array(tl.slots, np.uint32), np.array(tl.keys, np.uint16)
                sources.append((sl, ks, tl.w, imp, None))
                if tl.win is not None:
                    _, q_then, bmax, row, first, group = tl.win
                    scale = float(bmax) / 255.0 * tl.w * _drift(q_then, self._field_q(tl.field))
                    grouped.setdefault(id(group), (group, imp, tl.field, []))[3].append((i, row, first, len(sl), tl.w, scale))
                else:
                    to_bulk(i, sl, ks, tl.w, imp)
            else:
                sl, vals = tl.arrays()
                sl, vals = np.asarray(sl, np.int64), np.asarray(vals, np.float64)
                order = np.argsort(sl, kind="stable")
                sl, vals = sl[order], vals[order]
                sources.append((sl, None, None, None, vals))
                bulk_v[i] = vals  # put in place below (its keys and w: zeros)
                to_bulk(i, sl, np.zeros(len(sl), np.uint16), 0.0, None)
        groups = []
        for group, imp, field, members in grouped.values():
            # a segment field's lists at once: where each one's postings of each window begin (rows
            # of counts, summed along)
            nums, rows, firsts, sizes, ws, scales = (np.array(x) for x in zip(*members))
            cnt = group.bcnt[rows].astype(np.int64)
            starts = np.zeros((len(rows), group.n_win + 1), np.int64)
            np.cumsum(cnt, axis=1, out=starts[:, 1:])
            starts += firsts.astype(np.int64)[:, None]
            wrong = starts[:, -1] != firsts.astype(np.int64) + sizes
            if wrong.any():  # counts that do not add up to the list (a written file never has them)
                for j in np.flatnonzero(wrong).tolist():
                    sl, ks, w, _, _ = sources[int(nums[j])]
                    to_bulk(int(nums[j]), sl, ks, w, imp)
                keep = ~wrong
                nums, rows, ws, scales, cnt, starts = nums[keep], rows[keep], ws[keep], scales[keep], cnt[keep], starts[keep]
                if not len(nums):
                    continue
            groups.append((group, imp, field, nums, rows, ws, scales, cnt, starts))
        bulk = None
        if sum(bulk_len):  # (a CJK phrase bonus may hold no doc)
            if any(a > b for a, b in zip(bulk_n, bulk_n[1:])):  # lists moved here from a group: in order
                order = sorted(range(len(bulk_n)), key=bulk_n.__getitem__)
                bulk_s, bulk_k, bulk_w, bulk_t, bulk_n, bulk_len = (
                    [x[j] for j in order] for x in (bulk_s, bulk_k, bulk_w, bulk_t, bulk_n, bulk_len))
            bs = np.concatenate(bulk_s).astype(np.int64)
            lengths = np.array(bulk_len, np.int64)
            bn = np.repeat(np.array(bulk_n, np.int16), lengths)
            keys = np.concatenate(bulk_k).astype(np.int64) + np.repeat(np.array(bulk_t, np.int64), lengths)
            both = np.concatenate(table_arrays) if table_arrays else np.zeros(1)
            bv = both[keys] * np.repeat(np.array(bulk_w), lengths)
            del keys
            if bulk_v:  # the synthetic lists' own values, in their place
                at = 0
                for i, size in zip(bulk_n, bulk_len):
                    if i in bulk_v:
                        bv[at:at + size] = bulk_v[i]
                    at += size
            bulk = (bs, bv, bn)
        return _WindowBase(nwin, sources, groups, bulk)

    def _window_sources(self, base: "_WindowBase", accept_docs=None) -> tuple[list, list, tuple, np.ndarray,
                                                                             np.ndarray, np.ndarray | None]:
        """(sources, bounded, bulk, bound, count, kept) of a query's lists (``base``: _window_base's)
        for the window kernel.

        ``sources``: per list, in order, (slots, keys, w, impacts, values) — slots ascending; for a
        term list keys/w/impacts (its contributions are impacts[keys] * w, as the array kernel
        computes them), else values.  ``bounded``: the lists with bounds, a group per segment and
        field (storaged/segment.py's WindowGroup): (list numbers, starts, w per list, impacts, the
        field's slots and keys, first window, windows, kept rows) — list j's postings of window
        ``first + i`` are the field's [starts[j, i], starts[j, i + 1]); under a keyed filter, the
        lists whose rows over its docs are made are in ``kept rows`` instead (_accepted_bounds), and
        only their kept postings are gathered.  ``bulk``: the other lists' postings, which
        are short or in memory, as one set of arrays (slots, values, list number, window), lists in
        order.  ``bound``: per window of the index, what all the lists together can add to one of
        its docs: a list with bounds adds them (times the drift of the field's average since its
        segment was written), any other one its exact highest contribution in each window; with
        an ``accept_docs`` that has a ``cache_key`` (Store.etype_filter), a list with bounds adds
        its bounds over the docs the filter keeps (storaged/filterbounds.py) instead, and only the
        kept slots' postings of the other lists are in ``bulk``. ``count``: per window, the query's
        postings there (under a keyed filter, the ones the kernel will gather). ``kept``: that
        filter's verdict by slot, or None."""
        nwin = base.nwin
        bound = np.zeros(nwin)
        count = np.zeros(nwin, np.int64)
        bounded = []
        fkey = getattr(accept_docs, "cache_key", None)
        kept = self._kept(accept_docs) if fkey is not None else None
        making = [_FILTER_BOUNDS_BUDGET]  # postings this query may read to make bounds over the filter's docs
        for group, imp, field, nums, rows, ws, scales, cnt, starts in base.groups:
            # a segment field's lists at once: their bounds a row each summed into the windows
            w_lo, n = group.w_lo, group.n_win
            krows: list[tuple] = []
            if fkey is None:
                bound[w_lo:w_lo + n] += scales @ group.bval[rows]
            else:
                add, full, krows = self._accepted_bounds(group, imp, field, nums, rows, starts, ws, scales,
                                                         kept, fkey, making)
                bound[w_lo:w_lo + n] += add
                nums, ws, cnt, starts = nums[full], ws[full], cnt[full], starts[full]
                for *_, kstarts in krows:
                    count[w_lo:w_lo + n] += np.diff(kstarts)
            count[w_lo:w_lo + n] += cnt.sum(axis=0)
            bounded.append((nums.astype(np.int16), starts, ws, imp, group.slots, group.keys, w_lo, n, krows))
        bulk = None
        if base.bulk is not None:
            bs, bv, bn = base.bulk
            if kept is not None:  # the kept slots' postings only: no other doc can be in the pool
                on = kept[bs]
                bs, bv, bn = bs[on], bv[on], bn[on]
            if len(bs):
                bw = bs >> _WINDOW_SHIFT
                cell = bn.astype(np.int64) * nwin + bw  # ascending: lists in order, each in slot order
                first = np.flatnonzero(np.concatenate(([True], cell[1:] != cell[:-1])))
                bound += np.bincount(bw[first], np.maximum.reduceat(bv, first), nwin)
                count += np.bincount(bw, minlength=nwin)
                bulk = (bs, bv, bn, bw)
        return base.sources, bounded, bulk, bound, count, kept

    def _accepted_bounds(self, group, imp: np.ndarray, field: int, nums: np.ndarray, rows: np.ndarray,
                         starts: np.ndarray, ws: np.ndarray, scales: np.ndarray, kept: np.ndarray, fkey: tuple,
                         making: list[int]) -> tuple[np.ndarray, np.ndarray, list[tuple]]:
        """(add, full, krows) for the lists of ``rows`` (list numbers ``nums``, postings from
        ``starts[:, 0]`` to ``starts[:, -1]``, weights ``ws``) of one segment field under the filter
        whose verdicts by slot are ``kept``: ``add``, what they add to one kept doc of each window of
        the group; ``krows``, per list whose row over the filter's docs is made (storaged/filterbounds.py,
        kept in self._filtered; made on first need while ``making[0]`` postings last for this query)
        and keeps some: (list number, w, its first posting, its kept postings' positions, their
        starts by window) — the kernel gathers only those; ``full``, the rows past the budget, whose
        windows are read whole: they add the segment's own bounds (``scales``: their factor; over
        all docs, so over the kept ones too), so a client that asks a new filter with every query
        never makes one read every list whole. A row that keeps nothing is in neither."""
        q_now = self._field_q(field)
        add = np.zeros(group.n_win)
        full = np.zeros(len(rows), bool)
        krows = []
        for j, row in enumerate(rows.tolist()):
            got = self._filtered.get(group.ident, row, fkey)
            if got is None:
                a, b = int(starts[j, 0]), int(starts[j, -1])
                if b - a > making[0]:
                    add += scales[j] * group.bval[row]
                    full[j] = True
                    continue
                making[0] -= b - a
                got = self._filtered.put(group.ident, row, fkey, accepted_row(
                    group.slots[a:b], group.keys[a:b], imp, kept, _WINDOW_SHIFT, group.w_lo, group.n_win, q_now))
            if got.top:
                w = float(ws[j])
                add += got.cells * (got.top / 255.0 * w * _drift(got.q_then, q_now))
                kstarts = np.zeros(group.n_win + 1, np.int64)
                np.cumsum(got.counts, out=kstarts[1:])
                krows.append((int(nums[j]), w, int(starts[j, 0]), got.at, kstarts))
        return add, full, krows

    def _pool_windows(self, lists: list, limit: int, accept_docs=None, prepared: PreparedQuery | None = None
                      ) -> tuple[list[int], list[float], list, "QueryScores"] | None:
        """_pool() for a query of at least _WINDOW_MIN_POSTINGS postings, unfiltered or filtered by
        ``accept_docs`` (an array of docs → a bool array): the array kernel's pool, scored a few
        windows of slots at a time (block-max pruning); or None when the bounds prune too little
        (the windows left after a round hold more than _WINDOW_GIVE_UP of the postings, or a
        filter left fewer than ``limit`` acceptable docs in the first round's best windows: the
        bounds are over all docs, and a filter that keeps a minority keeps the cut low — a filter
        with a key has bounds over its own docs instead, _accepted_bounds).  The filter is asked
        about the docs of the windows read; the cut is the limit-th best acceptable live score.

        Why: the array kernel reads every posting of the query (a common word's list holds much
        of the index: 37 ms a query at 5M events); yet the best docs of a query sit in a small
        part of its windows (~7% of the postings, median, on the 1M-event agent corpus).  Windows
        are taken best bound first, _WINDOW_FIRST of them and then four times more each round;
        each round sums its windows' postings as the kernel does (per doc, lists in order: the
        same totals to the bit); then every window whose bound cannot reach the limit-th best
        live score found (within float noise) is dropped, as no doc there can enter the pool.  So
        the pool is the kernel's, unless the query reads past _WINDOW_BUDGET postings first: then
        it is the best of the windows read (every score exact; the array kernel's own budget)."""
        shift = _WINDOW_SHIFT
        wsize = 1 << shift
        base = prepared.window_base if prepared is not None else None
        if base is None:
            base = self._window_base(lists)
            if prepared is not None:
                prepared.window_base = base
        sources, bounded, bulk, bound, count, kept = self._window_sources(base, accept_docs)
        postings = int(count.sum())
        nwin = len(bound)
        cand = np.flatnonzero(bound > 0)
        done = np.zeros(nwin, bool)
        got_slots, got_scores, got_good = [], [], []
        live_scores = np.zeros(0)
        alive = np.frombuffer(self._alive, np.uint8)  # dropped before returning: add() must grow them
        slot_doc = np.frombuffer(self._slot_doc, np.uint64) if accept_docs is not None else None
        cut = -math.inf
        read = 0
        k = _WINDOW_FIRST
        # under a keyed filter whose rows are all made, every posting gathered is a kept one: the
        # windows left cost only theirs, less than the array kernel's pass over every posting
        exact = kept is not None and not any(len(b[0]) for b in bounded)
        while len(cand):
            pick = cand[np.argpartition(-bound[cand], k)[:k]] if len(cand) > k else cand
            if read + int(count[pick].sum()) > _WINDOW_BUDGET:
                if exact:  # the paths that read lists whole decide what a query past the budget gets,
                    return None  # as they did before it read kept postings only (the same answers)
                # the last round: its best windows while the budget lasts (at least one)
                pick = pick[np.argsort(-bound[pick], kind="stable")]
                pick = pick[:max(1, int(np.searchsorted(np.cumsum(count[pick]), _WINDOW_BUDGET - read, "right")))]
            chosen = np.sort(pick)
            done[chosen] = True
            k *= 4
            parts_s, parts_v, parts_n = [], [], []
            for nums, starts, ws, imp, slots_all, keys_all, w_lo, n, krows in bounded:
                c = chosen[(chosen >= w_lo) & (chosen < w_lo + n)] - w_lo
                if not len(c):
                    continue
                a = starts[:, c]  # per list (row) and chosen window: its postings [a, b)
                lens = starts[:, c + 1] - a
                per_list = lens.sum(axis=1)
                a, lens = a.ravel(), lens.ravel()
                total = int(per_list.sum())
                if total:
                    at = _concat_ranges(a, lens, total)
                    sl = slots_all[at]
                    w_each, n_each = np.repeat(ws, per_list), np.repeat(nums, per_list)
                    if kept is not None:  # a row over all docs, under a filter: its kept postings
                        on = kept[sl]
                        at, sl, w_each, n_each = at[on], sl[on], w_each[on], n_each[on]
                    parts_s.append(sl.astype(np.int64))
                    parts_v.append(imp[keys_all[at]] * w_each)
                    parts_n.append(n_each)
                for num, w, first, k_at, kstarts in krows:  # a row over the filter's docs: its kept postings
                    a = kstarts[c]
                    lens = kstarts[c + 1] - a
                    total = int(lens.sum())
                    if total:
                        at = k_at[_concat_ranges(a, lens, total)] + np.int64(first)
                        parts_s.append(slots_all[at].astype(np.int64))
                        parts_v.append(imp[keys_all[at]] * w)
                        parts_n.append(np.full(total, num, np.int16))
            if bulk is not None:
                now = np.zeros(nwin, bool)
                now[chosen] = True
                sel = np.flatnonzero(now[bulk[3]])
                if len(sel):
                    parts_s.append(bulk[0][sel])
                    parts_v.append(bulk[1][sel])
                    parts_n.append(bulk[2][sel])
            if parts_s:
                ps = np.concatenate(parts_s)
                pv = np.concatenate(parts_v)
                if len(parts_s) > 1:  # per doc, contributions in list order (radix sort: small ints)
                    order = np.argsort(np.concatenate(parts_n), kind="stable")
                    ps, pv = ps[order], pv[order]
                rank = np.zeros(nwin, np.int64)
                rank[chosen] = np.arange(len(chosen))
                local = rank[ps >> shift] * wsize + (ps & (wsize - 1))
                acc = np.bincount(local, pv, len(chosen) * wsize)
                read += len(ps)
                del ps, pv, parts_s, parts_v, parts_n, local
                hit = np.flatnonzero(acc > 0)  # every contribution is positive
                slots = (chosen[hit >> shift] << shift) | (hit & (wsize - 1))
                scores = acc[hit]
                del acc
                got_slots.append(slots)
                got_scores.append(scores)
                good = alive[slots] != 0
                if accept_docs is not None:
                    good &= accept_docs(slot_doc[slots].astype(np.int64))
                got_good.append(good)
                live_scores = np.concatenate((live_scores, scores[good]))
                if len(live_scores) > limit:  # keep the best only: ties within noise count below
                    live_scores = np.partition(live_scores, len(live_scores) - limit)[len(live_scores) - limit:]
                if len(live_scores) >= limit:
                    cut = float(live_scores.min()) * (1.0 - 1e-9) - 1e-12
            if read >= _WINDOW_BUDGET:
                break
            # windows whose bound (with float noise) cannot reach the cut are done with
            cand = cand[~done[cand] & (bound[cand] * (1.0 + 1e-9) + 1e-12 >= cut)]
            if not exact and (read + int(count[cand].sum()) > _WINDOW_GIVE_UP * postings
                              or (accept_docs is not None and len(live_scores) < limit)):
                # the bounds prune too little: reading every list whole is faster than gathering
                # most of their windows (and the array kernel gives the same pool and scores)
                return None
        del alive, slot_doc
        slots = np.concatenate(got_slots) if got_slots else np.zeros(0, np.int64)
        scores = np.concatenate(got_scores) if got_scores else np.zeros(0)
        good = np.concatenate(got_good) if got_good else np.zeros(0, bool)
        by_slot = np.argsort(slots, kind="stable")
        slots, scores, good = slots[by_slot], scores[by_slot], good[by_slot]
        top = np.flatnonzero(good & (scores >= cut)) if len(live_scores) >= limit else np.flatnonzero(good)
        scorer = _WindowScores(self, lists, sources, done, slots, scores, read, kept)
        return slots[top].tolist(), scores[top].tolist(), lists, scorer

    @staticmethod
    def _shut_out(acc: dict, bound: float, limit: int, ok: Callable[[int], bool]) -> list | None:
        """`limit` acceptable slots of acc each scoring above `bound` (what a doc not yet in acc
        could still reach), or None.  Counts in C first; asks `ok` best-first and only then."""
        r = bound * (1.0 + 1e-9) + 1e-12
        if sum(map(r.__lt__, acc.values())) < limit:
            return None
        strong = list(compress(acc, map(r.__lt__, acc.values())))
        m = 2 * limit + 8
        if len(strong) > 2 * m:  # usually the best few pass: avoid sorting them all
            top = [s for s in nlargest(m, strong, key=acc.__getitem__) if ok(s)]
            if len(top) >= limit:
                return top[:limit]
        top = []
        for s in _best_first(acc, strong):
            if ok(s):
                top.append(s)
                if len(top) == limit:
                    return top
            elif ok.spent:
                break
        return None

    @staticmethod
    def _best_acceptable(acc: dict, m: int, ok: Callable[[int], bool]) -> list[int]:
        """Up to ``m`` acceptable slots of acc with the best scores (asks ``ok`` best-first).
        Walks acc in score order, a band at a time (_ranked), and stops at ``m``."""
        out = []
        for band in _ranked(acc, 2 * m):
            for s in band:
                if ok(s):
                    out.append(s)
                    if len(out) == m:
                        return out
                elif ok.spent:
                    return out
        return out

    @staticmethod
    def _top_pool(acc: dict, limit: int, ok: Callable[[int], bool]) -> list[int]:
        """Acceptable slots scoring within float noise of the limit-th best acceptable score.
        Asks `ok` about as few docs as it can: best scores first, widening while too few pass
        (by the pass rate seen so far), and past 1/8 of acc walking everything in score order."""
        m = limit * 2 + 8
        while m * 8 < len(acc):
            cut0 = nlargest(m, acc.values())[-1]
            good = [s for s in compress(acc, map(cut0.__le__, acc.values())) if ok(s)]
            if len(good) >= limit:
                theta = nlargest(limit, map(acc.__getitem__, good))[-1]
                cut = theta * (1.0 - 1e-9) - 1e-12
                # ties at the boundary may extend below cut0
                return [s for s in compress(acc, map(cut.__le__, acc.values())) if ok(s)]
            if ok.spent:
                return good
            m = max(2 * m, int(m * limit * 1.5 / max(len(good), 1)) + 8)
        good = []
        cut = None
        for band in _ranked(acc, 4 * m):
            for s in band:
                v = acc[s]
                if cut is not None and v < cut:
                    return good
                if ok(s):
                    good.append(s)
                    if cut is None and len(good) == limit:
                        cut = v * (1.0 - 1e-9) - 1e-12
                elif ok.spent:
                    return good
        return good

    # --- snapshot -----------------------------------------------------------------------------

    def dump(self) -> dict[str, Any]:
        """A msgpack-able dict of bytes (and byte views): the state as is (tombstones included, so scores after
        load are identical), posting lists concatenated per field, and the names of the segments
        that hold the postings below ``mem_lo`` (frozen parts must be written first: plan(),
        write_segment(), adopt()).

        The per-slot tables (each slot's doc and lengths) are in the segments that cover those slots;
        the dump holds them only for the slots no segment of version 2 covers (``docs``: the live lists'
        slots, and an older segment's), and the alive flags as one bit a slot. The doc → slot map is
        not dumped: load() derives it from the live slots' docs. So a snapshot, which rewrites the
        dump whole, writes what changed since the last one and ~1 bit a message, not ~25 bytes."""
        if any(isinstance(p, _MemPart) for p in self._parts):
            raise ValueError("the index has frozen parts not yet written as segments")
        fields = []
        for f in range(len(FIELDS)):
            tids, counts, all_slots, all_keys = _export_lists(self._slots[f], self._keys[f])
            fields.append(
                {
                    # views, not copies, of arrays made for the dump (nothing resizes them): a copy of
                    # an index's live postings can be ~100 MiB, one C call holding the GIL
                    "tids": memoryview(tids).cast("B"),
                    "counts": memoryview(counts).cast("B"),
                    "slots": memoryview(all_slots).cast("B"),
                    "keys": memoryview(all_keys).cast("B"),
                    "maxtf": bytes(self._maxtf[f]),
                    "total": self._total_len[f],
                    "nonempty": self._nonempty[f],
                }
            )
        nslots = len(self._slot_doc)
        return {
            "format": _FORMAT,
            "byteorder": sys.byteorder,
            "terms": _joined_terms(self._terms),
            "slots": nslots,
            "docmap_len": len(self._docmap.arr),
            "alive": np.packbits(np.frombuffer(bytes(self._alive), np.uint8), bitorder="little").tobytes(),
            "docs": [[lo, hi, self._slot_doc[lo:hi].tobytes(), [lens[lo:hi].tobytes() for lens in self._lens]]
                     for lo, hi in self._uncovered(nslots)],
            "fields": fields,
            "mem_lo": self._mem_lo,
            "segments": [[p.name, p.slot_lo, p.slot_hi] for p in self._parts],
        }

    def _uncovered(self, nslots: int) -> list[tuple[int, int]]:
        """The slot ranges whose per-slot tables no segment holds (in order, adjacent ones joined)."""
        out: list[tuple[int, int]] = []
        for lo, hi in [(p.slot_lo, p.slot_hi) for p in self._parts if p.per_slot() is None] + [(self._mem_lo, nslots)]:
            if lo == hi:
                continue
            if out and out[-1][1] == lo:
                out[-1] = (out[-1][0], hi)
            else:
                out.append((lo, hi))
        return out

    @classmethod
    def load(cls, data: dict[str, Any], directory: str | None = None, io=None, verify: bool | str = True) -> "SearchIndex":
        """The index a dump describes, its segments mapped from ``directory`` (``verify`` False: not
        checked against their CRCs, for segments a child of this process has just written;
        ``segment.DEFERRED``: checked after a store's start, ``unverified_segments``).  Raises ValueError
        on anything that is not a dump of a readable format, or whose segments are missing or do
        not fit it (SegmentInvalid), DumpOutdated if it is one of an earlier tokenizer."""
        return run_steps(cls.load_steps(data, directory, io, verify))

    @classmethod
    def load_steps(cls, data: dict[str, Any], directory: str | None = None, io=None,
                   verify: bool | str = True) -> Generator[None, None, "SearchIndex"]:
        """load(), a yield between its steps (the dump's own lists; the segments mapped; each one's
        per-slot tables copied; the doc map): the request loop installs a rebuilt index in turns
        (storaged/compaction.py) — at 5M events the whole held it 168-186 ms."""
        if isinstance(data, dict) and data.get("format") in _OUTDATED_FORMATS:
            raise DumpOutdated(f"search index dump {data['format']} holds another tokenizer's terms")
        if not isinstance(data, dict) or data.get("format") not in _READABLE_FORMATS:
            raise ValueError("not a search index dump")
        try:
            self = cls._load(data)
            yield
            self._open_segments(data.get("segments", []), data.get("mem_lo", 0), directory, io, verify)
            if data["format"] == _FORMAT:
                yield from self._load_per_slot(data)
            return self
        except (KeyError, TypeError, IndexError, AttributeError, OverflowError, UnicodeError) as exc:
            raise ValueError(f"corrupt search index dump ({type(exc).__name__})") from None

    def _open_segments(self, listed: list, mem_lo: int, directory: str | None, io, verify: bool | str = True) -> None:
        """Map the dump's segments: each must exist, be whole, and cover the slots the dump says,
        one after the other from slot 0 up to ``mem_lo``, where the dump's own lists begin."""
        if listed and directory is None:
            raise SegmentInvalid("the dump names segments but no directory to find them in")
        at = 0
        paths = [_segment_path(directory, name) for name, _, _ in listed]
        for (name, _, _), path in zip(listed, paths):
            if path is None:
                raise SegmentInvalid(f"not a segment name: {name!r}")
        for (name, lo, hi), path in zip(listed, paths):
            seg = Segment(path, io, verify)
            if (seg.slot_lo, seg.slot_hi) != (lo, hi) or lo != at:
                raise SegmentInvalid(f"segment {name} does not cover the slots the snapshot says")
            self._parts.append(seg)
            at = hi
        if at != mem_lo or not 0 <= mem_lo <= len(self._alive):
            raise SegmentInvalid("the segments do not end where the dump's lists begin")
        if mem_lo:  # (a dump without segments, mem_lo 0, is not walked: the start reads it as it is)
            for f in range(len(FIELDS)):
                for p in self._slots[f]:
                    if p is not None and (p if type(p) is int else p[0]) < mem_lo:
                        raise SegmentInvalid("a listed posting lies in a segment's slots")
        self._mem_lo = mem_lo
        for seg in self._parts:
            self._maxtf_all = [max(a, b) for a, b in zip(self._maxtf_all, seg.maxtf_all)]
        self._unswept = self._alive.count(0, mem_lo)  # the sweeper's work: the dump's own lists only

    @classmethod
    def _load(cls, data: dict[str, Any]) -> "SearchIndex":
        swap = data["byteorder"] != sys.byteorder

        def arr(code: str, raw: bytes) -> array:
            a = array(code)
            a.frombytes(raw)
            if swap:
                a.byteswap()
            return a

        def check(ok: bool) -> None:
            if not ok:
                raise ValueError("corrupt search index dump")

        self = cls()
        terms_text = data["terms"]
        check(isinstance(terms_text, str))
        terms: list[str | None] = terms_text.split("\n") if terms_text else []
        for tid, t in enumerate(terms):
            if not t:
                terms[tid] = None
                self._free_tids.append(tid)
        self._terms = terms
        self._vocab = {t: tid for tid, t in enumerate(terms) if t is not None}
        check(len(self._vocab) + len(self._free_tids) == len(terms))
        self._term_bytes = sum(map(sys.getsizeof, self._vocab))
        nt = len(terms)
        if data["format"] == _FORMAT:  # the per-slot tables come later, from the segments (_load_per_slot)
            nslots = data["slots"]
            check(isinstance(nslots, int) and 0 <= nslots < 1 << 32)
            packed = data["alive"]
            check(isinstance(packed, bytes) and len(packed) == (nslots + 7) // 8)
            self._alive = bytearray(np.unpackbits(np.frombuffer(packed, np.uint8), count=nslots, bitorder="little"))
        else:
            self._slot_doc = arr("Q", data["slot_doc"])
            self._alive = bytearray(data["alive"])
            nslots = len(self._slot_doc)
            check(len(self._alive) == nslots and self._alive.count(1) + self._alive.count(0) == nslots)
            dm = self._docmap
            dm.arr = arr("i", data["docmap"])
            dm.extra = {int(d): int(sl) for d, sl in data["docmap_extra"]}
            for f, fd in enumerate(data["fields"]):
                self._lens[f] = arr("I", fd["lens"])
                check(len(self._lens[f]) == nslots)
        self._live = self._alive.count(1)
        self._dead = self._unswept = nslots - self._live
        if data["format"] != _FORMAT:
            check(len(dm.arr) - dm.arr.count(-1) + len(dm.extra) == self._live)
        fields = data["fields"]
        check(isinstance(fields, list) and len(fields) == len(FIELDS))
        for f, fd in enumerate(fields):
            slots_f = [None] * nt
            keys_f = [None] * nt
            tids = arr("I", fd["tids"])
            counts = arr("I", fd["counts"])
            all_slots = arr("I", fd["slots"])
            all_keys = arr("H", fd["keys"])
            check(len(tids) == len(counts))
            check(len(all_slots) == len(all_keys) == sum(counts) and 0 not in counts)
            off = 0
            for tid, c in zip(tids, counts):
                if all_slots[off + c - 1] >= nslots:  # lists are sorted: the last is the largest
                    raise ValueError("corrupt search index dump")
                if c == 1:
                    slots_f[tid] = all_slots[off]
                    keys_f[tid] = all_keys[off]
                    self._n_single += 1
                else:
                    slots_f[tid] = all_slots[off : off + c]
                    keys_f[tid] = all_keys[off : off + c]
                    self._n_arrays += 2
                    self._n_postings += c
                off += c
            self._slots[f] = slots_f
            self._keys[f] = keys_f
            self._maxtf[f] = bytearray(fd["maxtf"])
            self._total_len[f] = int(fd["total"])
            self._nonempty[f] = int(fd["nonempty"])
            check(len(self._maxtf[f]) == nt)
            self._maxtf_all[f] = max(self._maxtf[f], default=0)
        return self

    def _load_per_slot(self, data: dict[str, Any]) -> Generator[None, None, None]:
        """Fill the per-slot tables of a current dump from the segments that hold them and the dump's
        ``docs`` pieces, which together must cover every slot exactly once, then derive the doc → slot
        map from the live slots (a doc live in two slots is a corrupt dump)."""
        nslots = len(self._alive)
        order = "<" if data["byteorder"] == "little" else ">"
        docs = np.zeros(nslots, np.uint64)
        lens = [np.zeros(nslots, np.uint32) for _ in FIELDS]
        pieces = []
        for part in self._parts:
            tables = part.per_slot()
            if tables is not None:
                pieces.append((part.slot_lo, part.slot_hi, tables[0], tables[1]))
        for lo, hi, raw_docs, raw_lens in data["docs"]:
            if not (isinstance(lo, int) and isinstance(hi, int) and 0 <= lo <= hi <= nslots
                    and len(raw_docs) == 8 * (hi - lo) and len(raw_lens) == len(FIELDS)
                    and all(len(x) == 4 * (hi - lo) for x in raw_lens)):
                raise ValueError("corrupt search index dump (per-slot tables)")
            pieces.append((lo, hi, np.frombuffer(raw_docs, order + "u8"),
                           [np.frombuffer(x, order + "u4") for x in raw_lens]))
        at = 0
        for lo, hi, piece_docs, piece_lens in sorted(pieces, key=lambda p: p[0]):
            if lo != at:
                raise SegmentInvalid("the per-slot tables do not cover every slot once")
            for a in range(lo, hi, _LOAD_STEP):  # a piece a turn: a segment's pages may not be in memory
                b = min(hi, a + _LOAD_STEP)
                docs[a:b] = piece_docs[a - lo:b - lo]
                for f, x in enumerate(piece_lens):
                    lens[f][a:b] = x[a - lo:b - lo]
                yield
            at = hi
        if at != nslots:
            raise SegmentInvalid("the per-slot tables do not cover every slot once")
        slot_doc = yield from _array_in_steps("Q", docs)
        for f, x in enumerate(lens):
            self._lens[f] = yield from _array_in_steps("I", x)
        self._slot_doc = slot_doc
        live_slots = np.flatnonzero(np.frombuffer(bytes(self._alive), np.uint8))
        yield
        live_docs = docs[live_slots]
        yield
        # The doc map as it was: the docs below its array's length in the array, the rest (which _DocMap.set
        # put in its dict) in the dict. Docs are seqs, sparse once messages are deleted: a rule of the live
        # count's would send the newer docs, and every doc added after them, to the dict (~30x the bytes).
        # The array is never longer than the last live doc needs (a bigger `docmap_len` is a corrupt dump's).
        docmap_len = data["docmap_len"]
        if not isinstance(docmap_len, int) or docmap_len < 0:
            raise ValueError("corrupt search index dump (doc map length)")
        top = int(live_docs.max()) if len(live_docs) else -1
        inside = live_docs < docmap_len
        table = np.full(min(docmap_len, top + 1 + (top >> 4) if top >= 0 else 0), -1, np.int32)
        yield
        for a in range(0, len(live_docs), _LOAD_STEP):  # a piece a turn (all 5M at once: 25-60 ms)
            b = a + _LOAD_STEP
            keep = inside[a:b]
            table[live_docs[a:b][keep].astype(np.int64)] = live_slots[a:b][keep]
            yield
        extra = dict(zip(live_docs[~inside].tolist(), live_slots[~inside].tolist()))
        if np.count_nonzero(table >= 0) + len(extra) != len(live_docs):  # two slots wrote one entry
            raise ValueError("corrupt search index dump (a doc live in two slots)")
        yield
        arr = yield from _array_in_steps("i", table)
        dm = self._docmap
        dm.arr = arr
        dm.extra = extra
