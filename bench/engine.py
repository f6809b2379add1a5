"""Storage figures: durable write latency and throughput, start-up time and memory.

    python -m bench.engine [--writes 2000] [--sizes 100000,1000000] [--json out.json]

Each figure of ours stands beside SQLite (WAL, synchronous=FULL, FTS5) measured in the same run.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import tempfile
import threading
import time
from typing import Any

import zmq
from ulid import ULID

from protocol.config import default_endpoint
from protocol.requests import DeleteMessage
from protocol.validation import validate
from protocol.wire import decode, encode_request
from storaged.fileio import FileIO
from storaged.store import Store

from .common import (SqliteBaseline, write_json, corpus, print_table, ratio, rss_bytes, start_daemon, stop, summary_ms)


class NoSyncIO(FileIO):
    """Bulk-loading a benchmark store only: the figures measured afterwards use real fsyncs."""

    def sync(self, fd: int) -> None:
        self.counters.flush_calls += 1


def engine_writes(tmp: str, n: int) -> dict[str, Any]:
    texts = [c for _, c in corpus(n, seed=3)]
    # raw fsync floor: append ~the same bytes and fdatasync
    path = os.path.join(tmp, "raw")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    raw = []
    for t in texts:
        data = t.encode() + b"x" * 200
        t0 = time.perf_counter()
        os.write(fd, data)
        os.fdatasync(fd)
        raw.append(time.perf_counter() - t0)
    os.close(fd)
    store = Store.open(os.path.join(tmp, "engine"))
    ours = []
    for t in texts:
        args = validate("write_message", {"session_id": "bench", "role": "user", "content": t,
                                          "metadata_json": '{"tags":["bench"],"importance":60}'})
        rid = str(ULID())
        t0 = time.perf_counter()
        store.write_message(args, rid)
        ours.append(time.perf_counter() - t0)
    store.close()
    base = SqliteBaseline(os.path.join(tmp, "engine.sqlite"))
    theirs = []
    for t in texts:
        mid = str(ULID())
        t0 = time.perf_counter()
        base.write(mid, "bench", t, '{"tags":["bench"],"importance":60}')
        theirs.append(time.perf_counter() - t0)
    base.close()
    o, s, r = summary_ms(ours), summary_ms(theirs), summary_ms(raw)
    return {"ours": o, "sqlite": s, "append_fdatasync_floor": r,
            "ratio_p50": ratio(o["p50_ms"], s["p50_ms"]),
            "overhead_over_fsync_p50_ms": round(o["p50_ms"] - r["p50_ms"], 4)}


def _client(endpoint: str):
    s = zmq.Context.instance().socket(zmq.REQ)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(endpoint)

    def call(op: str, args: dict[str, Any]) -> dict[str, Any]:
        s.send(encode_request(op, args, str(ULID())))
        return decode(s.recv(), max_bytes=1 << 30)
    return s, call


def daemon_writes(tmp: str, n: int, writers_list=(1, 4, 8)) -> dict[str, Any]:
    data_dir = os.path.join(tmp, "daemon")
    proc, _ = start_daemon(data_dir)
    ep = default_endpoint(data_dir)
    texts = [c for _, c in corpus(n, seed=5)]
    try:
        sock, call = _client(ep)
        lat = []
        for t in texts:
            t0 = time.perf_counter()
            r = call("write_message", {"session_id": "lat", "role": "user", "content": t})
            lat.append(time.perf_counter() - t0)
            assert r["status"] == "OK", r
        sock.close()
        throughput = {}
        for w in writers_list:
            throughput[w] = _throughput_daemon(ep, texts, w)
    finally:
        stop(proc)
    sql_tp = {w: _throughput_sqlite(os.path.join(tmp, f"tp{w}.sqlite"), texts, w) for w in writers_list}
    return {"latency": summary_ms(lat), "throughput": {
        str(w): {"ours_per_s": throughput[w], "sqlite_per_s": sql_tp[w], "ratio": ratio(throughput[w], sql_tp[w])}
        for w in writers_list}}


def _rate(run, writers: int, done: list[int]) -> float:
    """Run ``run(k)`` in ``writers`` threads at once; writes per second over all of them."""
    threads = [threading.Thread(target=run, args=(k,)) for k in range(writers)]
    t0 = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return round(sum(done) / (time.perf_counter() - t0), 1)


def _throughput_daemon(ep: str, texts: list[str], writers: int) -> float:
    per = max(1, len(texts) // writers)
    done = []

    def run(k: int) -> None:
        sock, call = _client(ep)
        for t in texts[k * per:(k + 1) * per]:
            assert call("write_message", {"session_id": f"tp{k}", "role": "user", "content": t})["status"] == "OK"
        sock.close()
        done.append(per)

    return _rate(run, writers, done)


def _throughput_sqlite(path: str, texts: list[str], writers: int) -> float:
    SqliteBaseline(path).close()
    per = max(1, len(texts) // writers)
    done = []

    def run(k: int) -> None:
        b = SqliteBaseline(path)
        b.db.execute("PRAGMA busy_timeout=60000")
        for t in texts[k * per:(k + 1) * per]:
            while True:
                try:
                    b.write(str(ULID()), f"tp{k}", t)
                    break
                except sqlite3.OperationalError:
                    b.db.execute("ROLLBACK") if b.db.in_transaction else None
        b.close()
        done.append(per)

    return _rate(run, writers, done)


def build_store(data_dir: str, n: int) -> int:
    """A store of n messages, bulk-loaded; returns the stored text bytes."""
    store = Store.open(data_dir, io=NoSyncIO())
    text = 0
    for sid, content in corpus(n, seed=11):
        store.write_message(validate("write_message", {"session_id": sid, "role": "user", "content": content}))
        text += len(content.encode())
    store.close()
    os.sync()
    return text


def startup(tmp: str, n: int) -> dict[str, Any]:
    data_dir = os.path.join(tmp, f"start{n}")
    t0 = time.perf_counter()
    text = build_store(data_dir, n)
    build_s = time.perf_counter() - t0
    out: dict[str, Any] = {"messages": n, "text_bytes": text, "build_s": round(build_s, 1)}
    # 1) no snapshot: replay the whole log; the clean stop then writes the snapshot
    proc, ready = start_daemon(data_dir)
    out["replay_start_s"] = round(ready, 3)
    out["rss_bytes"] = rss_bytes(proc.pid)
    t1 = time.perf_counter()
    stop(proc)
    out["stop_with_snapshot_s"] = round(time.perf_counter() - t1, 3)
    # 2) snapshot, then log tail
    proc, ready = start_daemon(data_dir)
    out["snapshot_start_s"] = round(ready, 3)
    out["rss_bytes_after_snapshot_start"] = rss_bytes(proc.pid)
    stop(proc)
    out["rss_over_text"] = round(out["rss_bytes"] / max(1, text), 2)
    out["log_bytes"] = os.path.getsize(os.path.join(data_dir, "log"))
    out["snapshot_bytes"] = os.path.getsize(os.path.join(data_dir, "snapshot"))
    # SQLite: open + first query on the same corpus (its start-up is lazy; shown for scale)
    db_path = os.path.join(tmp, f"start{n}.sqlite")
    base = SqliteBaseline(db_path)
    base.bulk((str(ULID()), sid, c) for sid, c in corpus(n, seed=11))
    base.close()
    t2 = time.perf_counter()
    db = sqlite3.connect(db_path)
    db.execute("SELECT count(*) FROM messages").fetchone()
    out["sqlite_open_count_s"] = round(time.perf_counter() - t2, 3)
    db.close()
    shutil.rmtree(data_dir, ignore_errors=True)
    os.unlink(db_path)
    return out


def rebuild_pause(tmp: str, n: int, deletes: float = 0.2) -> dict[str, Any]:
    """rebuild_index at n messages (a fifth deleted) while a client pings the daemon non-stop:
    the rebuild's duration and the longest round trip the request loop gave meanwhile."""
    data_dir = os.path.join(tmp, f"rebuild{n}")
    build_store(data_dir, n)
    store = Store.open(data_dir, io=NoSyncIO())
    for m in list(store.by_seq.values())[:: int(1 / deletes)]:
        store.delete_message(DeleteMessage(message_id=m.message_id, session_id=None))
    store.index_step(None)  # as a daemon's clean stop does: the snapshot holds the whole search index
    store.write_snapshot()  # a fast start; the rebuild is what is measured
    store.close()
    proc, _ = start_daemon(data_dir)
    try:
        sock, call = _client(default_endpoint(data_dir))
        idle = []
        for _ in range(200):
            t0 = time.perf_counter()
            call("ping", {})
            idle.append(time.perf_counter() - t0)
        t_start = time.perf_counter()
        r = call("rebuild_index", {})
        rid = r["rebuild_id"]
        pings: list[float] = []
        polls = 0
        while True:
            t0 = time.perf_counter()
            call("ping", {})
            pings.append(time.perf_counter() - t0)
            polls += 1
            if polls % 20 == 0:
                st = call("rebuild_status", {"rebuild_id": rid})
                if st["status"] != "REBUILDING":
                    break
        total = time.perf_counter() - t_start
        sock.close()
    finally:
        stop(proc)
    return {"messages": n, "live_after": st.get("messages_indexed"), "rebuild_s": round(total, 2),
            "ping_idle": summary_ms(idle), "ping_during_rebuild": summary_ms(pings),
            "longest_pause_ms": round(max(pings) * 1000, 1), "figures": st,
            "sqlite_vacuum_and_fts_rebuild_s": _sqlite_rebuild(tmp, n, deletes)}


