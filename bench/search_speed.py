"""Search latency and index memory of storaged.search vs SQLite FTS5, same corpus, same run.

Corpus: messages synthesised deterministically (seeded) from LoCoMo turns — one or two turns,
a speaker from a pool of 400 names, sometimes a reference number — so the text and the
vocabulary distribution are realistic and the reference numbers make the vocabulary keep growing.
Queries: LoCoMo questions.  FTS5 (`porter unicode61`, contentless, bm25, ORDER BY rank LIMIT n)
gets the same query words as our index (our stop words dropped, OR-ed), i.e. its best case.
Latencies are measured interleaved (ours, then FTS5, per query) after a warm-up pass so machine
noise hits both alike.

    python -m bench.search_speed                       # 10k and 100k
    python -m bench.search_speed --sizes 10000,100000,1000000 --json out.json
    python -m bench.search_speed --quick
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import re
import sqlite3
import statistics
from bisect import bisect_left
from functools import lru_cache
import sys
import time
from pathlib import Path

from storaged.rank import ranked_search
from storaged.search import SearchIndex
from storaged.tokenize import STOP_WORDS

SESSION_LEN = 40  # synthetic sessions: runs of consecutive docs, for the context stage's neighbours


@lru_cache(maxsize=None)
def _session(k: int) -> list[int]:
    return list(range(k * SESSION_LEN + 1, (k + 1) * SESSION_LEN + 1))


def neighbours(doc: int, r: int):
    """As the daemon's (storaged/views.py session_neighbours): a bisect in the session's ordered
    docs and two slices.  Session k holds docs k·SESSION_LEN + 1 .. (k + 1)·SESSION_LEN."""
    seqs = _session((doc - 1) // SESSION_LEN)
    i = bisect_left(seqs, doc)
    return seqs[max(0, i - r):i][::-1], seqs[i + 1:i + 1 + r]

DATA = Path(os.environ.get("CONVMEM_LOCOMO", Path(__file__).resolve().parents[2] / "shared" / "data" / "locomo-dev.json"))

_FIRST = (
    "Alex Sam Maria John Mei Yuki Ken Aiko Lena Omar Priya Ravi Sofia Liam Emma Noah Olivia Ava "
    "Lucas Mia Ethan Zoe Ivan Nina Hugo Clara Felix Rosa Tariq Amira Diego Elena Marco Sara Jonas "
    "Ines Pavel Hana Kofi Ada"
).split()
_LAST = (
    "Smith Tanaka Garcia Chen Novak Kim Silva Patel Muller Rossi Dubois Sato Ali Jensen Kowalski"
).split()


def load_turns() -> tuple[list[dict], list[str]]:
    data = json.loads(DATA.read_text())
    turns, questions = [], []
    for sample in data:
        conv = sample["conversation"]
        for key, val in conv.items():
            if key.startswith("session_") and isinstance(val, list):
                turns.extend(val)
        questions.extend(q["question"] for q in sample["qa"] if q.get("question"))
    return turns, questions


def synthesize(turns: list[dict], n: int, seed: int = 7) -> list[str]:
    rng = random.Random(seed)
    names = [f"{f} {l}" for f in _FIRST for l in _LAST][:400]
    out = []
    for _ in range(n):
        t = rng.choice(turns)
        text = f"{rng.choice(names)}: {t['text']}"
        if t.get("blip_caption"):
            text += f" [image: {t['blip_caption']}]"
        if rng.random() < 0.3:
            text += " " + rng.choice(turns)["text"]
        if rng.random() < 0.15:
            text += f" (ref {rng.randrange(10**6):06d})"
        out.append(text)
    return out


def fts_query(q: str) -> str | None:
    words = []
    for w in re.findall(r"[^\W_]+(?:['’][^\W_]+)*", q.casefold()):
        w = re.sub(r"['’].*$", "", w)
        if w and w not in STOP_WORDS:
            words.append(f'"{w}"')
    return " OR ".join(dict.fromkeys(words)) or None


def common_words_query(docs: list[str], k: int = 35) -> str:
    """The hostile case of issue 12 (item 4c): a query of the corpus's k most frequent indexable
    words (by document frequency, stop words excluded), so that every posting list it reads is long."""
    df: dict[str, int] = {}
    for d in docs:
        for w in set(re.findall(r"[^\W_]+", d.casefold())):
            if w not in STOP_WORDS and not w.isdigit() and len(w) > 2:
                df[w] = df.get(w, 0) + 1
    return " ".join(sorted(df, key=lambda w: (-df[w], w))[:k])


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p * (len(xs) - 1))))]


def run_size(n: int, turns, questions, nq: int, limit: int, snapshot: bool) -> dict:
    docs = synthesize(turns, n)
    rng = random.Random(n)
    qs = rng.sample(questions, min(nq, len(questions)))
    res: dict = {"size": n, "queries": len(qs), "limit": limit}

    gc.collect()
    rss0 = rss_bytes()
    t0 = time.perf_counter()
    idx = SearchIndex()
    for i, text in enumerate(docs, 1):
        idx.add(i, text, None, ())
    res["ours_build_s"] = time.perf_counter() - t0
    gc.collect()
    res["ours_rss_delta_bytes"] = rss_bytes() - rss0
    t0 = time.perf_counter()
    res["ours_memory_bytes"] = idx.memory_bytes()
    res["ours_memory_bytes_call_ms"] = (time.perf_counter() - t0) * 1e3

    con = sqlite3.connect(":memory:")
    con.execute("CREATE VIRTUAL TABLE t USING fts5(content, tokenize='porter unicode61', content='')")
    t0 = time.perf_counter()
    con.executemany("INSERT INTO t(rowid, content) VALUES (?, ?)", enumerate(docs, 1))
    con.commit()
    res["fts5_build_s"] = time.perf_counter() - t0
    page_size = con.execute("PRAGMA page_size").fetchone()[0]
    page_count = con.execute("PRAGMA page_count").fetchone()[0]
    res["fts5_db_bytes"] = page_size * page_count
    res["text_bytes"] = sum(len(d.encode()) for d in docs)

    sql = "SELECT rowid FROM t WHERE t MATCH ? ORDER BY rank LIMIT ?"
    fq = [fts_query(q) for q in qs]
    # warm-up, and a check that both sides find something for the same queries
    found = [0, 0]
    for q, f in zip(qs, fq):
        found[0] += bool(idx.search(q, limit))
        if f:
            found[1] += bool(con.execute(sql, (f, limit)).fetchall())
    res["queries_with_results"] = {"ours": found[0], "fts5": found[1]}
    ours, fts, ours_f, core = [], [], [], []
    shard = lambda d: d % 10 == 3  # noqa: E731  a session-like filter keeping 10 % of docs
    for q, f in zip(qs, fq):
        t0 = time.perf_counter()
        ranked_search(idx, q, limit, neighbours=neighbours)  # what search_messages runs
        t1 = time.perf_counter()
        if f:
            con.execute(sql, (f, limit)).fetchall()
        t2 = time.perf_counter()
        ranked_search(idx, q, limit, accept=shard, neighbours=neighbours)
        t3 = time.perf_counter()
        idx.search(q, limit)
        t4 = time.perf_counter()
        ours.append((t1 - t0) * 1e3)
        fts.append((t2 - t1) * 1e3)
        ours_f.append((t3 - t2) * 1e3)
        core.append((t4 - t3) * 1e3)
    for name, xs in (("ours", ours), ("fts5", fts), ("ours_filtered", ours_f), ("ours_core", core)):
        res[f"{name}_p50_ms"] = statistics.median(xs)
        res[f"{name}_p95_ms"] = pct(xs, 0.95)
    # the hostile query: 35 common words, every list long (median of 5, interleaved with FTS5)
    cq = common_words_query(docs)
    cf = fts_query(cq)
    c_ours, c_fts = [], []
    for _ in range(5):
        t0 = time.perf_counter()
        idx.search(cq, limit)
        t1 = time.perf_counter()
        con.execute(sql, (cf, limit)).fetchall()
        t2 = time.perf_counter()
        c_ours.append((t1 - t0) * 1e3)
        c_fts.append((t2 - t1) * 1e3)
    res["common35_query"] = cq
    res["common35_ours_ms"] = statistics.median(c_ours)
    res["common35_fts5_ms"] = statistics.median(c_fts)
    con.close()

    if snapshot:
        import msgpack

        t0 = time.perf_counter()
        dumped = idx.dump()
        t1 = time.perf_counter()
        blob = msgpack.packb(dumped)
        t2 = time.perf_counter()
        back = SearchIndex.load(msgpack.unpackb(blob))
        t3 = time.perf_counter()
        res["dump_s"] = t1 - t0
        res["msgpack_pack_s"] = t2 - t1
        res["unpack_and_load_s"] = t3 - t2
        res["snapshot_bytes"] = len(blob)
        same = all(back.search(q, limit) == idx.search(q, limit) for q in qs[:50])
        res["load_identical_results"] = same
        del back, blob, dumped
        # update churn: re-index 20% of the docs (remove + add, as update_message does); the
        # sweeper's bounded steps show up in the tail latencies; then an explicit compact()
        before = idx._n_postings + idx._n_single
        lat = []
        for d in random.Random(1).sample(range(1, n + 1), n // 5):
            t0 = time.perf_counter()
            idx.remove(d)
            idx.add(d, docs[d - 1], None, ())
            lat.append((time.perf_counter() - t0) * 1e3)
        res["update_p50_ms"] = statistics.median(lat)
        res["update_p99_ms"] = pct(lat, 0.99)
        res["update_max_ms"] = max(lat)
        res["postings_growth_after_churn"] = (idx._n_postings + idx._n_single) / before
        t0 = time.perf_counter()
        idx.compact()
        res["compact_s"] = time.perf_counter() - t0
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="10000,100000", help="comma-separated corpus sizes")
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--limit", type=int, default=20, help="results per query (tool default 20)")
    ap.add_argument("--no-snapshot", action="store_true", help="skip dump/load/compaction timing")
    ap.add_argument("--quick", action="store_true", help="tiny sizes, for a smoke run")
    ap.add_argument("--json", help="write results to this path")
    args = ap.parse_args()
    sizes = [2000, 5000] if args.quick else [int(s) for s in args.sizes.split(",")]
    nq = 50 if args.quick else args.queries
    turns, questions = load_turns()
    results = []
    for n in sizes:
        r = run_size(n, turns, questions, nq, args.limit, not args.no_snapshot)
        results.append(r)
        print(f"size {n}: done", file=sys.stderr, flush=True)
    print(file=sys.stderr)

    print(f"\nSearch latency (ms, {nq} LoCoMo questions, limit {args.limit}) and index memory")
    hdr = (
        f"{'docs':>9} | {'ours p50':>8} {'p95':>7} | {'FTS5 p50':>8} {'p95':>7} | "
        f"{'filt p50':>8} | {'ours MB':>8} {'B/doc':>6} | {'FTS5 MB':>8} | {'build ours':>10} {'FTS5':>6}"
    )
    print(hdr)
    print("-" * len(hdr))
    for r in results:
        print(
            f"{r['size']:>9} | {r['ours_p50_ms']:8.2f} {r['ours_p95_ms']:7.2f} | "
            f"{r['fts5_p50_ms']:8.2f} {r['fts5_p95_ms']:7.2f} | {r['ours_filtered_p50_ms']:8.2f} | "
            f"{r['ours_memory_bytes'] / 1e6:8.1f} {r['ours_memory_bytes'] / r['size']:6.0f} | "
            f"{r['fts5_db_bytes'] / 1e6:8.1f} | {r['ours_build_s']:9.1f}s {r['fts5_build_s']:5.1f}s"
        )
    print("filt = ours with a session-like accept filter keeping 10% of docs.")
    print("ours = core + session-context stage (storaged/rank.py), as search_messages runs it; core p50/p95: "
          + ", ".join(f"{r['size']}: {r['ours_core_p50_ms']:.2f}/{r['ours_core_p95_ms']:.2f}" for r in results))
    print("ours MB = memory_bytes(); FTS5 MB = contentless in-memory database size.")
    for r in results:
        extra = (
            f"  {r['size']}: RSS delta while indexing {r['ours_rss_delta_bytes'] / 1e6:.1f} MB, "
            f"text {r['text_bytes'] / 1e6:.1f} MB, memory_bytes() call {r['ours_memory_bytes_call_ms']:.3f} ms"
        )
        if "dump_s" in r:
            extra += (
                f"\n      dump {r['dump_s']:.2f}s + msgpack {r['msgpack_pack_s']:.2f}s "
                f"({r['snapshot_bytes'] / 1e6:.1f} MB); unpack+load {r['unpack_and_load_s']:.2f}s; "
                f"identical after load: {r['load_identical_results']}"
            )
        if "compact_s" in r:
            extra += (
                f"\n      update churn (20% re-indexed): remove+add p50 {r['update_p50_ms']:.3f} ms, "
                f"p99 {r['update_p99_ms']:.3f} ms, max {r['update_max_ms']:.1f} ms; postings x"
                f"{r['postings_growth_after_churn']:.2f}; explicit compact() {r['compact_s']:.2f}s"
            )
        extra += (f"\n      35 common words in one query: ours {r['common35_ours_ms']:.1f} ms, "
                  f"FTS5 {r['common35_fts5_ms']:.1f} ms (median of 5)")
        print(extra)
    if args.json:
        Path(args.json).write_text(json.dumps({"results": results}, indent=2))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
