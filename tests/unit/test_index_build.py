"""The search index a fixed, varied corpus builds, pinned by a digest: a change meant to make indexing
faster (a tokenizer, the posting loop) must not move a term, a posting, a key or a term id (the order of
a text's terms decides the ids of new terms). The corpus mixes English, Japanese, numbers, words mixing
letters and digits, clitics, tags, summaries, empty fields, repeats, updates and deletes.
"""
import hashlib
import random

import pytest

from storaged.search import SearchIndex

pytestmark = pytest.mark.timeout(120)

_WORDS = ("the", "caroline's", "don't", "isn't", "we'll", "it’s", "kids'", "running", "databases", "migration",
          "python3", "iphone15", "v2", "7th", "21st", "1,000", "12,345th", "3.5", "a1b2c3", "deadbeef42",
          "53cc6b95c68958364f73ab1c860c7b68dfb68a5f", "2025-01-01T00:01:23.342Z", "under_score", "x'y'z",
          "a''b", "'tis", "ＡＢＣ", "Straße", "café", "naïve", "данные", "1٣", "x²", "½", "ﬁne", "", "5’6",
          "データベース移行", "本番データベースの移行を決定した", "猫", "が", "한국어", "DB移行はv2で", "ｶﾀｶﾅ", "々",
          "I'm", "o'clock", "rock'n'roll", "'''", "ok.", "(id=263626)", "[ 51%]", "e.g.", "U.S.A", "--flag")


def _text(rnd: random.Random, n: int) -> str:
    seps = (" ", " ", " ", "\n", ", ", ". ", "/", "-", "'", "’", "_", ":", "")
    return "".join(rnd.choice(_WORDS) + rnd.choice(seps) for _ in range(n))


def _texts(seed: int, count: int) -> list[str]:
    rnd = random.Random(seed)
    return [_text(rnd, rnd.choice((0, 1, 3, 12, 40, 200))) for _ in range(count)]


def _digest(ix: SearchIndex) -> str:
    """Every list of the index by term (ids, postings, keys, max tf), the field lengths and counts."""
    h = hashlib.sha256()
    for tid, term in enumerate(ix._terms):
        h.update(repr((tid, term)).encode())
        for f in range(3):
            p, k = ix._slots[f][tid], ix._keys[f][tid]
            h.update(repr((f, p if p is None or type(p) is int else list(p),
                           k if k is None or type(k) is int else list(k), ix._maxtf[f][tid])).encode())
    h.update(repr(([list(lens) for lens in ix._lens], ix._total_len, ix._nonempty, ix._maxtf_all, ix._n_postings,
                   ix._n_single, ix._n_arrays, ix._free_tids, list(ix._vocab), ix._term_bytes)).encode())
    return h.hexdigest()


def _build() -> SearchIndex:
    rnd = random.Random(3)
    texts = _texts(4, 3000)
    ix = SearchIndex()
    doc = 0
    live: list[int] = []
    for i, content in enumerate(texts):
        summary = _text(rnd, 3) if i % 5 == 0 else ("" if i % 7 == 0 else None)
        tags = [rnd.choice(_WORDS) for _ in range(i % 4)]
        ix.add(doc, content, summary, tags)
        live.append(doc)
        doc += 1
        if i % 3 == 2:  # an update: the old doc goes, its new revision comes
            old = live.pop(rnd.randrange(len(live)))
            ix.remove(old)
            ix.add(doc, _text(rnd, 10), None, ())
            live.append(doc)
            doc += 1
        if i % 11 == 0 and live:  # a delete (the sweeper frees terms, whose ids are used again)
            ix.remove(live.pop(rnd.randrange(len(live))))
    return ix


# The digest of _build()'s index as commit 2e8d5fd built it. A deliberate change of the terms changes it:
# then check recall (python -m bench.search_quality) and put the new digest here.
_DIGEST_BEFORE = "6484592ebe28f40d45d10bed575b4921e1a0bc650d3e3d162637521e6d3ef8a0"


def test_index_is_the_one_the_earlier_release_built():
    ix = _build()
    assert ix._free_tids or ix._dead, "the corpus must exercise deletes"
    assert _digest(ix) == _DIGEST_BEFORE
    hits = ix.search("databases migration python", 5)
    assert hits and all(h.score > 0 for h in hits)
