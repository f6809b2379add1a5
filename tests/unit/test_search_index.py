import math
import random
import threading

import msgpack
import pytest

from storaged.search import FIELD_WEIGHTS, Hit, SearchIndex
from storaged.tokenize import index_terms, normalize, query_runs, stem

pytestmark = pytest.mark.timeout(60)


def make(docs):
    ix = SearchIndex()
    for doc, content, *rest in docs:
        summary = rest[0] if rest else None
        tags = rest[1] if len(rest) > 1 else ()
        ix.add(doc, content, summary, tags)
    return ix


def ids(hits):
    return [h.doc for h in hits]


# --- tokenizer ------------------------------------------------------------------------------------


def test_nfkc_and_casefold():
    assert normalize("ＡＢＣ") == "abc"
    assert index_terms("ＡＢＣ") == ["abc"]
    assert index_terms("Straße STRASSE") == ["strass", "strass"]
    assert index_terms("ｶﾀｶﾅ") == index_terms("カタカナ")  # half-width katakana folded by NFKC
    assert index_terms("１２３") == ["123"]


@pytest.mark.parametrize(
    "word,expected",
    [
        ("caresses", "caress"), ("ponies", "poni"), ("running", "run"), ("hopping", "hop"),
        ("painted", "paint"), ("painting", "paint"), ("paints", "paint"), ("relational", "relat"),
        ("happy", "happi"), ("adoption", "adopt"), ("sky", "sky"), ("agreed", "agre"),
        ("motoring", "motor"), ("filing", "file"),
        # where English Snowball (Porter2) differs from the original Porter
        ("generalizations", "general"), ("generously", "generous"), ("fairly", "fair"),
        ("dying", "die"), ("skies", "sky"), ("news", "news"), ("may", "may"), ("one", "one"),
    ],
)
def test_snowball_stemmer(word, expected):
    assert stem(word) == expected


@pytest.mark.parametrize("word", ["café", "naïve", "straße", "данные", "123", "python3", "データ"])
def test_stem_leaves_non_ascii_letter_words_alone(word):
    assert stem(word) == word


def test_word_normalisation():
    # possessives, contractions, stop words, thousands separators, ordinals
    assert index_terms("Caroline's kids' books") == ["carolin", "kid", "book"]
    assert index_terms("I'm sure it isn't the one") == ["sure", "one"]
    assert index_terms("1,000 dollars") == ["1000", "dollar"]
    assert index_terms("May 7th") == ["may", "7"]
    assert index_terms("the and of") == []


def test_letters_and_digits_indexed_whole_and_by_parts():
    assert sorted(index_terms("python3")) == ["3", "python", "python3"]
    ix = make([(1, "Python3でスクリプトを書いた"), (2, "python is fun"), (3, "v3 release")])
    assert set(ids(ix.search("python", 10))) == {1, 2}
    assert ids(ix.search("python3", 10)) == [1]


def test_cjk_bigrams_and_unigrams():
    assert index_terms("移行") == ["移行"]
    assert index_terms("データ") == ["デー", "ータ"]
    assert index_terms("猫 が") == ["猫", "が"]
    assert sorted(index_terms("DB移行はv2で")) == sorted(["db", "v2", "2", "移行", "行は", "で"])
    assert sorted(index_terms("한국어")) == sorted(["한국", "국어"])
    runs = query_runs("データベース移行 and DB")
    assert runs[0].cjk and runs[0].terms[0] == "デー" and runs[0].terms[-1] == "移行"
    assert runs[-1].terms == ("db",)


# --- matching -------------------------------------------------------------------------------------


JA = [
    (1, "本番データベースの移行を決定した"),
    (2, "昨日は京都で抹茶を飲んだ"),
    (3, "DB移行はv2で実施する予定"),
    (4, "データの整理を来週やる"),
    (5, "ベースキャンプに行った話"),
    (6, "猫が好きです"),
]


