"""Text → index terms, shared by indexing and querying so both sides always agree.

Latin-script words: NFKC, casefold, possessive/contraction endings dropped, thousands separators
and ordinal endings removed ("1,000" → "1000", "7th" → "7"), then PyStemmer's English Snowball
("Porter2") stemmer: maintained C, preferred to a hand-written Porter at equal LoCoMo recall.  A
word mixing letters and digits is indexed whole and by its parts ("python3" → python3, python, 3).
A small list of English function words is dropped on both sides: on LoCoMo it costs no recall when dropped from
the index and gains ~4 points at recall@10 when dropped from queries, and it removes the longest
posting lists (≈40% of all postings).  A query made only of stop words therefore finds nothing.

CJK runs (Han, Hiragana, Katakana incl. ー, Hangul) carry no spaces, so they are cut into
overlapping character bigrams (a one-character run stays a unigram).  A query run is cut the same
way, so `データベース移行` reaches `本番データベースの移行を決定した` through shared bigrams, and a
two-character query is exactly one bigram.

Everything here is a pure function of its input: the caches are a dict (`_TERMS`: a word's term, emptied
when full; each operation on it is atomic under the GIL, and a race only computes a term twice) and a
`functools.lru_cache`, and the stemmer is called under a lock, so any thread can tokenise while the main
thread queries (a lock no other thread holds at a fork either: only the loop's thread tokenises in the
daemon).

Indexing is the daemon's costliest work per event (ingest, a start's replayed tail, a snapshot's
catch-up), and this module is half of it, so `index_terms` keeps its per-word work in C where it can:
an ASCII text (most tool output) is cut into words by `str.translate` and `split` instead of the word
regex (the same words: `_ascii_words`), and each word's term is one dict lookup in `_TERMS`, mapped and
filtered without a Python-level loop.  The terms depend on the stemmer: changing it changes the search dump's format string
(storaged/search.py), so an index built with another stemmer is never read.
"""

from __future__ import annotations

import re
import threading
import unicodedata
from itertools import filterfalse
from functools import lru_cache
from typing import Callable, NamedTuple

import Stemmer

__all__ = [
    "STOP_WORDS",
    "QueryRun",
    "ASCII_WORD_CLASS",
    "TERMS_MAX",
    "WORD_TERMS",
    "index_terms",
    "posting_items",
    "normalize",
    "query_runs",
    "stem",
]

# Hiragana, Katakana (ー U+30FC included), CJK punctuation-free ideographic ranges, Hangul.
# 々〆〇 (U+3005-3007) behave as ideographs in Japanese text.
_CJK = (
    "\u3005-\u3007"
    "\u3041-\u309f"  # hiragana (+ voicing marks, ゝゞゟ)
    "\u30a0-\u30ff"  # katakana incl. ー, ヶ
    "\u31f0-\u31ff"  # katakana phonetic extensions
    "\u3400-\u4dbf"  # CJK ext A
    "\u4e00-\u9fff"  # CJK unified
    "\uf900-\ufaff"  # compatibility ideographs (NFKC maps most away)
    "\u1100-\u11ff\u3130-\u318f\ua960-\ua97f\uac00-\ud7af\ud7b0-\ud7ff"  # Hangul
    "\U00020000-\U0002fa1f"  # CJK ext B-F, compatibility supplement
    "\U00030000-\U0003134f"  # CJK ext G
)
# Query side, in order: a CJK run, or a word of letters/digits (not CJK) with inner apostrophes
# ("don't", "caroline's") kept together so the clitic can be dropped as a unit.
_TOKEN_RE = re.compile(
    rf"(?P<cjk>[{_CJK}]+)"
    rf"|(?P<word>(?:(?![{_CJK}])[^\W_])+(?:['’](?:(?![{_CJK}])[^\W_])+)*)"
)
# Fast path for indexing: CJK runs cut out first, then plain words (no per-character lookahead).
_CJK_RE = re.compile(rf"[{_CJK}]+")
_WORD_RE = re.compile(r"[^\W_]+(?:['’][^\W_]+)*")
_DIGIT_RE = re.compile(r"\d")
_ALNUM_PART_RE = re.compile(r"[^\W\d_]+|\d+")
# The comma first, its digit looked behind after it: a pattern that opens with a literal lets the regex
# engine skip to each comma, where one that opens with the look-behind tries every position (30x slower
# on a kilobyte of tool output, a fifth of indexing it).
_THOUSANDS_RE = re.compile(r",(?<=\d,)(?=\d{3}(?!\d))")
_ORDINAL_RE = re.compile(r"(\d+)(?:st|nd|rd|th)")
_CLITIC_RE = re.compile(r"['’](?:s|re|ve|ll|d|m|t)$|n['’]t$|['’]$")

