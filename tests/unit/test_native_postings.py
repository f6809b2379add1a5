"""The search index's posting appends in C (storaged/postings.c) build the very lists the Python
definition (``SearchIndex._post_python``) builds: the same term ids in the same order, the same slots,
keys, tf maxima, lengths and counters, over texts that take every branch (ASCII words through the term
cache, apostrophes, ordinals, thousands, words mixing letters and digits, CJK and other non-ASCII text,
stop words only, a term past the exact tf range, a doc past the exact length range), with docs removed
between (the sweeper frees term ids that new terms take again) and with the term cache emptied under
it.  The suite requires the extension: CI installs with a compiler (pyproject.toml)."""
from __future__ import annotations

import random

import pytest

from storaged import search as S
from storaged import tokenize as T

pytestmark = pytest.mark.unit


def test_the_extension_is_built_and_used():
    import convmem_postings  # noqa: F401  (fails the suite where the install built no extension)

    assert S._native_post is not None


_WORDS = ["run", "running", "runs", "house", "houses", "the", "and", "don't", "it's", "o'neil", "a'b'c",
          "python3", "iphone15", "x86_64", "7th", "21st", "1,000", "12,345,678", "3.5", "v2.1.0", "e4f9a0c2",
          "ERROR", "Error:", "/usr/lib/python3.11", "snake_case", "CamelCase", "'quoted'", "''", "naïve",
          "café", "Straße", "ＡＢＣ", "１２３", "データベース", "移行", "本番", "京", "한국어", "ー", "ı", "İstanbul"]


def _texts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    out = ["", " ", "the and of", "京", "don't stop", "word " * 40 + "other", "x " * 1500,
           " ".join(f"w{i}" for i in range(1200)), "1,000 7th python3 iphone15 snake_case x86_64"]
    for _ in range(n):
        k = rng.choice((1, 3, 12, 60, 300))
        words = [rng.choice(_WORDS) if rng.random() < 0.7 else f"tok{rng.randrange(5000)}" for _ in range(k)]
        out.append(rng.choice((" ", "\n", ", ", "; ")).join(words))
    return out


_APOSTROPHES = ["don't 'quoted' a''b x'y it's o'neil' ''' ' a'", "a'1 1'a 1'1 '1 1' x'''y z'9'q"]


def _ascii_texts(n: int, seed: int) -> list[str]:
    """Random ASCII texts of word characters, apostrophes, digits, upper case and cuts."""
    rng = random.Random(seed)
    alphabet = "abcxyz0129 ''_-.,:;/\\\"\t\n()ABC"
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40))) for _ in range(n)]


def _state(ix: S.SearchIndex) -> dict:
    return {
        "vocab": dict(ix._vocab), "terms": list(ix._terms), "free": list(ix._free_tids),
        "slots": [[p if p is None or type(p) is int else p.tolist() for p in f] for f in ix._slots],
        "keys": [[p if p is None or type(p) is int else p.tolist() for p in f] for f in ix._keys],
        "maxtf": [bytes(m) for m in ix._maxtf], "maxtf_all": list(ix._maxtf_all),
        "lens": [a.tolist() for a in ix._lens], "total": list(ix._total_len), "nonempty": list(ix._nonempty),
        "counters": (ix._n_postings, ix._n_single, ix._n_arrays, ix._term_bytes, ix._live, ix._dead),
    }


def _build(texts: list[str], native: bool, monkeypatch, removes: int = 0, seed: int = 0) -> dict:
    with monkeypatch.context() as m:
        if not native:
            m.setattr(S, "_native_post", None)
        ix = S.SearchIndex()
        rng = random.Random(seed)
        for doc, text in enumerate(texts):
            tags = [w for w in text.split()[:3]] if doc % 3 == 0 else []
            ix.add(doc, text, text[:40] if doc % 2 else None, tags)
            for _ in range(removes):
                if doc and rng.random() < 0.3:
                    ix.remove(rng.randrange(doc))
        return _state(ix)


@pytest.mark.parametrize("seed", [1, 2])
def test_the_native_lists_are_the_python_ones(monkeypatch, seed):
    texts = _texts(600, seed)
    assert _build(texts, True, monkeypatch) == _build(texts, False, monkeypatch)


def test_with_docs_removed_and_term_ids_freed_and_taken_again(monkeypatch):
    monkeypatch.setattr(S, "_SWEEP_MIN_DEAD", 4)
    texts = _texts(800, 3)
    native = _build(texts, True, monkeypatch, removes=2, seed=5)
    assert native == _build(texts, False, monkeypatch, removes=2, seed=5)
    assert native["counters"][5] > 0


@pytest.fixture
def small_word_caches(monkeypatch):
    """The tokenizer's term cache and the native builder's word cache both bounded at 16 words, so
    that both are emptied again and again under the build."""
    monkeypatch.setattr(T, "_TERMS_MAX", 16)
    T._TERMS.clear()
    S._native_configure(S._DL_EXACT, S._TF_EXACT, S._DL_BITS, S._dl_bucket, S._tf_bucket,
                        T.ASCII_WORD_CLASS, T.WORD_TERMS, 16)
    yield
    T._TERMS.clear()
    S._native_configure(S._DL_EXACT, S._TF_EXACT, S._DL_BITS, S._dl_bucket, S._tf_bucket,
                        T.ASCII_WORD_CLASS, T.WORD_TERMS, T.TERMS_MAX)