def test_japanese_without_spaces():
    ix = make(JA)
    hits = ix.search("データベース移行", 10)
    assert hits[0].doc == 1
    assert 3 in ids(hits)  # shares 移行


def test_two_character_query():
    ix = make(JA)
    assert set(ids(ix.search("移行", 10))) == {1, 3}
    assert ids(ix.search("京都", 10)) == [2]


def test_one_character_query():
    ix = make(JA + [(7, "猫")])
    assert set(ids(ix.search("猫", 10))) == {6, 7}


def test_mixed_script():
    ix = make(JA + [(8, "we use v2 now")])
    hits = ix.search("DB移行", 10)
    assert hits[0].doc == 3
    assert ids(ix.search("v2", 10))[0] in (3, 8)
    assert set(ids(ix.search("v2", 10))) == {3, 8}


def test_whole_phrase_ranks_first():
    # 4 has the phrase; 5 and 6 have only parts (and are shorter, with repeats)
    ix = make(
        [
            (4, "新しいデータベース移行ツールについての長い議論と、その他いろいろな話題の記録"),
            (5, "データベースデータベースデータベース"),
            (6, "移行移行移行"),
            (7, "データベースの移行"),
        ]
    )
    assert ids(ix.search("データベース移行", 10))[0] == 4


# --- ranking --------------------------------------------------------------------------------------


def test_ranking_more_relevant_first():
    ix = make(
        [
            (1, "We talked about the weather and lunch."),
            (2, "The database migration to Postgres is decided for Friday."),
            (3, "Postgres is nice."),
            (4, "Migration of birds in autumn."),
        ]
        + [(10 + i, f"unrelated chatter number {i} about cats") for i in range(30)]
    )
    hits = ix.search("postgres database migration", 10)
    assert hits[0].doc == 2
    assert set(ids(hits)) == {2, 3, 4}
    assert all(a.score >= b.score for a, b in zip(hits, hits[1:]))
    # rare terms weigh more than common ones
    assert ids(ix.search("cats postgres", 1)) == [3]


def test_stemmed_match():
    ix = make([(1, "She painted a sunrise"), (2, "Nothing here")])
    assert ids(ix.search("painting sunrises", 5)) == [1]


def test_fields_and_breakdown():
    ix = make(
        [
            (1, "Lunch with Ana", "Discussed the budget", ["finance"]),
            (2, "Budget review tomorrow", None, ()),
            (3, "Nothing relevant", None, ["budget"]),
        ]
    )
    hits = {h.doc: h for h in ix.search("budget", 10)}
    assert set(hits) == {1, 2, 3}
    assert hits[1].summary > 0 and hits[1].content == 0 and hits[1].tags == 0
    assert hits[2].content > 0 and hits[2].summary == 0
    assert hits[3].tags > 0 and hits[3].content == 0
    for h in hits.values():
        assert h.score == h.content + h.summary + h.tags
    assert isinstance(next(iter(hits.values())), Hit)
    assert FIELD_WEIGHTS[0] >= FIELD_WEIGHTS[1] >= FIELD_WEIGHTS[2]


def test_tiebreak_order():
    ix = make([(d, "identical text about gardening") for d in (3, 1, 2, 5, 4)])
    # no tiebreak: doc descending
    assert ids(ix.search("gardening", 10)) == [5, 4, 3, 2, 1]
    importance = {1: 90, 2: 10, 3: 90, 4: 50, 5: 10}
    hits = ix.search("gardening", 10, tiebreak=lambda d: (importance[d], d))
    assert ids(hits) == [3, 1, 4, 5, 2]
    assert ids(ix.search("gardening", 2, tiebreak=lambda d: (importance[d], d))) == [3, 1]