# Function words of English questions and chat.  Kept small: "not", "no", numbers and pronoun-ish
# content words ("mom", "home") stay searchable.
STOP_WORDS = frozenset(
    """a about above after again against all am an and any are as at be because been before being
    below between both but by can could did do does doing down during each few for from further had
    has have having he her here hers herself him himself his how i if in into is it its itself just
    me more most my myself of off on once only or other our ours ourselves out over own same she
    should so some such than that the their theirs them themselves then there these they this those
    through to too under until up very was we were what when where which while who whom why will
    with would you your yours yourself yourselves s t d ll m re ve ca wo sha
    """.split()
)


def normalize(text: str) -> str:
    return unicodedata.normalize("NFKC", text).casefold()


# One Snowball instance behind a lock: PyStemmer documents that an instance has internal state and must
# not be called concurrently, and threads may tokenise beside each other (in-process tools and tests).  Only _TERMS's
# misses get here, so the lock is cheap; PyStemmer's own cache is off, being redundant with it.
_SNOWBALL = Stemmer.Stemmer("english", 0)
_SNOWBALL_LOCK = threading.Lock()


def stem(word: str) -> str:
    """English stem of one normalised word; digits and non-ASCII words are left alone."""
    if not word.isascii() or not word.isalpha():
        return word
    with _SNOWBALL_LOCK:
        return _SNOWBALL.stemWord(word)


def _compute_term(word: str) -> str | None:
    """Term for one matched word (already normalised), or None if nothing indexable is left."""
    if "'" in word or "’" in word:
        word = _CLITIC_RE.sub("", word).replace("’", "").replace("'", "")
        if not word:
            return None
    if word in STOP_WORDS:
        return None
    if word[0].isdigit():
        m = _ORDINAL_RE.fullmatch(word)
        if m:
            return m.group(1)
    return stem(word)


class _TermCache(dict):
    """word → its term (``_compute_term``), computed on a miss. A plain dict, because a hit is then one
    C-level lookup (``_word_term`` is its ``__getitem__``): ~2x an lru_cache's wrapper. Bounded by
    emptying it when full (~10 MB at _TERMS_MAX words); Zipf refills the common words at once."""

    def __missing__(self, word: str) -> str | None:
        term = _compute_term(word)
        if len(self) >= _TERMS_MAX:
            self.clear()
        self[word] = term
        return term


_TERMS_MAX = TERMS_MAX = 1 << 16   # (also the bound of the native posting builder's own word cache)
_TERMS = WORD_TERMS = _TermCache()   # (the native posting builder keeps the answers of this one only)
_word_term = _TERMS.__getitem__


@lru_cache(maxsize=1 << 15)
def _alnum_parts(word: str) -> tuple[str, ...]:
    """Extra index terms of a letters+digits word, so that "python" finds "python3" and "15"
    finds "iphone15" (the query keeps the whole word, which still ranks an exact match first)."""
    if _ORDINAL_RE.fullmatch(word):
        return ()
    whole = _word_term(word)
    parts = []
    for part in _ALNUM_PART_RE.findall(word):
        term = part if part.isdigit() else (_word_term(part) if len(part) > 1 else None)
        if term is not None and term != whole:
            parts.append(term)
    return tuple(parts)


def _prepare(text: str) -> str:
    # "1,000" → "1000" so a number is one term; "3.5" stays two terms on both sides.
    text = normalize(text)
    return _THOUSANDS_RE.sub("", text) if "," in text else text


