"""Issue 15's stemmer spike: PyStemmer's English Snowball stemmer in place of our hand-written Porter.

1. LoCoMo dev recall@1/5/10, overall and per category, of today's search with each stemmer:
   bench/search_quality.run_locomo (ours = ranked_search with the context stage, ours_no_context =
   SearchIndex.search, i.e. BM25 alone), content only.  Snowball is substituted by monkeypatching
   storaged.tokenize.stem in this process (its ascii-letters-only guard kept) and clearing the
   tokenizer's caches; tokenize.py itself is not edited.
2. Throughput: the same word stream (every Latin word of the LoCoMo turns, repeats kept, as the
   tokenizer meets them) stemmed uncached by tokenize._porter and by Stemmer.stemWord /
   Stemmer.stemWords (PyStemmer keeps its own small cache: disabled with maxCacheSize = 0, and
   also timed with its default cache); median of --repeat runs.  With --events (an events.jsonl
   written by `bench.engine_spike gen`): index_terms MiB/s over its first --n events with each
   stemmer, the tokenizer's own caches cleared before each run (what indexing pays end to end).

PyStemmer is NOT a project dependency: run it from a private venv (python3 -m venv /tmp/spikevenv2
&& /tmp/spikevenv2/bin/pip install -e . tantivy PyStemmer numpy), from the repository root:

    CONVMEM_LOCOMO=/path/to/locomo-dev.json /tmp/spikevenv2/bin/python -m bench.stemmer_spike [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from typing import Any, Callable

try:
    import Stemmer
except ImportError as exc:  # pragma: no cover - the message is the point
    sys.exit(f"bench/stemmer_spike.py needs PyStemmer, which is not a project dependency ({exc}).\n"
             "Install it into a private venv: python3 -m venv /tmp/spikevenv2 && "
             "/tmp/spikevenv2/bin/pip install -e . tantivy PyStemmer numpy")

from bench import search_quality as Q
from storaged import tokenize as T


def use_stemmer(fn: Callable[[str], str]) -> None:
    """Make the tokenizer stem with fn (our guard kept: only all-ASCII letter words are stemmed)."""
    def stem(word: str) -> str:
        if not word.isascii() or not word.isalpha():
            return word
        return fn(word)
    T.stem = stem
    T._word_term.cache_clear()
    T._alnum_parts.cache_clear()


def recall(convs) -> dict[str, Any]:
    r = Q.run_locomo(convs, False)
    return {k: r[k] for k in ("ours", "ours_no_context")}


def words(convs) -> list[str]:
    out = []
    for _, turns, _, _ in convs:
        for t in turns:
            out += [w for w in re.findall(r"[^\W\d_]+", T.normalize(Q.turn_text(t))) if w.isascii()]
    return out


def timed(fn: Callable[[], Any], repeat: int) -> float:
    xs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        xs.append(time.perf_counter() - t0)
    return statistics.median(xs)


def tokenize_speed(path: str, n: int, repeat: int, stemmers: dict[str, Callable[[str], str]]) -> dict[str, Any]:
    with open(path) as f:
        texts = [json.loads(line) for _, line in zip(range(n), f)]
    mib = sum(len(t.encode()) for t in texts) / 2**20
    out: dict[str, Any] = {"events": len(texts), "mib": round(mib, 1)}
    for name, fn in stemmers.items():
        def run(fn: Callable[[str], str] = fn) -> None:
            use_stemmer(fn)  # also clears the caches
            for t in texts:
                T.index_terms(t)
        s = timed(run, repeat)
        out[name] = {"s": round(s, 3), "mib_per_s": round(mib / s, 2)}
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--events", help="events.jsonl of bench.engine_spike gen")
    ap.add_argument("--n", type=int, default=20_000)
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    convs = Q.load_locomo()
    porter = T.stem
    res: dict[str, Any] = {"porter": recall(convs)}
    snow = Stemmer.Stemmer("english")
    use_stemmer(snow.stemWord)
    res["snowball"] = recall(convs)
    T.stem = porter
    T._word_term.cache_clear()
    T._alnum_parts.cache_clear()

    ws = words(convs)
    uniq = set(ws)
    nocache = Stemmer.Stemmer("english")
    nocache.maxCacheSize = 0
    cached = Stemmer.Stemmer("english")
    runs = {
        "porter (tokenize._porter)": lambda: [T._porter(w) for w in ws],
        "snowball stemWord, no cache": lambda: [nocache.stemWord(w) for w in ws],
        "snowball stemWords(list), no cache": lambda: nocache.stemWords(ws),
        "snowball stemWord, default cache": lambda: [cached.stemWord(w) for w in ws],
    }
    res["throughput"] = {"words": len(ws), "distinct": len(uniq)}
    for name, fn in runs.items():
        s = timed(fn, a.repeat)
        res["throughput"][name] = {"s": round(s, 4), "words_per_s": round(len(ws) / s)}
    differ = sum(1 for w in uniq if T._porter(w) != nocache.stemWord(w))
    res["throughput"]["distinct_words_stemmed_differently"] = differ
    if a.events:
        res["index_terms"] = tokenize_speed(a.events, a.n, a.repeat, {"porter": T._porter, "snowball": snow.stemWord})
        T.stem = porter
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    print(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    main()