def test_accept_filter_called_only_on_matches():
    ix = make([(d, f"note {d} about {'cats' if d % 2 else 'dogs'}") for d in range(1, 41)])
    seen = []

    def accept(d):
        seen.append(d)
        return d % 4 == 1

    hits = ix.search("cats", 100, accept=accept)
    assert ids(hits) and all(d % 4 == 1 for d in ids(hits))
    assert set(ids(hits)) == {d for d in range(1, 41) if d % 4 == 1}
    assert all(d % 2 == 1 for d in seen)  # only docs matching the query were asked about
    assert ix.search("cats", 10, accept=lambda d: False) == []


def test_limit():
    ix = make([(d, "same words here") for d in range(1, 51)])
    assert len(ix.search("words", 7)) == 7
    assert ids(ix.search("words", 3)) == [50, 49, 48]
    assert ix.search("words", 0) == []


def test_query_without_indexable_tokens():
    ix = make([(1, "the cat")])
    assert ix.search("", 10) == []
    assert ix.search("the of and !!!", 10) == []
    assert ix.search("   ", 10) == []
    assert ix.search("zebra", 10) == []


# --- updates --------------------------------------------------------------------------------------


def test_remove_and_readd():
    ix = make([(1, "alpha beta"), (2, "alpha gamma"), (3, "delta")])
    ix.remove(2)
    ix.remove(2)  # no-op
    ix.remove(99)  # no-op
    assert ids(ix.search("alpha", 10)) == [1]
    assert ix.search("gamma", 10) == []
    assert ix.doc_count() == 2
    ix.add(2, "omega", None, ())
    assert ix.search("gamma", 10) == []
    assert ids(ix.search("omega", 10)) == [2]
    assert ix.doc_count() == 3
    with pytest.raises(ValueError):
        ix.add(2, "again", None, ())


def test_out_of_order_add_and_big_doc_ids():
    ix = SearchIndex()
    for d in (50, 3, 10**12, 7, 2**40 + 5):
        ix.add(d, f"word{d % 7} shared", None, ())
    assert sorted(ids(ix.search("shared", 10))) == sorted([50, 3, 10**12, 7, 2**40 + 5])
    ix.remove(10**12)
    assert 10**12 not in ids(ix.search("shared", 10))


def test_compaction_bounds_memory_and_keeps_results():
    rng = random.Random(3)
    words = [f"w{i}" for i in range(300)]
    texts = {d: " ".join(rng.choices(words, k=8)) for d in range(1, 3001)}
    ix = SearchIndex()
    for d, t in texts.items():
        ix.add(d, t, None, ())
    base_mem = ix.memory_bytes()
    base_postings = ix._n_postings
    # heavy update churn: re-index every doc several times; the sweeper purges dead postings
    # and slots get renumbered without any explicit call
    for _ in range(6):
        for d, t in texts.items():
            ix.remove(d)
            ix.add(d, t, None, ())
        assert ix._n_postings < base_postings * 1.3
        assert ix.memory_bytes() < base_mem * 1.4
        assert len(ix._slot_doc) <= 3 * 3000
    assert ids(ix.search("w1", 3000)) == ids(ix.search("w1", 3000))  # still consistent
    ix.compact()
    assert ix._dead == 0
    # after compaction the statistics equal those of a fresh index over the same live docs
    order = [ix._slot_doc[s] for s in range(len(ix._slot_doc))]
    fresh = SearchIndex()
    for d in order:
        fresh.add(d, texts[d], None, ())
    for q in ["w1 w2", "w17", "w200 w3 w99", "w5"]:
        assert ix.search(q, 20) == fresh.search(q, 20)


def test_removed_terms_are_freed():
    ix = SearchIndex()
    for d in range(1, 2001):
        ix.add(d, f"unique{d} common", None, ())
    for d in range(1, 2001, 2):
        ix.remove(d)
    ix.compact()
    assert "unique1" not in ix._vocab and "unique2" in ix._vocab
    ix.add(5000, "fresh unique1", None, ())
    assert ids(ix.search("unique1", 5)) == [5000]


# --- snapshot, memory -----------------------------------------------------------------------------