def _sqlite_rebuild(tmp: str, n: int, deletes: float) -> float:
    """SQLite's counterpart of rebuild_index on the same corpus: VACUUM plus an FTS5 'rebuild'."""
    path = os.path.join(tmp, f"rebuild{n}.sqlite")
    base = SqliteBaseline(path)
    base.bulk((str(ULID()), sid, c) for sid, c in corpus(n, seed=11))
    step = int(1 / deletes)
    base.db.execute("DELETE FROM messages WHERE id % ? = 1", (step,))
    t0 = time.perf_counter()
    base.db.execute("INSERT INTO fts(fts) VALUES('rebuild')")
    base.db.execute("VACUUM")
    seconds = time.perf_counter() - t0
    base.close()
    os.unlink(path)
    return round(seconds, 2)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--writes", type=int, default=2000)
    p.add_argument("--sizes", default="100000")
    p.add_argument("--rebuild-size", type=int, default=100000, help="store size for the rebuild figure (0: skip)")
    p.add_argument("--json")
    a = p.parse_args(argv)
    sizes = [int(x) for x in a.sizes.split(",") if x]
    tmp = tempfile.mkdtemp(prefix="convmem-bench-")
    try:
        res: dict[str, Any] = {"engine_write": engine_writes(tmp, a.writes)}
        res["daemon_write"] = daemon_writes(tmp, a.writes)
        res["startup"] = [startup(tmp, n) for n in sizes]
        if a.rebuild_size:
            res["rebuild"] = rebuild_pause(tmp, a.rebuild_size)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    e = res["engine_write"]
    print_table("Durable write latency (engine, in-process)", [
        ["convmem engine", e["ours"]["p50_ms"], e["ours"]["p95_ms"], e["ratio_p50"]],
        ["SQLite WAL FULL", e["sqlite"]["p50_ms"], e["sqlite"]["p95_ms"], 1.0],
        ["append+fdatasync floor", e["append_fdatasync_floor"]["p50_ms"], e["append_fdatasync_floor"]["p95_ms"], ""],
    ], ["", "p50 ms", "p95 ms", "ratio"])
    d = res["daemon_write"]
    print_table("Durable write through the daemon protocol", [
        ["latency", d["latency"]["p50_ms"], d["latency"]["p95_ms"]]], ["", "p50 ms", "p95 ms"])
    print_table("Write throughput (durable, acknowledged)", [
        [w, v["ours_per_s"], v["sqlite_per_s"], v["ratio"]] for w, v in d["throughput"].items()],
        ["writers", "convmem/s", "SQLite/s", "ratio"])
    print_table("Start-up and memory", [
        [s["messages"], s["replay_start_s"], s["snapshot_start_s"], s["stop_with_snapshot_s"],
         round(s["rss_bytes"] / 2**20, 1), round(s["text_bytes"] / 2**20, 1), s["rss_over_text"]]
        for s in res["startup"]],
        ["messages", "start (replay) s", "start (snapshot) s", "stop+snapshot s", "RSS MiB", "text MiB", "RSS/text"])
    if "rebuild" in res:
        r = res["rebuild"]
        print_table("rebuild_index beside the request loop", [[
            r["messages"], r["live_after"], r["rebuild_s"], r["ping_idle"]["p50_ms"],
            r["ping_during_rebuild"]["p50_ms"], r["ping_during_rebuild"]["p95_ms"], r["longest_pause_ms"],
            r["sqlite_vacuum_and_fts_rebuild_s"]]],
            ["messages", "live", "rebuild s", "ping idle p50", "ping p50 during", "p95 during", "longest ms",
             "SQLite VACUUM+FTS rebuild s"])
    return write_json(a.json, res)


if __name__ == "__main__":
    main()
