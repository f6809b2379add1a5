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
score (POOL docs, filtered and unfiltered); only the messages within R places of those are looked at,
and their own scores come from SearchIndex.score_docs (a binary search per query list).  Filters
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
from typing import Callable, NamedTuple, Sequence

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
) -> list[RankedHit]:
    """The ``limit`` best acceptable docs by own score + context share (+ phrase bonus), then
    ``tiebreak`` (default: doc), descending.  Without ``neighbours`` there is no context share;
    without ``text_of`` no phrase check.  ``own_match``: context only reorders docs that match
    themselves (search_sessions, whose snippet must show the match), it adds none."""
    if limit <= 0:
        return []
    radius = len(weights) if neighbours is not None else 0
    pool_n = max(POOL_MIN, POOL_FACTOR * limit)
    hits = index.search(query, pool_n, None if radius else accept, tiebreak, fields)
    own: dict[int, tuple[float, float, float]] = {h.doc: (h.content, h.summary, h.tags) for h in hits}
    pool = list(own)
    if radius and accept is not None and sum(map(accept, pool)) < limit:
        # a narrow filter: the best acceptable docs may lie outside the unfiltered pool
        for h in index.search(query, pool_n, accept, tiebreak, fields):
            if h.doc not in own:
                own[h.doc] = (h.content, h.summary, h.tags)
                pool.append(h.doc)
    if not own:
        return []

    phrases = _phrase_runs(query) if text_of is not None else []
    around: dict[int, tuple[Sequence[int], Sequence[int]]] = {}
    eligible = pool
    if radius:
        eligible = list(pool)
        seen = set(pool)
        for d in pool:
            nb = around[d] = neighbours(d, radius)
            for side in nb:
                for e in side:
                    if e not in seen:
                        seen.add(e)
                        eligible.append(e)
        if accept is not None:
            eligible = [d for d in eligible if accept(d)]
        # own scores of everything within `radius` of an eligible doc
        need = set()
        for d in eligible:
            nb = around.get(d)
            if nb is None:
                nb = around[d] = neighbours(d, radius)
            for side in nb:
                need.update(side)
        need.difference_update(own)
        if need:
            own.update(index.score_docs(query, need, fields))

    if phrases and 0 in fields:
        best = max(sum(v) for v in own.values())
        bonus = best / len(phrases)
        for d in list(own):
            text = normalize(text_of(d))
            n = sum(1 for p in phrases if p in text)
            if n:
                c, s, t = own[d]
                own[d] = (c + n * bonus, s, t)

    zero = (0.0, 0.0, 0.0)
    out = []
    for d in eligible:
        c, s, t = own.get(d, zero)
        ctx = 0.0
        if radius:
            before, after = around[d]
            for k, w in enumerate(weights):
                b = sum(own.get(before[k], zero)) if k < len(before) else 0.0
                a = sum(own.get(after[k], zero)) if k < len(after) else 0.0
                ctx += w * (b if b > a else a)
        total = c + s + t + ctx
        if total > 0 and (not own_match or c + s + t > 0):
            out.append(RankedHit(d, total, c, s, t, ctx))
    if tiebreak is None:
        return nlargest(limit, out, key=lambda h: (h.score, h.doc))
    return nlargest(limit, out, key=lambda h: (h.score, tiebreak(h.doc)))
