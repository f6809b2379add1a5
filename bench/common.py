"""Shared pieces of the benchmarks: statistics, the corpus, the SQLite baseline, daemon processes."""
from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import statistics
import subprocess
import sys
import time
from typing import Any, Iterable, Iterator

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOCOMO = os.environ.get("CONVMEM_LOCOMO", os.path.join(REPO, "..", "shared", "data", "locomo-dev.json"))


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    if not s:
        return float("nan")
    k = min(len(s) - 1, max(0, int(round(p / 100 * (len(s) - 1)))))
    return s[k]


def summary_ms(seconds: list[float]) -> dict[str, float]:
    ms = [x * 1000 for x in seconds]
    return {"p50_ms": round(statistics.median(ms), 4), "p95_ms": round(pct(ms, 95), 4), "n": len(ms)}


def ratio(ours: float, base: float) -> float:
    return round(ours / base, 3) if base else float("nan")


def turns() -> list[str]:
    """Realistic conversational text: the LoCoMo turns if the data set is beside the repo."""
    try:
        with open(LOCOMO) as f:
            data = json.load(f)
    except OSError:
        data = []
    out = []
    for sample in data:
        conv = sample["conversation"]
        for key, value in conv.items():
            if key.startswith("session_") and isinstance(value, list):
                for t in value:
                    out.append(f"{t['speaker']}: {t['text']}")
    if not out:
        # Say so: made-up words are far cheaper to index than real text, so a run on them is not
        # comparable with one on LoCoMo (e.g. a checkout in another directory, with no ../shared).
        print(f"[bench] {LOCOMO} not found: the corpus is made-up words, not comparable with a LoCoMo run "
              "(set CONVMEM_LOCOMO)", file=sys.stderr)
        rng = random.Random(7)
        words = ("memory durable search session message daemon index snapshot recovery log write read "
                 "project decision database migration plan review deploy test").split()
        out = [" ".join(rng.choice(words) for _ in range(rng.randint(8, 30))) for _ in range(5000)]
    return out


def corpus(n: int, seed: int = 1) -> Iterator[tuple[str, str]]:
    """(session_id, content) pairs: turns recombined so a large corpus is not one text repeated."""
    base = turns()
    rng = random.Random(seed)
    for i in range(n):
        a = base[rng.randrange(len(base))]
        if rng.random() < 0.5:
            a = a + " " + base[rng.randrange(len(base))].split(": ", 1)[-1]
        yield f"session-{i // 200:05d}", a


class SqliteBaseline:
    """The baseline a user would otherwise reach for: WAL, synchronous=FULL, an FTS5 index."""

    def __init__(self, path: str, fts: bool = True) -> None:
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.execute("CREATE TABLE IF NOT EXISTS messages (id INTEGER PRIMARY KEY, message_id TEXT UNIQUE, "
                        "session_id TEXT, ts INTEGER, role TEXT, content TEXT, metadata TEXT)")
        self.db.execute("CREATE INDEX IF NOT EXISTS by_session ON messages(session_id, id)")
        self.fts = fts
        if fts:
            self.db.execute("CREATE VIRTUAL TABLE IF NOT EXISTS fts USING fts5(content, "
                            "content='messages', content_rowid='id', tokenize='porter unicode61')")

    def write(self, message_id: str, session_id: str, content: str, metadata: str = "{}") -> None:
        cur = self.db.cursor()
        cur.execute("BEGIN")
        cur.execute("INSERT INTO messages(message_id, session_id, ts, role, content, metadata) "
                    "VALUES (?,?,?,?,?,?)", (message_id, session_id, int(time.time() * 1000), "user", content,
                                             metadata))
        if self.fts:
            cur.execute("INSERT INTO fts(rowid, content) VALUES (?, ?)", (cur.lastrowid, content))
        cur.execute("COMMIT")

    def bulk(self, rows: Iterable[tuple[str, str, str]]) -> None:
        cur = self.db.cursor()
        cur.execute("PRAGMA synchronous=OFF")
        cur.execute("BEGIN")
        for mid, sid, content in rows:
            cur.execute("INSERT INTO messages(message_id, session_id, ts, role, content, metadata) "
                        "VALUES (?,?,?,?,?,?)", (mid, sid, 0, "user", content, "{}"))
            if self.fts:
                cur.execute("INSERT INTO fts(rowid, content) VALUES (?, ?)", (cur.lastrowid, content))
        cur.execute("COMMIT")
        cur.execute("PRAGMA synchronous=FULL")

    def close(self) -> None:
        self.db.close()