def test_with_the_word_caches_emptied_under_it(monkeypatch, small_word_caches):
    texts = _texts(300, 4)
    assert _build(texts, True, monkeypatch) == _build(texts, False, monkeypatch)


def test_words_are_cut_as_the_tokenizer_cuts_them(monkeypatch):
    """Random ASCII texts of word characters, apostrophes, digits and cuts: the words the C side cuts
    (seen through the terms it posts) are _ascii_words's."""
    texts = _ascii_texts(3000, seed=9) + _APOSTROPHES + [
        "x" * 65 + " " + "y" * 64 + " " + "x" * 65]   # words past the word cache's longest, twice
    assert _build(texts, True, monkeypatch) == _build(texts, False, monkeypatch)


def test_an_ascii_text_goes_to_the_native_side_normalised():
    """posting_items hands an ASCII text over normalised (for the C side to cut and map), any other
    text as index_terms's terms."""
    for text in _texts(300, 6):
        items, terms, _ = T.posting_items(text)
        if text.isascii():
            assert items == T._prepare(text) and terms is T._TERMS
        else:
            assert items == T.index_terms(text) and terms is None


def test_bad_arguments_are_errors_not_crashes():
    import convmem_postings as P

    ix = S.SearchIndex()
    args = [ix._vocab, ix._new_tid, ix._slots[0], ix._keys[0], ix._maxtf[0], 0]
    with pytest.raises(TypeError):
        P.post("not a list", None, None, *args)
    with pytest.raises(TypeError):
        P.post(["words"], T._TERMS, None, *args)      # words come as a text
    with pytest.raises(TypeError):
        P.post("naïve", T._TERMS, None, *args)        # ... an ASCII one
    with pytest.raises(TypeError):
        P.post([1, 2], None, None, *args)
    with pytest.raises(TypeError):
        P.post("zzword", {"zzword": 5}, None, *args)  # a term that is not a str
    with pytest.raises(TypeError):
        P.post(["a"], None, None, *args[:-1])
    with pytest.raises(IndexError):
        P.post(["zz"], None, None, {"zz": 10**6}, *args[1:])
    with pytest.raises(ZeroDivisionError):
        P.post("a1", T._TERMS, lambda w: 1 / 0, *args)
    with pytest.raises(ValueError):
        P.configure(S._DL_EXACT, S._TF_EXACT, S._DL_BITS, S._dl_bucket, S._tf_bucket, b"short", T.WORD_TERMS, 16)
    assert ix._vocab == {} and ix._slots[0] == [] and ix._n_postings == 0   # nothing posted by them


def test_the_native_words_are_ascii_words_s():
    import convmem_postings as P

    texts = _ascii_texts(20_000, seed=10) + _APOSTROPHES + ["", "'", "a"]
    for text in texts:
        prepared = T._prepare(text)
        assert P.words(prepared) == T._ascii_words(prepared), text


def test_another_mapping_neither_reads_nor_fills_the_word_cache():
    """A post() given some other word -> term mapping (only a caller's bug could) leaves what real
    indexing makes of the same word unchanged."""
    import convmem_postings as P

    ix = S.SearchIndex()
    args = [ix._vocab, ix._new_tid, ix._slots[0], ix._keys[0], ix._maxtf[0], 0]
    P.post("running", {"running": "WRONG"}, T._alnum_parts, *args)
    assert ix._terms == ["WRONG"]
    real = S.SearchIndex()
    real.add(0, "running", None, [])
    assert list(real._vocab) == T.index_terms("running") == ["run"]


def test_a_term_that_is_a_str_subclass_is_refused():
    """What counts as one term is str's own equality: a subclass (whose __hash__ or __eq__ could run
    any code) is refused, not counted."""
    import convmem_postings as P

    class Odd(str):
        def __hash__(self):
            return 1

    ix = S.SearchIndex()
    with pytest.raises(TypeError):
        P.post([Odd("a"), Odd("b")], None, None, ix._vocab, ix._new_tid, ix._slots[0], ix._keys[0],
               ix._maxtf[0], 0)
    assert ix._vocab == {}


@pytest.mark.parametrize("native", [True, False])
def test_a_failure_partway_keeps_the_fields_tf_bound(monkeypatch, native):
    """A term id that fails after another term's tf maximum was raised (new_tid failing: memory): the
    field's bound on the tf buckets still covers every term's, on either path."""
    if not native:
        monkeypatch.setattr(S, "_native_post", None)
    ix = S.SearchIndex()
    ix.add(0, "alpha beta", None, [])
    calls = []
    real = ix._new_tid

    def failing(term):
        calls.append(term)
        if len(calls) > 1:
            raise MemoryError
        return real(term)

    monkeypatch.setattr(ix, "_new_tid", failing)
    with pytest.raises(MemoryError):
        ix.add(1, "alpha alpha alpha gamma delta", None, [])
    assert ix._maxtf_all[0] >= max(ix._maxtf[0])