def _cjk_grams(run: str) -> list[str]:
    if len(run) == 1:
        return [run]
    return [run[i : i + 2] for i in range(len(run) - 1)]


# After NFKC and casefold an ASCII text's word characters ([^\W_]) are [a-z0-9]: every other ASCII
# character but the apostrophe becomes a space (upper case cannot remain, but is cut too).
_ASCII_CUT = str.maketrans({c: " " for c in map(chr, range(128))
                            if not (c.isalnum() and not c.isupper()) and c != "'"})


# The same cut as a byte per ASCII character, for the native posting builder (storaged/postings.c), which
# cuts an ASCII text's words itself: 1 a word character (kept by _ASCII_CUT), 2 the apostrophe (kept
# where it joins two of them: _LONE_APOSTROPHE_RE), 0 a cut.
ASCII_WORD_CLASS = bytes(2 if c == "'" else 1 if _ASCII_CUT.get(ord(c)) is None else 0 for c in map(chr, range(128)))

# After the cut an ASCII text holds only [a-z0-9'] and spaces; an apostrophe joins two words' parts only
# between two letters or digits ("don't", "a'b'c"), as _WORD_RE reads it: any other is a cut.
_LONE_APOSTROPHE_RE = re.compile(r"'(?:(?<![a-z0-9]')|(?![a-z0-9]))")


def _ascii_words(text: str) -> list[str]:
    """``_WORD_RE.findall(text)`` for a normalised ASCII text, in C: the runs of [a-z0-9'] are the
    words once every apostrophe that joins nothing is cut too (one regex substitution that skips from
    apostrophe to apostrophe, instead of a Python loop over the runs)."""
    text = text.translate(_ASCII_CUT)
    if "'" in text:
        text = _LONE_APOSTROPHE_RE.sub(" ", text)
    return text.split()


def index_terms(text: str) -> list[str]:
    """All terms of a text, with repeats (term frequency counts them); order not significant."""
    if not text:
        return []
    text = _prepare(text)
    runs = ()
    if text.isascii():
        words = _ascii_words(text)
    else:
        runs = _CJK_RE.findall(text)
        if runs:
            text = _CJK_RE.sub(" ", text)
        words = _WORD_RE.findall(text)
    out = list(filter(None, map(_word_term, words)))  # a term is never empty: None is what is dropped
    if _DIGIT_RE.search(text):   # the words mixing letters and digits, picked out in C
        for w in filterfalse(str.isdigit, filterfalse(str.isalpha, words)):
            out.extend(_alnum_parts(w))
    for run in runs:
        if len(run) == 1:
            out.append(run)
        else:
            out.extend([run[i : i + 2] for i in range(len(run) - 1)])
    return out


def posting_items(text: str) -> tuple[str | list[str], dict | None, Callable[[str], tuple[str, ...]]]:
    """``index_terms(text)`` as the search index's native posting builder takes it (storaged/postings.c):
    an ASCII text normalised, with the word → term cache and the parts of a word mixing letters and
    digits, for it to cut into words (ASCII_WORD_CLASS) and map as ``index_terms`` does in Python (the
    same terms in the same order: tests/unit/test_native_postings.py); any other text's terms, with None."""
    if text.isascii():   # NFKC and casefold keep it ASCII: index_terms's own path for it
        return _prepare(text), _TERMS, _alnum_parts
    return index_terms(text), None, _alnum_parts


class QueryRun(NamedTuple):
    """One query unit: a Latin word (one term) or a CJK run (its bigrams, or the lone character)."""

    terms: tuple[str, ...]
    cjk: bool
    word: str = ""  # a Latin word as typed, normalised but not stemmed (prefix matching)


def query_runs(query: str) -> list[QueryRun]:
    """Query units in order; duplicates kept (the index decides how repeats weigh)."""
    runs: list[QueryRun] = []
    for m in _TOKEN_RE.finditer(_prepare(query)):
        run = m.group("cjk")
        if run is not None:
            runs.append(QueryRun(tuple(_cjk_grams(run)), True))
            continue
        word = m.group("word")
        term = _word_term(word)
        if term is not None:
            runs.append(QueryRun((term,), False, word))
    return runs