def start_daemon(data_dir: str, endpoint: str | None = None, timeout: float = 600.0,
                 log_path: str | None = None, profile: str | None = None) -> tuple[subprocess.Popen, float]:
    """Start ``python -m storaged`` (under cProfile, stats to ``profile``, if given) and wait until it
    answers ping as loaded. Returns (process, seconds to ready)."""
    import msgpack
    import zmq

    from protocol.config import default_endpoint
    from protocol.wire import encode_request
    from ulid import ULID

    ep = endpoint or default_endpoint(data_dir)
    err = open(log_path, "ab") if log_path else subprocess.DEVNULL
    t0 = time.monotonic()
    pre = ["-m", "cProfile", "-o", profile] if profile else []
    proc = subprocess.Popen([sys.executable, *pre, "-m", "storaged", "--data-dir", data_dir, "--endpoint", ep],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, cwd=REPO)
    ctx = zmq.Context.instance()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"daemon exited with {proc.returncode}" + (f" (log: {log_path})" if log_path else ""))
        s = ctx.socket(zmq.REQ)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(ep)
        s.send(encode_request("ping", {}, str(ULID())))
        if s.poll(200):
            reply = msgpack.unpackb(s.recv(), raw=False)
            s.close()
            if not reply.get("loading"):  # it answers while it loads; ready means loaded
                return proc, time.monotonic() - t0
            time.sleep(0.02)
            continue
        s.close()
    stop(proc)
    raise RuntimeError("daemon did not become ready")


def stop(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 120.0) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def proc_mem(pid: int | str = "self") -> dict[str, float]:
    """VmRSS, RssAnon, RssFile and VmHWM (peak) of a process from /proc, in MiB: RssFile is what
    mmapped files and the page cache hold (reclaimable), RssAnon the heap."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
                out[k] = round(int(v.split()[0]) / 1024, 1)
    by_file = mapped_rss(pid)
    if by_file:
        out["RssFile_by"] = by_file
    return out


def _file_kind(path: str) -> str:
    """What a mapped file is, by its name (storaged/layout.py's names): what the breakdown sums by."""
    name = os.path.basename(path)
    if name.startswith("index.") and name.endswith(".seg"):
        return "index segments"
    if name.startswith("rows.") and name.endswith(".seg"):
        return "row segments"
    if name in ("log", "snapshot"):
        return name
    return "code and other"


def mapped_rss(pid: int | str = "self") -> dict[str, float]:
    """The resident pages of a process's file mappings, in MiB by kind of file (/proc/PID/smaps):
    which of the daemon's files its RssFile is (a segment read whole at start, postings read by
    queries) -- anonymous memory is left out (the status' RssAnon says it)."""
    out: dict[str, float] = {}
    path = None
    try:
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                head = line.split(None, 5)
                if head and "-" in head[0] and len(head) >= 5 and ":" not in head[0]:
                    path = head[5].strip() if len(head) == 6 and head[5].startswith("/") else None
                elif path and head and head[0] == "Rss:":
                    kind = _file_kind(path.removesuffix(" (deleted)"))
                    out[kind] = out.get(kind, 0.0) + int(head[1]) / 1024
    except OSError:
        return {}
    return {k: round(v, 1) for k, v in sorted(out.items())}


def print_table(title: str, rows: list[list[Any]], header: list[str]) -> None:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    print(f"\n## {title}")
    print("  ".join(str(h).ljust(w) for h, w in zip(header, widths)))
    for r in rows:
        print("  ".join(str(x).ljust(w) for x, w in zip(r, widths)))


def write_json(path: str | None, res: dict[str, Any]) -> dict[str, Any]:
    """Write the results where --json says (if it says) and hand them back."""
    if path:
        with open(path, "w") as f:
            json.dump(res, f, indent=2)
    return res
