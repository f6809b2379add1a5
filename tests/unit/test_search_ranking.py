"""The ranking stages around the BM25 core (storaged/rank.py): conversation context, Japanese
phrases, and what search_messages shows of them.  Rankings are checked deterministically; work is
counted (docs looked at), never timed."""
from __future__ import annotations

import pytest

from tests.support.faultio import search, update, write
from storaged import rank
from storaged.rank import ranked_search
from storaged.search import SearchIndex


def sessions_index(sessions: list[list[str]]):
    """An index over consecutive docs 1.., with neighbours() confined to each session (as the store's
    Session.seqs), and a counter of the docs neighbours() was asked about."""
    ix = SearchIndex()
    sess_of, texts = {}, {}
    doc = 0
    for si, msgs in enumerate(sessions):
        for text in msgs:
            doc += 1
            ix.add(doc, text, None, ())
            sess_of[doc], texts[doc] = si, text
    asked: list[int] = []

    def neighbours(d: int, r: int):
        asked.append(d)
        before = [d - k for k in range(1, r + 1) if sess_of.get(d - k) == sess_of[d]]
        after = [d + k for k in range(1, r + 1) if sess_of.get(d + k) == sess_of[d]]
        return before, after

    return ix, neighbours, texts, asked


def ids(hits):
    return [h.doc for h in hits]


def test_reply_found_through_the_turn_before_it():
    ix, nb, _, _ = sessions_index([
        ["how often did you go hiking in the alps", "yes, twice last month", "what did you eat"],
        ["I sold my car", "the weather was fine"],
    ])
    assert 2 not in ids(ix.search("hiking alps", 10))  # the core alone cannot find the reply
    hits = {h.doc: h for h in ranked_search(ix, "hiking alps", 10, neighbours=nb)}
    assert ids(ranked_search(ix, "hiking alps", 2, neighbours=nb)) == [1, 2]
    reply = hits[2]
    assert reply.content == reply.summary == reply.tags == 0.0
    assert reply.context == pytest.approx(rank.CONTEXT_WEIGHTS[0] * hits[1].score)
    # ±2 counts less than ±1; the other session's docs get nothing
    assert hits[3].context == pytest.approx(rank.CONTEXT_WEIGHTS[1] * hits[1].score)
    assert 4 not in hits and 5 not in hits


def test_context_breaks_ties_between_equal_own_scores():
    ix, nb, _, _ = sessions_index([
        ["filler one", "my sister plays the violin", "she practises violin daily"],
        ["filler two", "my sister plays the violin", "the train was late"],
    ])
    core = ix.search("sister violin", 10)
    assert core[0].score == pytest.approx(next(h for h in core if h.doc == 5).score)
    assert ids(ranked_search(ix, "sister violin", 10, neighbours=nb))[0] == 2


def test_the_better_neighbour_counts_not_both():
    # the message between two matching turns gets the better one's share, not their sum, so it does not
    # outrank the turns themselves
    ix, nb, _, _ = sessions_index([["paris trip photos", "ok", "paris trip plans"]])
    hits = {h.doc: h for h in ranked_search(ix, "paris trip", 10, neighbours=nb)}
    best = max(hits[1].score - hits[1].context, hits[3].score - hits[3].context)
    assert hits[2].context == pytest.approx(rank.CONTEXT_WEIGHTS[0] * best)
    assert hits[2].score < min(hits[1].score, hits[3].score)


def test_filters_apply_to_what_is_returned_not_to_context():
    ix, nb, _, _ = sessions_index([["quantum computing lecture", "it was great", "lunch after"]])
    hits = ranked_search(ix, "quantum lecture", 10, accept=lambda d: d != 1, neighbours=nb)
    assert ids(hits) == [2, 3]  # 1 is filtered out, yet its score still lifts 2 and 3
    assert hits[0].context > 0
    assert ranked_search(ix, "quantum lecture", 10, accept=lambda d: False, neighbours=nb) == []


def test_own_match_only_reorders():
    ix, nb, _, _ = sessions_index([["deploy nginx config", "done", "nginx restarted"]])
    assert set(ids(ranked_search(ix, "nginx", 10, neighbours=nb, own_match=True))) == {1, 3}
    assert 2 in ids(ranked_search(ix, "nginx", 10, neighbours=nb))


def test_context_looks_only_near_candidates():
    # one long session: the query matches two messages; context must not walk the session
    msgs = [f"routine status line number {i}" for i in range(3000)]
    msgs[1500] = "the zeppelin landed"
    msgs[2500] = "a zeppelin again"
    ix, nb, _, asked = sessions_index([msgs])
    hits = ranked_search(ix, "zeppelin", 10, neighbours=nb)
    assert set(ids(hits)[:2]) == {1501, 2501}
    assert set(ids(hits)) == {1499, 1500, 1501, 1502, 1503, 2499, 2500, 2501, 2502, 2503}
    # one window per candidate, nothing else: neighbours() is asked about the two matches only
    assert sorted(asked) == [1501, 2501]