def corpus(n, seed=1):
    rng = random.Random(seed)
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi".split()
    ja = ["データベース", "移行", "京都", "旅行", "猫", "会議", "予定"]
    docs = []
    for d in range(1, n + 1):
        content = " ".join(rng.choices(words, k=rng.randint(2, 12))) + "".join(rng.choices(ja, k=2))
        summary = " ".join(rng.choices(words, k=3)) if rng.random() < 0.3 else None
        tags = rng.sample(["work", "home", "idea"], rng.randint(0, 2))
        docs.append((d, content, summary, tags))
    return docs


QUERIES = ["alpha", "beta gamma", "zeta kappa mu", "データベース移行", "京都", "猫", "work", "idea alpha"]


def test_dump_load_round_trip_identical():
    ix = make(corpus(600))
    for d in range(5, 600, 7):
        ix.remove(d)
    ix.add(5, "alpha readded 京都旅行", None, ["work"])
    ix.add(10**12, "alpha far away", None, ())
    blob = msgpack.packb(ix.dump())
    back = SearchIndex.load(msgpack.unpackb(blob))
    assert back.doc_count() == ix.doc_count()
    for q in QUERIES:
        for limit in (1, 10, 100):
            assert back.search(q, limit) == ix.search(q, limit)
    assert back.search("alpha", 50, accept=lambda d: d % 3 == 0) == ix.search(
        "alpha", 50, accept=lambda d: d % 3 == 0
    )
    # the loaded index keeps working as a writable index
    back.add(10_000, "brand new xylophone", None, ())
    back.remove(1)
    back.remove(10**12)
    assert ids(back.search("xylophone", 5)) == [10_000]
    assert ids(ix.search("far", 5)) == [10**12] and back.search("far", 5) == []
    assert 1 not in ids(back.search("alpha", 1000))


def test_load_rejects_garbage():
    with pytest.raises(ValueError):
        SearchIndex.load({"format": "nope"})
    with pytest.raises(ValueError):
        SearchIndex.load(b"xx")


def test_empty_index():
    ix = SearchIndex()
    assert ix.search("anything", 10) == []
    back = SearchIndex.load(msgpack.unpackb(msgpack.packb(ix.dump())))
    assert back.doc_count() == 0 and back.search("anything", 10) == []


def test_memory_bytes_grows_with_docs():
    ix = SearchIndex()
    m0 = ix.memory_bytes()
    docs = corpus(2000)
    for d in docs[:200]:
        ix.add(*d)
    m1 = ix.memory_bytes()
    for d in docs[200:]:
        ix.add(*d)
    m2 = ix.memory_bytes()
    assert m0 < m1 < m2
    assert m2 - m1 > 2 * (m1 - m0)  # 9x the docs, same small vocabulary
    assert m2 < 2000 * 1000


# --- exactness of the pruned top-k against a brute-force scan ---------------------------------------


def brute(ix, q, limit, accept=None):
    lists = ix._query_lists(q)
    out = []
    for s in range(len(ix._slot_doc)):
        if not ix._alive[s]:
            continue
        d = ix._slot_doc[s]
        if accept and not accept(d):
            continue
        fs = [0.0, 0.0, 0.0]
        for tl in lists:
            fs[tl.field] += tl.value(s)
        if any(fs):
            out.append((fs[0] + fs[1] + fs[2], d))
    out.sort(reverse=True)
    return out[:limit]


def test_pruned_search_equals_brute_force():
    rng = random.Random(11)
    vocab = [f"t{i}" for i in range(400)]
    weights = [1 / (i + 1) for i in range(400)]  # Zipf-like: long and short lists
    ix = SearchIndex()
    for d in range(1, 4001):
        ix.add(d, " ".join(rng.choices(vocab, weights, k=rng.randint(3, 30))), None, ())
    for d in rng.sample(range(1, 4001), 300):
        ix.remove(d)
    for _ in range(60):
        q = " ".join(rng.choices(vocab, weights, k=rng.randint(1, 6)))
        for limit, accept in ((1, None), (10, None), (10, lambda d: d % 5 == 0)):
            got = [(round(h.score, 9), h.doc) for h in ix.search(q, limit, accept=accept)]
            want = [(round(s, 9), d) for s, d in brute(ix, q, limit, accept)]
            assert got == want, q


