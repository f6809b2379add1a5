"""Search CPU time of the working tree against other revisions, in one process, same queries interleaved.

Why: the search figures of issue 14 are ratios to an earlier commit (fc6fe63, the plain BM25 scorer
before the ranking work), and on a machine shared with other test runs two separate runs of
bench/search_speed.py differ more than the change being measured.  Here every revision's
storaged/{search,tokenize,rank}.py is loaded side by side (read with `git show`, imports renamed),
each builds its own index of the same synthetic corpus (bench/search_speed.py), and each query is
run by every revision in turn, so machine noise hits all alike.  Time is CPU time of the thread
(time.thread_time), not wall time: other processes' load does not count.

A revision is REV:MODE — ranked: storaged.rank.ranked_search with session context, as
search_messages runs it; plain: SearchIndex.search (the core alone).  "." is the working tree.

    python -m bench.search_cmp                                  # . vs HEAD (ranked) vs fc6fe63 (plain)
    python -m bench.search_cmp --revs .:ranked,fc6fe63:plain --sizes 10000,100000 --rounds 3
"""

from __future__ import annotations

import argparse
import gc
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import import_module
from pathlib import Path

from bench import search_speed as bs

ROOT = Path(__file__).resolve().parent.parent

MODULES = ("tokenize", "search", "rank")


def load_revision(rev: str, tmp: Path, tag: str):
    """(SearchIndex, ranked_search or None) of `rev`'s storaged, as package `tag` under tmp."""
    if rev == ".":
        return import_module("storaged.search").SearchIndex, import_module("storaged.rank").ranked_search
    pkg = tmp / tag
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for mod in MODULES:
        try:
            src = subprocess.run(["git", "show", f"{rev}:storaged/{mod}.py"], cwd=ROOT, check=True,
                                 capture_output=True, text=True).stdout
        except subprocess.CalledProcessError:
            continue  # rank.py does not exist before the ranking work
        (pkg / f"{mod}.py").write_text(re.sub(r"\bstoraged\.", f"{tag}.", src))
    if str(tmp) not in sys.path:
        sys.path.insert(0, str(tmp))
    index = import_module(f"{tag}.search").SearchIndex
    try:
        ranked = import_module(f"{tag}.rank").ranked_search
    except ModuleNotFoundError:
        ranked = None
    return index, ranked


def runner(index, ranked, mode: str, limit: int):
    if mode == "plain":
        return lambda q: index.search(q, limit)
    if ranked is None:
        raise SystemExit("this revision has no storaged/rank.py: use :plain")
    return lambda q: ranked(index, q, limit, neighbours=bs.neighbours)


def pct(xs: list[float], p: float) -> float:
    return bs.pct(xs, p) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--revs", default=".:ranked,HEAD:ranked,fc6fe63:plain", help="REV:MODE,... (first = ours)")
    ap.add_argument("--sizes", default="10000,100000")
    ap.add_argument("--rounds", type=int, default=2, help="passes over the queries; p50/p95 over all")
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--limit", type=int, default=20)
    args = ap.parse_args()
    specs = [tuple(s.rsplit(":", 1)) for s in args.revs.split(",")]
    turns, questions = bs.load_turns()
    with tempfile.TemporaryDirectory() as tmp:
        impls = [load_revision(rev, Path(tmp), f"cmp_rev{i}") for i, (rev, _) in enumerate(specs)]
        names = [f"{rev}:{mode}" for rev, mode in specs]
        print(f"CPU ms per query (p50 / p95), {args.queries} LoCoMo questions x {args.rounds} rounds, "
              f"limit {args.limit}, interleaved")
        print(f"{'docs':>8} | " + " | ".join(f"{n:>20}" for n in names) + " | first/last p50")
        for n in (int(s) for s in args.sizes.split(",")):
            docs = bs.synthesize(turns, n)
            qs = random.Random(n).sample(questions, min(args.queries, len(questions)))
            runs = []
            for (index_cls, ranked), (_, mode) in zip(impls, specs):
                idx = index_cls()
                for i, text in enumerate(docs, 1):
                    idx.add(i, text, None, ())
                runs.append(runner(idx, ranked, mode, args.limit))
            for q in qs:  # warm-up: caches, prefix lists, impact tables
                for run in runs:
                    run(q)
            gc.collect()
            times: list[list[float]] = [[] for _ in runs]
            clock = time.thread_time
            for _ in range(args.rounds):
                for i, q in enumerate(qs):  # each revision goes first as often as the others
                    for j in range(len(runs)):
                        j = (i + j) % len(runs)
                        t0 = clock()
                        runs[j](q)
                        times[j].append(clock() - t0)
            cells = [f"{pct(ts, .5):8.2f} / {pct(ts, .95):8.2f}" for ts in times]
            ratio = statistics.median(times[0]) / statistics.median(times[-1])
            print(f"{n:>8} | " + " | ".join(f"{c:>20}" for c in cells) + f" | {ratio:.2f}", flush=True)


if __name__ == "__main__":
    main()
