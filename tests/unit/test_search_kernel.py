"""The array kernel (SearchIndex._pool_arrays, numpy) against MaxScore (the Python path it replaces
for queries within _ARRAY_POSTINGS): the same hits, the same scores to the bit, the same per-field
breakdowns and the same own scores of any other doc, so no ranking changes with the kernel."""

import random

import pytest

from storaged import search as S
from storaged.rank import ranked_search
from storaged.search import SearchIndex

JA = ["会議", "議事録", "ありがとう", "あります", "東京", "京都", "予定", "確認", "資料", "送付"]


@pytest.fixture(scope="module")
def corpus():
    """Zipf-like words, summaries and tags on some docs, Japanese runs, sessions of 12 docs,
    some docs removed and re-added (tombstones the sweeper has not reached)."""
    rng = random.Random(11)
    vocab = [f"w{i}" for i in range(400)] + ["postgresql", "postgres", "replication", "replicated"]
    weights = [1 / (i + 1) for i in range(len(vocab))]
    ix = SearchIndex()
    texts = {}
    for d in range(1, 2401):
        words = rng.choices(vocab, weights, k=rng.randint(2, 18))
        if d % 5 == 0:
            words.append("".join(rng.sample(JA, 2)))
        texts[d] = " ".join(words)
        summary = " ".join(rng.choices(vocab, weights, k=4)) if d % 6 == 0 else None
        tags = (rng.choice(vocab),) if d % 9 == 0 else ()
        ix.add(d, texts[d], summary, tags)
    for d in rng.sample(range(1, 2401), 150):
        ix.remove(d)
    for d in rng.sample(range(1, 2401), 60):
        ix.remove(d)
        texts[d] = " ".join(rng.choices(vocab, weights, k=6))
        ix.add(d, texts[d], None, ())
    queries = [" ".join(rng.choices(vocab, weights, k=rng.randint(1, 6))) for _ in range(40)]
    queries += ["postgres replication", "会議の議事録", "ありがとう", "東", "京 予定 w3", "w1 w2 w3 w4"]
    return ix, texts, queries


def neighbours(doc, r):
    lo = (doc - 1) // 12 * 12 + 1
    seqs = list(range(lo, lo + 12))
    i = seqs.index(doc)
    return seqs[max(0, i - r):i][::-1], seqs[i + 1:i + 1 + r]


def both(monkeypatch, fn):
    """fn() with the array kernel, then with MaxScore (the kernel's budget lowered to 0)."""
    arrays = fn()
    with monkeypatch.context() as m:
        m.setattr(S, "_ARRAY_POSTINGS", 0)
        maxscore = fn()
    return arrays, maxscore


@pytest.mark.parametrize("dense", [True, False])
def test_kernel_gives_maxscores_hits_and_scores_to_the_bit(corpus, monkeypatch, dense):
    ix, _, queries = corpus
    if not dense:  # the sorted (np.unique) accumulator, used for a small query on a big index
        monkeypatch.setattr(S, "_DENSE_SLOTS", -10**9)
    odd = lambda d: d % 2 == 1  # noqa: E731
    for q in queries:
        for limit, accept, fields in ((10, None, (0, 1, 2)), (25, odd, (0, 1, 2)), (5, None, (0,)), (7, odd, (1, 2))):
            a, b = both(monkeypatch, lambda: ix.search(q, limit, accept, fields=fields))
            assert a == b, (q, limit)  # Hit tuples: docs, totals and breakdowns, exactly
            a, b = both(monkeypatch, lambda: ix.search_own(q, limit, accept, fields=fields)[0])
            assert a == b, (q, limit)


def test_kernel_scorer_gives_the_same_own_scores(corpus, monkeypatch):
    ix, _, queries = corpus
    rng = random.Random(3)
    for q in queries:
        docs = {d for c in rng.sample(range(1, 2401), 30) for d in range(c - 4, c + 5)} | {0, 99999, -3}
        (_, sa), (_, sb) = both(monkeypatch, lambda: ix.search_scored(q, 20))
        assert sa._arrays is not None and sb._arrays is None
        assert sa.totals(docs) == sb.totals(docs), q
        assert sa.fields(docs) == sb.fields(docs), q


def ranked_cases(texts: dict) -> list[dict]:
    """ranked_search's options a kernel must not change the answers of: none, a filter, a tiebreak with
    own matches only, a phrase check."""
    tb = lambda d: (d % 5, d)  # noqa: E731
    return [{}, {"accept": lambda d: d % 3 == 0}, {"tiebreak": tb, "own_match": True},
            {"text_of": texts.get, "tiebreak": tb}]


def test_ranked_search_is_unchanged_by_the_kernel(corpus, monkeypatch):
    ix, texts, queries = corpus
    for q in queries:
        for kw in ranked_cases(texts):
            a, b = both(monkeypatch, lambda: ranked_search(ix, q, 12, neighbours=neighbours, **kw))
            assert a == b, (q, kw)


def test_index_grows_while_a_scorer_is_held():
    # the kernel reads posting arrays, the doc map and the tombstones through numpy views: none may
    # outlive the call, or add() could not grow them (BufferError)
    ix = SearchIndex()
    for d in range(1, 300):
        ix.add(d, f"alpha beta gamma{d % 7}", None, ())
    hits, scorer = ix.search_scored("alpha gamma3", 10)
    assert scorer._arrays is not None and hits
    own = scorer.totals(range(1, 300))
    for d in range(300, 1300):
        ix.add(d, f"alpha beta gamma{d % 7}", None, ())
    ix.remove(5)
    assert scorer.totals(range(1, 300)).keys() <= own.keys()
    assert ix.search("alpha gamma3", 10)


def test_kernel_without_tombstones_gives_the_same_pool(monkeypatch):
    # an index with no deleted doc skips the liveness pass: the same hits all the same
    rng = random.Random(4)
    vocab = [f"v{i}" for i in range(120)]
    weights = [1 / (i + 1) for i in range(120)]
    ix = SearchIndex()
    for d in range(1, 1500):
        ix.add(d, " ".join(rng.choices(vocab, weights, k=rng.randint(2, 12))), None, ())
    assert not ix._dead
    for _ in range(30):
        q = " ".join(rng.choices(vocab, weights, k=rng.randint(1, 5)))
        for limit in (1, 10, 40, 5000):
            a, b = both(monkeypatch, lambda: ix.search(q, limit))
            assert a == b, (q, limit)
            a, b = both(monkeypatch, lambda: ranked_search(ix, q, limit, neighbours=neighbours))
            assert a == b, (q, limit)