def test_bm25_value_matches_formula():
    ix = make([(1, "apple banana"), (2, "apple"), (3, "cherry")])
    h = {x.doc: x for x in ix.search("banana", 5)}
    n, df = 3, 1
    idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
    from storaged.search import B, K1

    avg = 4 / 3
    expect = idf * (K1 + 1) / (1 + K1 * (1 - B + B * 2 / avg))
    assert abs(h[1].content - expect) < 0.01 * expect  # avgdl quantised to 1/64 octave


def test_rebuild_in_other_thread_while_querying():
    old = make(corpus(300))
    result = {}

    def build():
        new = SearchIndex()
        for d in corpus(3000, seed=2):
            new.add(*d)
        result["new"] = new

    t = threading.Thread(target=build)
    t.start()
    while t.is_alive():
        assert old.search("alpha beta", 5)
    t.join()
    assert result["new"].doc_count() == 3000


def test_pruned_search_equals_brute_force_cjk_and_long_tf():
    rng = random.Random(12)
    chars = "データベース移行猫京都旅会議予定のはをにが"
    ix = SearchIndex()
    for d in range(1, 2001):
        text = "".join(rng.choices(chars, k=rng.randint(2, 25)))
        if d % 50 == 0:
            text += " spam" * 40  # tf beyond the exact tf buckets
        ix.add(d, text, "".join(rng.choices(chars, k=5)) if d % 3 == 0 else None, ["京都"] if d % 7 == 0 else ())
    for d in rng.sample(range(1, 2001), 150):
        ix.remove(d)
    queries = ["spam", "spam 猫", "データベース移行"] + [
        "".join(rng.choices(chars, k=rng.randint(1, 6))) for _ in range(40)
    ]
    for q in queries:
        for limit, accept in ((1, None), (10, None), (10, lambda d: d % 4 == 0)):
            got = [(round(h.score, 9), h.doc) for h in ix.search(q, limit, accept=accept)]
            want = [(round(s, 9), d) for s, d in brute(ix, q, limit, accept)]
            assert got == want, q
    top = ix.search("spam", 3)
    assert top and all(h.doc % 50 == 0 for h in top)


@pytest.mark.parametrize("n,searched", [(21, True), (21, False), (3000, True)])
def test_memory_bytes_matches_what_is_allocated(n, searched):
    """get_system_health's search_index_bytes is what the index really holds: within a factor of what
    tracemalloc sees it allocate (the tokenizer's caches warmed first, so they are not counted). A small
    store's figure is dominated by the impact tables built at the first search (~0.5 MiB a field)."""
    import gc
    import tracemalloc

    docs = corpus(n)
    warm = SearchIndex()
    for d in docs:
        warm.add(*d)
    del warm
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        ix = SearchIndex()
        for d in docs:
            ix.add(*d)
        if searched:
            ix.search("alpha 猫", 10)
        gc.collect()
        real = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert 0.6 * real <= ix.memory_bytes() <= 1.6 * real, (ix.memory_bytes(), real)


def test_one_character_expansions_share_one_budget_per_query(monkeypatch):
    """A one-character CJK run reads the postings of every bigram holding that character. The
    read was budgeted per character (and per field), so a query of many single characters
    multiplied it (issue 12, 4c); now all of a query's one-character runs share one budget."""
    from storaged import search as S

    chars = "日本語学校先生電車時間天気"
    rng = random.Random(3)
    ix = SearchIndex()
    for d in range(600):
        ix.add(d, "".join(rng.choice(chars) for _ in range(12)), None, ())
    monkeypatch.setattr(S, "_CHAR_EXPANSION_BUDGET", 500)
    query = " ".join(chars)  # thirteen one-character runs
    expanded = [tl for tl in ix._query_lists(query) if isinstance(tl, S._MaterialList)]
    biggest = max(len(p) for p in ix._slots[0] if p is not None and type(p) is not int)
    assert expanded  # the expansion still happens
    assert sum(tl.size for tl in expanded) <= 500 + biggest
    assert ix.search(query, 5)  # and the query still answers


