"""Short text for the history interface: search snippets around the matched terms, compact summaries.

A search hit is a pointer, not the record: its snippet is a window of at most ``SNIPPET_CHARS``
characters chosen to hold as many distinct query terms as possible, so an agent can judge a 20 KB tool
output from two hundred characters and open the event only if it matters. Terms are found the way
the index finds them (NFKC, case folding, stemming; CJK runs and their bigrams) but located with C-speed
regular expressions, so a snippet over a 1 MiB output costs milliseconds, not a tokenisation of it all.
"""
from __future__ import annotations

import re
from functools import lru_cache

from .tokenize import _word_term, normalize, query_runs

_WS = re.compile(r"\s+")
_WORD_AT = re.compile(r"[^\W_]+(?:['’][^\W_]+)*")
MATCHES_PER_TERM = 2000
UNITS_MAX = 24        # query units located (a 4096-character query must not mean 4096 scans of the text)
WHOLE_RUN_MAX = 64    # a CJK run is also looked for whole when it is at most this long
ELLIPSIS = "…"


def compact(text: str, max_chars: int) -> tuple[str, bool]:
    """``text`` with its whitespace collapsed, cut to ``max_chars`` (at a word boundary when one is near)."""
    head = text[: max_chars * 4 + 64]  # whitespace collapse cannot need more than this
    flat = _WS.sub(" ", head).strip()
    if len(flat) <= max_chars and len(head) == len(text):
        return flat, False
    if len(flat) <= max_chars:
        return flat + ELLIPSIS, True
    cut = flat[: max_chars]
    space = cut.rfind(" ")
    if space > max_chars * 2 // 3:
        cut = cut[:space]
    return cut.rstrip() + ELLIPSIS, True


@lru_cache(maxsize=256)
def _patterns(query: str) -> tuple[tuple[str, str | None], ...]:
    """(literal to find, term to verify the word with or None) for each distinct query unit."""
    out = []
    seen = set()
    for run in query_runs(query):
        if len(out) >= UNITS_MAX:
            break
        if run.cjk:
            whole = run.terms[0] + "".join(g[1:] for g in run.terms[1:])  # the run, from its bigrams
            pieces = (whole, *run.terms) if len(whole) <= WHOLE_RUN_MAX else run.terms
            for piece in dict.fromkeys(pieces):
                if piece not in seen and len(out) < UNITS_MAX:
                    seen.add(piece)
                    out.append((piece, None))
            continue
        term = run.terms[0]
        if term in seen:
            continue
        seen.add(term)
        out.append((term[:-1] if len(term) > 3 else term, term))  # the stem's prefix: "migrat" finds "migration"
    return tuple(out)


def _matches(folded: str, query: str) -> list[tuple[int, int, int]]:
    """(start, end, unit index) of every located query unit, in text order. Literals are found with
    str.find (C speed); only candidates are checked word by word."""
    found = []
    for unit, (literal, term) in enumerate(_patterns(query)):
        n = 0
        at = folded.find(literal)
        while at >= 0 and n < MATCHES_PER_TERM:
            nxt = folded.find(literal, at + 1)
            if term is None:
                found.append((at, at + len(literal), unit))
                n += 1
            elif at == 0 or not (folded[at - 1].isalnum()):
                w = _WORD_AT.match(folded, at)
                if w is not None and _word_term(w.group()) == term:
                    found.append((at, w.end(), unit))
                    n += 1
            at = nxt
    found.sort()
    return found


def snippet(text: str, query: str, max_chars: int) -> tuple[str, bool]:
    """A window of ``text`` around the densest cluster of query terms (the start when none is found)."""
    if len(text) <= max_chars and "\n" not in text and "  " not in text:
        return text, False
    folded = text.lower() if text.isascii() else normalize(text)
    to_text = _identity
    if len(folded) != len(text):
        folded, to_text = _folded_with_map(text)
    found = _matches(folded, query)
    if not found:
        return compact(text, max_chars)
    # the window of max_chars holding the most distinct units (earliest on ties)
    best, best_start = -1, 0
    counts: dict[int, int] = {}
    j = 0
    for i, (start, _end, unit) in enumerate(found):
        counts[unit] = counts.get(unit, 0) + 1
        while found[j][1] - start > max_chars or start - found[j][0] > max_chars:
            u = found[j][2]
            counts[u] -= 1
            if not counts[u]:
                del counts[u]
            j += 1
        if len(counts) > best:
            best, best_start = len(counts), found[j][0]
    lead = max_chars // 5
    start = max(0, to_text(best_start) - lead)
    if start:
        space = text.rfind(" ", max(0, start - 20), start + 1)
        start = space + 1 if space >= 0 else start
    raw = text[start: start + max_chars * 4 + 64]
    flat = _WS.sub(" ", raw).strip()
    body = flat[:max_chars]
    more = len(flat) > max_chars or start + len(raw) < len(text)
    if more:
        space = body.rfind(" ")
        if space > max_chars * 2 // 3:
            body = body[:space]
    out = (ELLIPSIS if start else "") + body.strip() + (ELLIPSIS if more else "")
    return out, bool(start) or more


def _identity(offset: int) -> int:
    return offset


FOLD_CHUNK = 256


def _folded_with_map(text: str):
    """(folded text, folded offset -> text offset) when NFKC/case folding changes lengths (ß -> ss,
    ligatures...): the text is folded in chunks of FOLD_CHUNK characters, so the map is exact at every
    chunk start and off by at most a few characters within one."""
    import bisect

    pieces, folded_starts, text_starts, ratios = [], [], [], []
    f = 0
    for t in range(0, len(text), FOLD_CHUNK):
        chunk = text[t:t + FOLD_CHUNK]
        piece = normalize(chunk)
        pieces.append(piece)
        folded_starts.append(f)
        text_starts.append(t)
        ratios.append(len(chunk) / len(piece) if piece else 1.0)
        f += len(piece)

    def to_text(offset: int) -> int:
        i = max(0, bisect.bisect_right(folded_starts, offset) - 1)
        return text_starts[i] + int((offset - folded_starts[i]) * ratios[i])
    return "".join(pieces), to_text
