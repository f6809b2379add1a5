"""The search kernels side by side on one store: ``python -m bench.search_kernels --dir D``.

Opens the data directory ``D/data`` of a ``bench.scale`` run in this process (no daemon; the daemon must
be stopped) and times its query mix (``D/corpus/queries.json``) through the tools' own code paths
(search_messages, search_sessions) twice: with the window kernel (block-max pruning over the segments'
window bounds, ``SearchIndex._pool_windows``) and with the array kernel alone (every posting of every
list). A warm-up pass of each precedes its timed pass. Prints per tool and kind the median, p95 and p99
in ms and the ratio of the medians, and, for the queries the window kernel took, the share of their
postings it read (a store written before window bounds has none: its queries read everything).

Why in-process: a daemon's reply adds ~1 ms of transport to both sides alike; here the difference is
the kernel's. ``bench.scale --phases search`` measures the same mix through the daemon.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any, Callable

from protocol import history as H
from protocol import validation as V
from storaged import search as S
from storaged import views
from storaged.history import HistoryViews
from storaged.store import Store


def _stats(values: list[float]) -> dict[str, float]:
    v = sorted(values)
    return {"p50": round(statistics.median(v), 2), "p95": round(v[int(0.95 * (len(v) - 1))], 2),
            "p99": round(v[int(0.99 * (len(v) - 1))], 2), "n": len(v)}


def _timed(queries: list[tuple[str, str]], run: Callable[[str], Any]) -> dict[str, list[float]]:
    for _, q in queries:
        run(q)
    out: dict[str, list[float]] = {}
    for kind, q in queries:
        t = time.perf_counter()
        run(q)
        out.setdefault(kind, []).append(1000 * (time.perf_counter() - t))
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", required=True, help="a bench.scale directory (its data/ and corpus/)")
    p.add_argument("--json", help="write the results here too")
    a = p.parse_args(argv)
    with open(os.path.join(a.dir, "corpus", "queries.json")) as f:
        queries = [(k, q) for k, q in json.load(f)]
    t0 = time.perf_counter()
    store = Store.open(os.path.join(a.dir, "data"))
    print(f"open {time.perf_counter() - t0:.2f} s, {len(queries)} queries")
    hv = HistoryViews(store)
    tools = {
        "search_messages": lambda q: views.search_messages(store, V.validate_search_messages({"query": q, "limit": 10})),
        "search_sessions": lambda q: hv.search_sessions(H.validate_search_sessions({"query": q, "n_hits": 10})),
    }
    # the share of postings read, for the queries the window kernel took
    shares: list[float] = []
    real = S.SearchIndex._pool_windows

    def counted(self, lists, limit, *rest):
        got = real(self, lists, limit, *rest)
        # a query the bounds hardly prune is handed on (None) to the paths that read every list
        shares.append(got[3].postings_read / max(1, sum(tl.size for tl in lists)) if got is not None else 1.0)
        return got

    results: dict[str, Any] = {}
    window_min = S._WINDOW_MIN_POSTINGS
    try:
        S.SearchIndex._pool_windows = counted
        for tool, run in tools.items():
            shares.clear()
            S._WINDOW_MIN_POSTINGS = window_min
            win = _timed(queries, run)
            taken = sorted(shares)
            S._WINDOW_MIN_POSTINGS = 1 << 62
            arr = _timed(queries, run)
            results[tool] = {
                "windows": {k: _stats(v) for k, v in win.items()} | {"all": _stats(sum(win.values(), []))},
                "arrays": {k: _stats(v) for k, v in arr.items()} | {"all": _stats(sum(arr.values(), []))},
                "window_queries": len(taken),
                "scored_share_median": round(statistics.median(taken), 3) if taken else None,
            }
    finally:
        S.SearchIndex._pool_windows = real
        S._WINDOW_MIN_POSTINGS = window_min
        store.close()
    for tool, r in results.items():
        print(f"\n{tool}: {r['window_queries']} window-kernel calls (of the timed and warm-up passes), "
              f"median share of their postings scored {r['scored_share_median']}")
        print(f"{'kind':10} {'windows p50/p95/p99 ms':>26} {'arrays p50/p95/p99 ms':>26} {'p50 ratio':>10}")
        for kind in r["windows"]:
            w, x = r["windows"][kind], r["arrays"][kind]
            print(f"{kind:10} {w['p50']:>8} {w['p95']:>8} {w['p99']:>8} {x['p50']:>8} {x['p95']:>8} {x['p99']:>8}"
                  f" {x['p50'] / max(w['p50'], 1e-9):>10.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