# --- QueryScores: own scores of docs a search did not return (the context stage's neighbours) --------


def brute_fields(ix, q):
    lists = ix._query_lists(q)
    out = {}
    for s in range(len(ix._slot_doc)):
        if ix._alive[s]:
            fs = [0.0, 0.0, 0.0]
            for tl in lists:
                fs[tl.field] += tl.value(s)
            if any(fs):
                out[ix._slot_doc[s]] = tuple(fs)
    return out


@pytest.mark.parametrize("kernel", ["arrays", "maxscore"])
def test_query_scores_equal_brute_force_scanned_or_not(kernel, monkeypatch):
    # Zipf-like terms: under MaxScore most queries stop scanning early, so the scorer must add the
    # unscanned lists by merging; docs arrive in runs (sessions) and some are removed or re-added.
    # These queries are within the array kernel's budget: lowered to 0, MaxScore scores them.
    from storaged import search as search_mod

    if kernel == "maxscore":
        monkeypatch.setattr(search_mod, "_ARRAY_POSTINGS", 0)
    rng = random.Random(5)
    vocab = [f"t{i}" for i in range(300)]
    weights = [1 / (i + 1) for i in range(300)]
    ix = SearchIndex()
    for d in range(1, 3001):
        ix.add(d, " ".join(rng.choices(vocab, weights, k=rng.randint(3, 20))),
               " ".join(rng.choices(vocab, weights, k=3)) if d % 7 == 0 else None, ("t5",) if d % 11 == 0 else ())
    for d in rng.sample(range(1, 3001), 200):
        ix.remove(d)
    for d in rng.sample(range(1, 3001), 100):
        ix.remove(d)
        ix.add(d, " ".join(rng.choices(vocab, weights, k=8)), None, ())
    partial = 0
    for _ in range(40):
        q = " ".join(rng.choices(vocab, weights, k=rng.randint(1, 6)))
        hits, scorer = ix.search_scored(q, 20)
        partial += bool(scorer._rest)
        want = brute_fields(ix, q)
        runs = [range(c - 4, c + 5) for c in rng.sample(range(1, 3001), 30)]
        docs = {d for r in runs for d in r} | {0, 5000, -3}  # unknown docs score nothing
        got = scorer.totals(docs)
        assert set(got) == {d for d in docs if d in want}, q
        for d, v in got.items():
            assert v == pytest.approx(sum(want[d]), rel=1e-9), (q, d)
        fields = scorer.fields(docs)
        assert set(fields) == set(got)
        for d, fs in fields.items():
            assert fs == pytest.approx(want[d], rel=1e-12)
        for h in hits:  # a hit's numbers are the scorer's numbers
            assert (h.content, h.summary, h.tags) == scorer.fields([h.doc])[h.doc]
    if kernel == "maxscore":
        assert partial >= 10  # the merge path was exercised
    else:
        assert partial == 0  # every list summed at once


def test_query_scores_of_a_scanned_query_touch_no_posting_list(monkeypatch):
    # a query scanned whole: the docs' scores come from the search's accumulator alone
    ix = make([(d, f"alpha beta filler{d % 13}") for d in range(1, 500)])
    hits, scorer = ix.search_scored("alpha beta", 5)
    assert not scorer._rest
    from storaged import search as search_mod

    def no(*a):
        raise AssertionError("a posting list was read")

    for name in ("probe", "value", "merge_into"):
        monkeypatch.setattr(search_mod._TermList, name, no)
    assert scorer.totals(range(1, 500)).keys() == set(range(1, 500))