def test_context_equals_the_formula_on_random_sessions():
    # final(m) = own(m) + sum_k w_k * max(own(m-k), own(m+k)) within the session, for every doc within
    # R places of the core's pool: the windowed, batched computation must give exactly that
    import random

    rng = random.Random(3)
    vocab = [f"w{i}" for i in range(60)]
    sessions = [[" ".join(rng.choices(vocab, k=rng.randint(1, 6))) for _ in range(rng.randint(1, 12))]
                for _ in range(120)]
    ix, nb, _, _ = sessions_index(sessions)
    sess = {}
    doc = 0
    for si, msgs in enumerate(sessions):
        for _ in msgs:
            doc += 1
            sess[doc] = si
    r = len(rank.CONTEXT_WEIGHTS)
    for _ in range(30):
        q = " ".join(rng.choices(vocab, k=rng.randint(1, 3)))
        for limit in (5, 20):
            own = {h.doc: h.score for h in ix.search(q, doc)}
            pool = [h.doc for h in ix.search(q, max(rank.POOL_MIN, rank.POOL_FACTOR * limit))]
            near = {e for d in pool for e in range(d - r, d + r + 1) if sess.get(e) == sess[d]}

            def o(e, si):
                return own.get(e, 0.0) if sess.get(e) == si else 0.0

            final = {e: own.get(e, 0.0) + sum(w * max(o(e - k, sess[e]), o(e + k, sess[e]))
                                              for k, w in enumerate(rank.CONTEXT_WEIGHTS, 1)) for e in near}
            want = sorted((v for v in final.values() if v > 0), reverse=True)[:limit]
            got = ranked_search(ix, q, limit, neighbours=nb)
            assert [h.score for h in got] == pytest.approx(want, rel=1e-9), q
            for h in got:
                assert h.score == pytest.approx(final[h.doc], rel=1e-9)
                assert h.content == pytest.approx(own.get(h.doc, 0.0), rel=1e-9)
                assert h.context == pytest.approx(final[h.doc] - own.get(h.doc, 0.0), rel=1e-9, abs=1e-12)


def test_no_neighbours_no_context():
    ix, _, _, _ = sessions_index([["apple pie recipe", "thanks"]])
    hits = ranked_search(ix, "apple", 10)
    assert ids(hits) == [1] and hits[0].context == 0.0
    assert hits[0].score == pytest.approx(ix.search("apple", 1)[0].score)


# --- Japanese phrases --------------------------------------------------------------------------

JA = [
    "この前は本当にありがとう",            # 1 the phrase
    "質問があります",                     # 2 shares only あり
    "ありがたいけど、がとうとう来た",        # 3 holds あり, りが? no; scattered pieces
    "とうとう雨があります",                # 4 shares あり and とう
    "ありがとうございました、助かりました",   # 5 the phrase
    "ありがありがとう",                    # 6 the phrase after a repeat
]


@pytest.mark.parametrize("radius", [0, 2])
def test_contiguous_phrase_ranks_above_shared_bigrams(radius):
    ix, nb, texts, _ = sessions_index([[t] for t in JA])  # one message a session: no context
    hits = ranked_search(ix, "ありがとう", 10, neighbours=nb if radius else None, text_of=texts.__getitem__)
    top = ids(hits)
    assert set(top[:3]) == {1, 5, 6}
    # the phrase's holders are far above those sharing bigrams, not merely near them
    others = [h.score for h in hits if h.doc not in (1, 5, 6)]
    assert min(h.score for h in hits[:3]) > 2 * max(others)


def test_scattered_bigrams_rank_below_the_phrase():
    # doc 2 holds every bigram of 会議室予約 (会議 議室 室予 予約) but not as one run
    texts = {1: "会議室予約を済ませた", 2: "会議の議室は室予定の予約"}
    ix = SearchIndex()
    for d, t in texts.items():
        ix.add(d, t, None, ())
    hits = ranked_search(ix, "会議室予約", 10, text_of=texts.__getitem__)
    assert ids(hits) == [1, 2] and hits[0].score > 1.5 * hits[1].score


# --- search_messages: what the contract shows ----------------------------------------------------

def test_search_messages_shows_the_context_share(store):
    q = write(store, "s1", "did you go to the pottery class", importance=10)["message"]
    a = write(store, "s1", "yes, twice last month", importance=10)["message"]
    write(store, "s2", "I like pottery", importance=10)
    res = search(store, query="pottery class")["results"]
    by_id = {r["message_id"]: r for r in res}
    assert res[0]["message_id"] == q["message_id"]
    for r in res:
        b = r["score_breakdown"]
        assert set(b) == {"content", "summary", "tags", "context"}
        assert r["score"] == pytest.approx(sum(b.values()), abs=1e-5)
        assert r["matched_fields"] == [f for f in ("content", "summary", "tags", "context") if b[f] > 0]
    reply = by_id[a["message_id"]]
    assert reply["matched_fields"] == ["context"] and reply["score_breakdown"]["content"] == 0
    assert by_id[q["message_id"]]["matched_fields"] == ["content"]  # its neighbour matches nothing
    # filters still decide what is returned
    assert search(store, query="pottery class", min_importance=50)["results"] == []
    assert {r["message_id"] for r in search(store, query="pottery class", session_id="s2")["results"]} <= \
        {m for m in by_id if m not in (q["message_id"], a["message_id"])}
    update(store, q["message_id"], content="nothing relevant")
    assert search(store, query="pottery class", session_id="s1")["results"] == []


def test_search_messages_finds_a_word_by_its_prefix(store):
    m = write(store, "s1", "we moved the orders database to PostgreSQL", importance=10)["message"]
    write(store, "s2", "the weather was fine", importance=10)
    for q in ("postgres", "Postgre", "ｐｏｓｔｇｒｅｓ"):
        res = search(store, query=q)["results"]
        assert [r["message_id"] for r in res] == [m["message_id"]], q
        assert res[0]["matched_fields"] == ["content"]
