"""The tokenizer's fast paths give exactly what its definitions give: an ASCII text's words cut in C
(``_ascii_words``) are the word regex's, and the dict that caches each word's term stays bounded and
right when it is emptied."""
from __future__ import annotations

import random

import pytest

from storaged import tokenize as T

pytestmark = pytest.mark.unit

ASCII = "abcxyzABC0129 '_-.,:;/\\\"\t\n()[]{}#@!?$%&*+=<>|~`^"


def _texts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    out = ["don't 'quoted' a''b x'y it's o'neil' ''' ' a'", "1,000 7th python3 iphone15 snake_case x86_64",
           "", " ", "'", "__init__.py:12: in test_x", "HTTP/1.1 404 Not Found"]
    for _ in range(n):
        out.append("".join(rng.choice(ASCII) for _ in range(rng.randint(0, 60))))
    return out


def test_ascii_words_are_the_word_regex_s():
    for text in _texts(20_000, seed=1):
        prepared = T._prepare(text)
        assert prepared.isascii()
        assert T._ascii_words(prepared) == T._WORD_RE.findall(prepared), text


def test_an_ascii_text_gets_the_terms_the_regex_path_gives(monkeypatch):
    """index_terms through the fast path, against the same text with one CJK character added (which
    sends it down the regex path and adds only that character's own term)."""
    for text in _texts(3_000, seed=2):
        fast = T.index_terms(text)
        slow = T.index_terms(text + " 京")
        assert sorted(fast + ["京"]) == sorted(slow), text


def test_the_term_cache_is_bounded_and_right_after_it_is_emptied(monkeypatch):
    monkeypatch.setattr(T, "_TERMS_MAX", 50)
    T._TERMS.clear()
    words = [f"running{i}" for i in range(200)] + ["the", "running", "houses"]
    for w in words:
        assert T._word_term(w) == T._compute_term(w)
        assert len(T._TERMS) <= 50
    assert T.index_terms("The running houses") == ["run", "hous"]
    T._TERMS.clear()


def test_thousands_separators_go_as_their_definition_says():
    """The comma-first pattern drops exactly the commas the plain definition names: a comma after a
    digit and before exactly three digits ("1,000,000" → "1000000"; "1,0000" and "a,000" keep theirs)."""
    import re

    definition = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
    rng = random.Random(4)
    texts = ["1,000", "1,000,000", "1,0000", "a,000", ",000", "12,345.6", "1,00", "9,999x"]
    texts += ["".join(rng.choice("0123456789,a ") for _ in range(rng.randint(0, 16))) for _ in range(50_000)]
    for text in texts:
        assert T._THOUSANDS_RE.sub("", text) == definition.sub("", text), text
    assert T.index_terms("1,000,000 users") == ["1000000", "user"]