# --- sub-word / prefix matches ------------------------------------------------------------------------


def letters(n: int) -> str:
    """n spelled in letters (a word, not a code): 0 → "a", 27 → "bb"."""
    out = ""
    while True:
        out = chr(97 + n % 26) + out
        n //= 26
        if not n:
            return out


@pytest.mark.parametrize("query", ["postgres", "Postgre", "ｐｏｓｔｇｒｅｓ"])
def test_prefix_of_a_longer_word_finds_it_below_an_exact_match(query):
    ix = make([
        (1, "we moved the orders database to PostgreSQL last week"),
        (2, "postgres is what the team calls it"),
        (3, "nothing relevant here"),
    ])
    assert ids(ix.search("PostgreSQL", 5)) == [1]
    hits = ix.search(query, 5)
    assert ids(hits) == [2, 1]  # the exact word first, the longer word found through its prefix
    assert hits[1].score < 0.5 * hits[0].score and hits[1].content > 0


def test_prefix_needs_a_long_alphabetic_word():
    ix = make([(1, "PostgreSQL tuning"), (2, "invoice inv20231 paid")])
    assert ix.search("post", 5) == []  # shorter than the minimum: no expansion
    assert ix.search("inv2023", 5) == []  # codes match whole, not by prefix


def test_prefix_vocabulary_follows_add_remove_compact_and_load():
    ix = make([(d, f"filler text number{d}") for d in range(1, 50)])
    assert ix.search("postgres", 5) == []  # builds the prefix vocabulary
    assert ix._prefix is not None
    ix.add(100, "PostgreSQL replication", None, ())  # a term new since the build
    assert ids(ix.search("postgres", 5)) == [100]
    for d in range(200, 1500):  # enough new terms to merge the side list into the main one
        ix.add(d, f"brandnew{letters(d)}", None, ())
    assert len(ix._prefix.side) < 1300
    assert ids(ix.search("postgres", 5)) == [100]
    assert ids(ix.search(f"brandnew{letters(1400)[:-1]}", 30))[:1] in ([d] for d in range(200, 1500)
                                                                    if letters(d).startswith(letters(1400)[:-1]))
    ix.remove(100)  # its terms are freed: never expanded to again
    assert ix.search("postgres", 5) == []
    ix.add(101, "PostgreSQL again", None, ())
    assert ids(ix.search("postgres", 5)) == [101]
    ix.compact()
    assert ids(ix.search("postgres", 5)) == [101]
    back = SearchIndex.load(msgpack.unpackb(msgpack.packb(ix.dump())))
    assert back._prefix is None  # not saved: rebuilt on the first query that needs it
    before = back.memory_bytes()
    assert back.search("postgres", 5) == ix.search("postgres", 5)
    assert back.memory_bytes() > before  # the prefix list is counted


