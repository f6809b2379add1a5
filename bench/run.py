"""The one benchmark command: every figure of ours beside SQLite's, measured in the same run.

    python -m bench.run                 # default sizes, ~10-12 minutes on 2 cores
    python -m bench.run --large         # adds 1M messages / events (search, start-up, history), ~60 minutes
    python -m bench.run --quick         # a smoke run (seconds): checks the benchmarks run, not speed

Each part runs in its own process (so one part's memory does not colour another's figures) and
writes JSON; this command prints one table and writes everything to --json
(default bench/results/latest.json). The machine is shared and noisy: figures are medians and
p95 over many calls, and every ratio compares figures taken in the same run.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

from .common import LOCOMO, REPO, print_table


def _part(name: str, cmd: list[str], out: dict[str, Any], tmp: str, timeout: float) -> None:
    path = os.path.join(tmp, f"{name}.json")
    t0 = time.monotonic()
    print(f"[bench] {name}: {' '.join(cmd[2:])}", file=sys.stderr, flush=True)
    proc = subprocess.run([*cmd, "--json", path], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, timeout=timeout)
    if proc.returncode != 0:
        out[name] = {"error": f"exit {proc.returncode}", "stderr": proc.stderr[-2000:]}
        print(proc.stdout, proc.stderr, file=sys.stderr)
        return
    with open(path) as f:
        out[name] = json.load(f)
    out[name]["_seconds"] = round(time.monotonic() - t0, 1)


def plan(a: argparse.Namespace) -> list[tuple[str, list[str]]]:
    parts = _plan(a)
    if not os.path.exists(LOCOMO):  # the data set is not shipped; without it, skip what needs it
        print(f"[bench] {LOCOMO} not found: skipping the search figures", file=sys.stderr)
        parts = [p for p in parts if not p[0].startswith("search")]
    return parts


def _plan(a: argparse.Namespace) -> list[tuple[str, list[str]]]:
    py = [sys.executable]
    if a.quick:
        return [
            ("engine", py + ["-m", "bench.engine", "--writes", "50", "--sizes", "2000", "--rebuild-size", "3000"]),
            ("e2e", py + ["-m", "bench.e2e", "--writes", "20", "--messages", "1000", "--reads", "20"]),
            ("search_speed", py + ["-m", "bench.search_speed", "--quick", "--no-snapshot"]),
            ("search_quality", py + ["-m", "bench.search_quality"]),
            ("crash", py + ["-m", "bench.crash_loop", "--kills", "5", "--writers", "2"]),
            ("history", py + ["-m", "bench.history_bench", "--quick"]),
        ]
    search_sizes = "10000,100000,1000000" if a.large else "10000,100000"
    start_sizes = "100000,1000000" if a.large else "100000"
    history_sizes = "100000,1000000" if a.large else "100000"
    return [
        ("engine", py + ["-m", "bench.engine", "--writes", str(a.writes), "--sizes", start_sizes,
                         "--rebuild-size", "100000"]),
        ("e2e", py + ["-m", "bench.e2e", "--writes", str(a.writes // 2), "--messages", "100000"]),
        ("search_speed", py + ["-m", "bench.search_speed", "--sizes", search_sizes, "--no-snapshot"]),
        ("search_quality", py + ["-m", "bench.search_quality"]),
        ("crash", py + ["-m", "bench.crash_loop", "--kills", str(a.kills)]),
        ("history", py + ["-m", "bench.history_bench", "--sizes", history_sizes]),
    ]


def summarise(r: dict[str, Any]) -> list[list[Any]]:
    rows: list[list[Any]] = []

    def row(figure: str, ours: Any, base: Any, unit: str = "ms") -> None:
        ratio = round(ours / base, 2) if isinstance(ours, (int, float)) and isinstance(base, (int, float)) and base else ""
        rows.append([figure, ours, base, ratio, unit])

    e = r.get("engine", {})
    if "engine_write" in e:
        w = e["engine_write"]
        row("durable write, engine p50", w["ours"]["p50_ms"], w["sqlite"]["p50_ms"])
        row("durable write, engine p95", w["ours"]["p95_ms"], w["sqlite"]["p95_ms"])
        row("  fdatasync floor p50 (same bytes)", w["append_fdatasync_floor"]["p50_ms"], "", "ms")
        d = e["daemon_write"]
        row("durable write, daemon protocol p50", d["latency"]["p50_ms"], w["sqlite"]["p50_ms"])
        row("durable write, daemon protocol p95", d["latency"]["p95_ms"], w["sqlite"]["p95_ms"])
        for k, v in d["throughput"].items():
            row(f"write throughput, {k} writers", v["ours_per_s"], v["sqlite_per_s"], "writes/s")
        for s in e["startup"]:
            row(f"start-up at {s['messages']:,} (snapshot)", s["snapshot_start_s"], s["sqlite_open_count_s"], "s")
            row(f"start-up at {s['messages']:,} (full log replay)", s["replay_start_s"], "", "s")
            row(f"RSS at {s['messages']:,} (text {s['text_bytes'] / 2**20:.0f} MiB)",
                round(s["rss_bytes"] / 2**20, 1), "", "MiB")
        if "rebuild" in e:
            rb = e["rebuild"]
            row(f"rebuild_index at {rb['messages']:,} (SQLite: VACUUM + FTS5 rebuild)", rb["rebuild_s"],
                rb.get("sqlite_vacuum_and_fts_rebuild_s", ""), "s")
            row("  longest request-loop pause during it", rb["longest_pause_ms"], "", "ms")
    x = r.get("e2e", {})
    if "mcp_stdio_write" in x:
        w = x["mcp_stdio_write"]
        row("durable write, MCP stdio, raw JSON-RPC client p50", w["ours_raw_jsonrpc"]["p50_ms"], w["sqlite"]["p50_ms"])
        row("durable write, MCP stdio, raw JSON-RPC client p95", w["ours_raw_jsonrpc"]["p95_ms"], w["sqlite"]["p95_ms"])
        row("durable write, MCP stdio, Python SDK client p50", w["ours"]["p50_ms"], w["sqlite"]["p50_ms"])
        row("durable write, MCP stdio, Python SDK client p95", w["ours"]["p95_ms"], w["sqlite"]["p95_ms"])
        for k, v in x["reads"].items():
            row(f"read {k} p50", v["ours"]["p50_ms"], v["sqlite_in_process"]["p50_ms"])
    ss = r.get("search_speed", {})
    for s in ss.get("results", []):
        row(f"search at {s['size']:,} p50", round(s["ours_p50_ms"], 3), round(s["fts5_p50_ms"], 3))
        row(f"search at {s['size']:,} p95", round(s["ours_p95_ms"], 3), round(s["fts5_p95_ms"], 3))
        row(f"search index at {s['size']:,}", round(s["ours_memory_bytes"] / 2**20, 1),
            round(s["fts5_db_bytes"] / 2**20, 1), "MiB")
    q = r.get("search_quality", {})
    if "locomo" in q:
        lo = q["locomo"]
        row("LoCoMo recall@5", lo["ours"]["recall@5"], lo["fts5_all_words"]["recall@5"], "")
        row("LoCoMo recall@10", lo["ours"]["recall@10"], lo["fts5_all_words"]["recall@10"], "")
        ja = q.get("japanese", {}).get("results", {})
        if "ours" in ja:
            for k in ("recall@1", "recall@5"):
                row(f"Japanese {k} (vs FTS5 trigram, OR of trigrams)", ja["ours"].get(k),
                    ja.get("fts5_trigram_or", {}).get(k), "")
    for h in r.get("history", {}).get("results", []):
        n = f"{h['size']:,}"
        row(f"history ingest at {n} events", h["ingest"]["events_per_s"], h["sqlite_load"]["events_per_s"],
            "events/s")
        lat = h.get("latency", {})
        for key, label in (("search_all", "search_sessions"), ("search_error", "search_sessions, tool_response")):
            if key in lat:
                row(f"{label} at {n} p50", lat[key]["ours"]["p50_ms"], lat[key]["sqlite"]["p50_ms"])
                row(f"{label} at {n} p95", lat[key]["ours"]["p95_ms"], lat[key]["sqlite"]["p95_ms"])
        for key, label in (("open_event", "open event"), ("open_turn", "open turn"),
                           ("open_turn_limit20", "open turn limit 20"), ("open_session", "open session")):
            if key in lat:
                row(f"{label} at {n} p50", lat[key]["ours"]["p50_ms"], lat[key]["sqlite"]["p50_ms"])
        d = h.get("daemon", {})
        if "rss_after_ingest_bytes" in d:
            row(f"history: daemon RSS after ingest at {n} (SQLite: db size)",
                round(d["rss_after_ingest_bytes"] / 2**20, 1), round(h["sqlite_load"]["db_bytes"] / 2**20, 1), "MiB")
            row(f"history: start-up at {n} (snapshot)", d["start_from_snapshot_s"], h.get("sqlite_open_count_s", ""),
                "s")
        ab = h.get("agent_bytes")
        if ab:
            row(f"agent bytes at {n}, search_sessions+open (SQLite col: search_messages) p50", ab["history_total_p50"],
                ab["memory_total_p50"], "B")
    c = r.get("crash", {})
    if "kills" in c:
        row(f"crash run: {c['kills']} SIGKILLs, acknowledged writes", c.get("acknowledged"), "", "")
        row("crash run: lost / duplicated", f"{c.get('lost')} / {c.get('duplicated')}", "", "")
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--large", action="store_true", help="add 1M-message figures")
    p.add_argument("--writes", type=int, default=2000)
    p.add_argument("--kills", type=int, default=100)
    p.add_argument("--json", default=os.path.join(REPO, "bench", "results", "latest.json"))
    a = p.parse_args(argv)
    results: dict[str, Any] = {"started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "quick": a.quick,
                               "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]}}
    with tempfile.TemporaryDirectory(prefix="convmem-bench-run-") as tmp:
        for name, cmd in plan(a):
            _part(name, cmd, results, tmp, timeout=3600)
    rows = summarise(results)
    print_table("convmem vs SQLite (WAL, synchronous=FULL, FTS5 porter unicode61), same run", rows,
                ["figure", "convmem", "SQLite", "ratio", "unit"])
    os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
    with open(a.json, "w") as f:
        json.dump({**results, "table": rows}, f, indent=2)
    print(f"\nwritten to {a.json}")
    failed = [k for k, v in results.items() if isinstance(v, dict) and "error" in v]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
