"""Ranking stages around the BM25 core (storaged/search.py): conversation context and Japanese phrases.

Why: a conversation carries its meaning across turns.  A reply such as "yes, twice last month" is
found only through the turn before it, and multi-hop questions need the turns around the one that
matches.  So a message's final score takes in its session neighbours' own scores, decaying with
distance (CONTEXT_WEIGHTS, tuned on LoCoMo dev with bench/search_quality.py):

    final(m) = own(m) + sum over k = 1..R of CONTEXT_WEIGHTS[k-1] * max(own(m - k), own(m + k))

where m ± k are the messages k places before/after m in its session's order (live messages only).
The better neighbour at each distance, not the sum of both: on LoCoMo dev the sum (0.5/0.25, the
form measured outside the project) lifts recall@10 to 0.757 but costs multi-hop (cat 1) and
open-domain (cat 3) questions at recall@5, because a turn between two matching turns outranks
both; max(0.55, 0.3) gives 0.763 with every category at or above the core alone.

Bounded work, never a scan of a session: the core gives a pool of the best candidates by their own
score (POOL docs, filtered and unfiltered); only the messages within R places of those can be
returned, and neighbours() is asked once per pool doc (a window of ±2R places, which holds the ±R of
each of them).  The window docs' own scores come from what the search already summed
(SearchIndex.search_own → QueryScores.own: after the array kernel a binary search in its sorted
slots; after MaxScore a dict lookup plus a merge with any list it left unscanned), and the context
shares of all windows are computed together in a few numpy passes over one row of windows, the same
additions in the same order as doc by doc; the filter and the tiebreak are asked best-first, about
the docs that can still make the page; the per-field breakdown is computed for the returned hits
only (QueryScores.fields).  Filters
decide what is *returned*; a neighbour's text counts whatever its kind, tier or tags.  A message that
matches nothing itself can be returned through its neighbours: its own share is 0, the context share
says why it is there.

Japanese phrases: the core ORs a CJK run's bigrams (plus a bonus for holding all of them).  Here a
candidate whose text holds a query run of three or more characters as one contiguous run gets a
bonus of the best own score in the pool (shared among the query's runs), so it ranks above every
message that only shares some bigrams (ありがとう vs あります) or holds them scattered.
"""
from __future__ import annotations

from heapq import nlargest
from itertools import repeat
from operator import itemgetter
from typing import Callable, NamedTuple, Sequence

import numpy as np

from storaged.tokenize import normalize, query_runs

__all__ = ["CONTEXT_WEIGHTS", "RankedHit", "ranked_search"]

# ±1 and ±2 neighbours (tuned on LoCoMo dev; see the figures in bench/search_quality.py's output).
CONTEXT_WEIGHTS: tuple[float, ...] = (0.55, 0.3)
# Candidates taken from the core by their own score: at least POOL_MIN, else POOL_FACTOR × limit.
POOL_MIN = 20  # recall is flat from 10 to 100 on LoCoMo dev
POOL_FACTOR = 2


class RankedHit(NamedTuple):
    doc: int
    score: float
    content: float  # own score by field (the phrase bonus counts in content)
    summary: float
    tags: float
    context: float  # what the session neighbours added


Neighbours = Callable[[int, int], tuple[Sequence[int], Sequence[int]]]
"""neighbours(doc, r) → (up to r docs before it, nearest first; up to r docs after it, nearest first)."""


def _phrase_runs(query: str) -> list[str]:
    """The query's CJK runs of three or more characters, normalised as the index sees them."""
    out = []
    for run in query_runs(query):
        if run.cjk and len(run.terms) > 1:
            text = run.terms[0] + "".join(t[1] for t in run.terms[1:])
            out.append(text)
    return list(dict.fromkeys(out))


def _windows(pool: list[int], neighbours: Neighbours, radius: int) -> tuple[np.ndarray, np.ndarray]:
    """(row, keep): each pool doc's window of ±2·radius places (one neighbours() call each), side
    by side in one row with `radius` gaps (-1) before each window and after the last, and keep[i]
    true where row[i] is a doc within `radius` of its window's pool doc.  A window holds the
    ±radius of each doc it keeps (it is cut short only by its session's ends), so no other doc
    is looked up and no session is walked."""
    wins = list(map(neighbours, pool, repeat(2 * radius)))
    gap = (-1,) * radius
    row: list[int] = []
    for d, (before, after) in zip(pool, wins):
        row += (*gap, *reversed(before), d, *after)
    row += gap
    c = np.fromiter(map(len, map(itemgetter(0), wins)), np.int64, len(wins))
    a = np.fromiter(map(len, map(itemgetter(1), wins)), np.int64, len(wins))
    lens = radius + c + 1 + a
    centre = np.cumsum(lens) - a - 1  # the pool doc's place in row
    docs = np.fromiter(row, np.int64, len(row))
    n = len(row) - radius
    keep = np.zeros(len(row), np.bool_)
    keep[:n] = np.abs(np.arange(n) - np.repeat(centre, lens)) <= radius
    keep &= docs >= 0  # not a gap next to a window cut short
    return docs, keep