def test_prefix_vocabulary_is_built_in_bounded_steps_off_the_query_path(monkeypatch):
    # a large vocabulary is never sorted on one query: each query sorts at most one step of terms
    # and, until the last step, runs without prefix expansion (exact words still match)
    from storaged import search as search_mod

    monkeypatch.setattr(search_mod, "_PREFIX_BUILD_STEP", 16)
    ix = make([(d, f"filler{letters(d)}word number{d}") for d in range(1, 100)]
              + [(100, "we moved to PostgreSQL"), (101, "postgres it is")])
    steps = -(-len(ix._terms) // 16)
    real = search_mod._PrefixVocab.build_step
    looked = []

    def counting(self, budget=None):
        before = self._pos
        done = real(self, budget)
        looked.append(self._pos - before)
        return done

    monkeypatch.setattr(search_mod._PrefixVocab, "build_step", counting)
    for _ in range(steps - 1):
        assert ids(ix.search("postgres", 5)) == [101]  # the exact word only: the build is under way
    assert max(looked) <= 16 and not ix._prefix.ready
    assert ids(ix.search("postgres", 5)) == [101, 100]  # the last step: expansion from now on
    assert ix._prefix.ready and len(ix._prefix.runs) > 1
    ix.add(102, "PostgreSQLish", None, ())  # new terms join at once, no build
    assert ids(ix.search("postgres", 5))[:1] == [101] and 102 in ids(ix.search("postgres", 5))

    # freed terms past a quarter of the list: a rebuild runs in steps while the old list serves
    for d in range(1, 100):
        ix.remove(d)
    ix._prefix.stale += 4096
    n_looked = len(looked)
    assert sorted(ids(ix.search("postgres", 5))) == [100, 101, 102]
    assert ix._prefix_next is not None and len(looked) == n_looked + 1
    for _ in range(steps):
        assert sorted(ids(ix.search("postgres", 5))) == [100, 101, 102]
    assert ix._prefix_next is None and ix._prefix.stale == 0


def test_prefix_expansion_work_is_bounded_per_query():
    # many words, each the prefix of many terms: the vocabulary terms looked at stay within the budget
    from storaged import search as search_mod

    ix = make([(d, " ".join(f"prefixword{letters(d)}x{letters(k)}" for k in range(30))) for d in range(1, 200)])
    seen = []
    real = search_mod._expansions

    def counting(prefix, readers, budget, dfs=None):
        before = budget[0]
        out = real(prefix, readers, budget, dfs)
        seen.append(before - budget[0])
        return out

    search_mod._expansions = counting
    try:
        hits = ix.search(" ".join(f"prefixword{letters(d)}" for d in range(1, 200)), 5)
    finally:
        search_mod._expansions = real
    assert sum(seen) <= search_mod._PREFIX_QUERY_BUDGET
    assert hits


def test_idle_steps_build_the_prefix_vocabulary_before_any_query(monkeypatch):
    from storaged import search as search_mod

    monkeypatch.setattr(search_mod, "_PREFIX_BUILD_STEP", 16)
    assert not search_mod.SearchIndex().idle_step()  # nothing to build in an empty index
    ix = make([(d, f"filler{letters(d)}word number{d}") for d in range(1, 100)]
              + [(100, "we moved to PostgreSQL"), (101, "postgres it is")])
    steps = 0
    while ix.idle_step():
        steps += 1
        assert steps <= len(ix._terms) // 16 + 1
    assert ix._prefix.ready and steps > 1
    assert ids(ix.search("postgres", 5)) == [101, 100]  # the first query expands already
    assert not ix.idle_step()


def test_a_tiebreak_that_gives_its_first_item_in_c_orders_many_tied_docs_as_one_that_does_not(monkeypatch):
    # agent history repeats itself: a pool may hold hundreds of docs tied at its cut, and the tiebreak's
    # first item (a time, an importance) for all of them at once (SearchIndex._tied_first) leaves the
    # Python tiebreak to the few that can make the page: the same page as asking it of every doc
    import numpy as np
    ix = SearchIndex()
    rng = random.Random(9)
    for d in range(1, 700):
        ix.add(d, ["disk full error", "disk full error again", "error"][d % 3], None, ())
    ts = {d: rng.randrange(40) for d in range(1, 700)}  # many equal first items too

    def plain(d):
        return ts[d], -d

    def fast(d):
        return ts[d], -d
    fast.first = lambda docs: np.array([ts[int(d)] for d in docs], np.int64)
    used = []
    real = SearchIndex._tied_first
    monkeypatch.setattr(SearchIndex, "_tied_first", staticmethod(lambda *a: used.append(1) or real(*a)))
    for q in ("disk", "error again", "full error", "error"):
        for limit in (1, 5, 40, 300):
            assert ix.search_own(q, limit, tiebreak=fast)[0] == ix.search_own(q, limit, tiebreak=plain)[0], (q, limit)
    assert used
