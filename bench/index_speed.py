"""Indexing speed in this process: ``python -m bench.index_speed --dir D [--events 60000] [--repeat 4]``.

Takes the first N events of a ``bench.scale`` corpus (``D/corpus/batches.msgpack``, made by
``python -m bench.scale --events N --dir D --phases gen``) and times, per event, the tokenizer alone
(``index_terms`` of the content) and ``SearchIndex.add`` (all three fields into a fresh index, what the
daemon's loop and its catch-up children do for each message), each ``--repeat`` times after a warm-up
pass that fills the tokenizer's term cache. Prints the minimum and the median in µs per event, and the
text's MiB/s.

Why in-process: indexing is most of the daemon's CPU per imported event (bench/SPIKES.md, part 17); the
daemon's ingest rate (``bench.scale --phases ingest``) also counts validation, the log, the table and the
snapshots, and moves with the machine's load, so a change to the tokenizer or to ``add`` is measured here.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from bench import scale_corpus
from storaged.search import SearchIndex
from storaged.tokenize import index_terms


def load(d: str, n: int) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = []
    for batch in scale_corpus.batches(d):
        msgs += batch["messages"]
        if len(msgs) >= n:
            break
    return msgs[:n]


def run(msgs: list[dict[str, Any]], repeat: int) -> dict[str, Any]:
    texts = [m["content"] for m in msgs]
    fields = [(m["content"], m["metadata"].get("summary"), m["metadata"].get("tags") or []) for m in msgs]
    mib = sum(len(t.encode()) for t in texts) / 2**20
    for t in texts:   # warm-up: the term cache, as a running daemon has it
        index_terms(t)

    def timed(work) -> dict[str, float]:
        per = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            work()
            per.append(time.perf_counter() - t0)
        return {"min_us": round(min(per) * 1e6 / len(msgs), 1),
                "median_us": round(statistics.median(per) * 1e6 / len(msgs), 1),
                "mib_s": round(mib / min(per), 1)}

    def tokenize() -> None:
        for t in texts:
            index_terms(t)

    def add() -> None:
        ix = SearchIndex()
        for doc, (content, summary, tags) in enumerate(fields):
            ix.add(doc, content, summary, tags)

    return {"events": len(msgs), "text_mib": round(mib, 1), "index_terms": timed(tokenize), "add": timed(add)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="python -m bench.index_speed", description=__doc__.splitlines()[0])
    p.add_argument("--dir", required=True, help="a bench.scale directory whose corpus is generated")
    p.add_argument("--events", type=int, default=60_000)
    p.add_argument("--repeat", type=int, default=4)
    a = p.parse_args(argv)
    res = run(load(a.dir, a.events), a.repeat)
    print(json.dumps(res))
    return res


if __name__ == "__main__":
    main()