def _best_in_context(docs: np.ndarray, vals: np.ndarray, keep: np.ndarray, weights, limit: int,
                     accept, tiebreak, own_match: bool) -> list[tuple[float, int, float]]:
    """The ``limit`` best (final score, doc, context share) among the docs of the row ``docs``
    (own scores ``vals``) marked in ``keep`` (_windows), in order (final score, then tiebreak or
    doc, descending).  Every share of every window in a few array passes: the same additions, in
    the same order, as doc by doc in Python.  ``accept`` and ``tiebreak`` are asked best-first,
    about the docs that can still make the page."""
    r, n = len(weights), len(vals)  # kept places lie in [r, n - r): the row's first and last gaps
    ctx = np.zeros(n)
    for k, w in enumerate(weights, 1):
        ctx[r:n - r] = ctx[r:n - r] + w * np.maximum(vals[r - k:n - r - k], vals[r + k:n - r + k])
    at = np.flatnonzero(keep)
    own, ctx = vals[at], ctx[at]
    final = own + ctx
    docs = docs[at]
    worth = final > 0
    if own_match:
        worth &= own > 0
    sel = np.flatnonzero(worth)
    order = sel[np.lexsort((docs[sel], final[sel]))[::-1]]  # final, then doc, descending
    out: list[tuple[float, int, float]] = []
    seen = set()  # a doc in several windows gets the same numbers in each: take it once
    cut = None
    lo, step = 0, 2 * limit + 8
    while lo < len(order):  # best-first, a band at a time (most pages fill from the first)
        band = order[lo:lo + step]
        lo, step = lo + step, 4 * step
        for f, d, x in zip(final[band].tolist(), docs[band].tolist(), ctx[band].tolist()):
            if cut is not None and f < cut:
                lo = len(order)
                break
            if d in seen:
                continue
            seen.add(d)
            if accept is None or accept(d):
                out.append((f, d, x))
                if len(out) == limit:
                    if tiebreak is None:
                        return out
                    cut = f  # docs tied with the last one compete by tiebreak
    if tiebreak is None:
        return out
    return nlargest(limit, out, key=lambda x: (x[0], tiebreak(x[1])))


def ranked_search(
    index,
    query: str,
    limit: int,
    accept: Callable[[int], bool] | None = None,
    tiebreak: Callable[[int], tuple] | None = None,
    fields: tuple[int, ...] = (0, 1, 2),
    neighbours: Neighbours | None = None,
    text_of: Callable[[int], str] | None = None,
    weights: Sequence[float] = CONTEXT_WEIGHTS,
    own_match: bool = False,
    accept_docs: Callable | None = None,
) -> list[RankedHit]:
    """The ``limit`` best acceptable docs by own score + context share (+ phrase bonus), then
    ``tiebreak`` (default: doc), descending.  Without ``neighbours`` there is no context share;
    without ``text_of`` no phrase check.  ``own_match``: context only reorders docs that match
    themselves (search_sessions, whose snippet must show the match), it adds none.
    ``accept_docs``: ``accept`` over an array of docs (SearchIndex.search_own), when the caller has one."""
    if limit <= 0:
        return []
    radius = len(weights) if neighbours is not None else 0
    pool_n = max(POOL_MIN, POOL_FACTOR * limit)
    prepared = index.prepare(query, fields)  # its lists looked up once for both searches below
    hits, scorer = index.search_own(prepared, pool_n, None if radius else accept, tiebreak, fields,
                                    None if radius else accept_docs)
    total = dict(hits)  # doc → own score, all fields (the breakdown: for the finalists only, below)
    pool = list(total)
    if radius and accept is not None and sum(map(accept, pool)) < limit:
        # a narrow filter: the best acceptable docs may lie outside the unfiltered pool
        for d, v in index.search_own(prepared, pool_n, accept, tiebreak, fields, accept_docs)[0]:
            if d not in total:
                total[d] = v
                pool.append(d)
    if not total:
        return []

    # Every doc within `radius` of the pool may be returned (_windows); their own scores come
    # from the scorer in one call, and the context shares from a few array passes over the row.
    if radius:
        docs, keep = _windows(pool, neighbours, radius)
        vals = scorer.own(docs)  # the pool's own scores too: the same numbers as in `total`

    phrases = _phrase_runs(query) if text_of is not None and 0 in fields else []
    bonus_of: dict[int, float] = {}
    if phrases:
        bonus = (float(vals.max()) if radius else max(total.values())) / len(phrases)
        scored_docs = np.unique(docs[vals > 0]).tolist() if radius else [d for d, v in total.items() if v > 0]
        for d in scored_docs:
            text = normalize(text_of(d))
            n = sum(1 for p in phrases if p in text)
            if n:
                bonus_of[d] = n * bonus
        if bonus_of and radius:
            vals = vals + np.fromiter(map(bonus_of.get, docs.tolist(), repeat(0.0)), np.float64, len(docs))
        for d, b in bonus_of.items():
            if d in total:
                total[d] += b

    if radius:
        best = _best_in_context(docs, vals, keep, weights, limit, accept, tiebreak, own_match)
    else:
        get = total.get
        scored = [(v, d, 0.0) for d in pool if (v := get(d, 0.0)) > 0]
        if tiebreak is None:
            best = nlargest(limit, scored)
        else:
            best = nlargest(limit, scored, key=lambda x: (x[0], tiebreak(x[1])))

    # the per-field breakdown, of the finalists only
    own = scorer.fields([d for _, d, _ in best])
    zero = (0.0, 0.0, 0.0)
    out = []
    for _, d, ctx in best:
        c, s, t = own.get(d, zero)
        c += bonus_of.get(d, 0.0)
        out.append(RankedHit(d, c + s + t + ctx, c, s, t, ctx))
    return out
