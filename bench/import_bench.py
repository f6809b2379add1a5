"""Bulk import: ``convmem import`` of N messages (default 100k) vs SQLite bulk insert of the same rows.

convmem: the real CLI as a subprocess against a real daemon on an empty data directory — read the
JSON Lines file, batches of <= 1000 messages (and < 4 MiB), each batch validated, appended to the
log with one fsync, and indexed for search before the next is sent. The time includes the CLI's
start-up (measured separately as ``convmem health``). Re-import: the same file again (every message
already there: idempotent, nothing written).

SQLite: the same file read and parsed the same way, every field inserted (metadata as JSON text),
one transaction, WAL, synchronous=FULL (one durable commit); once without and once with an FTS5
index on content (convmem's import also makes the messages searchable).

    python -m bench.import_bench                      # 100k messages
    python -m bench.import_bench --messages 20000 --json out.json    (--json - prints it)
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ulid import ULID

from bench.common import REPO, corpus, print_table, start_daemon, stop

_SCRIPT = Path(sys.executable).with_name("convmem")
CONVMEM = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "admin"]
T0 = 1_735_689_600_000  # 2025-01-01T00:00:00Z


def make_file(path: str, n: int) -> int:
    """N messages as ``convmem export`` writes them; returns the file size."""
    kinds = ("conversation", "episode", "semantic")
    with open(path, "w", encoding="utf-8") as f:
        for i, (sid, content) in enumerate(corpus(n)):
            ts = T0 + i * 37
            md: dict[str, Any] = {"tags": ["bench", f"topic-{i % 17}"], "memory_tier": "short",
                                  "memory_kind": kinds[i % 3], "importance": i % 101, "relations": [],
                                  "source_message_ids": []}
            if i % 10 == 0:
                md["summary"] = content[:80]
            mid = str(ULID.from_bytes(((ts << 80) | (i + 1)).to_bytes(16, "big")))
            f.write(json.dumps({"message_id": mid, "session_id": sid, "timestamp": ts,
                                "role": "user" if i % 2 else "assistant", "content": content,
                                "revision": 1, "updated_at": ts, "metadata": md}, ensure_ascii=False) + "\n")
    return os.path.getsize(path)


def cli(data_dir: str, *args: str) -> tuple[float, dict[str, Any] | str]:
    env = dict(os.environ, PYTHONPATH=REPO)
    for k in ("CONVMEM_ENDPOINT", "CONVMEM_DATA_DIR"):
        env.pop(k, None)
    t = time.perf_counter()
    p = subprocess.run([*CONVMEM, "--data-dir", data_dir, "--no-spawn", "--timeout", "60", *args],
                       capture_output=True, text=True, env=env, cwd=REPO)
    dt = time.perf_counter() - t
    if p.returncode != 0:
        raise RuntimeError(f"convmem {' '.join(args)} failed ({p.returncode}): {p.stderr[-2000:]}")
    try:
        return dt, json.loads(p.stdout)
    except ValueError:
        return dt, p.stdout


def sqlite_bulk(db_path: str, jsonl: str, fts: bool) -> float:
    t = time.perf_counter()
    db = sqlite3.connect(db_path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("CREATE TABLE messages (seq INTEGER PRIMARY KEY, message_id TEXT UNIQUE NOT NULL, session_id TEXT, "
               "ts INTEGER, role TEXT, content TEXT, revision INTEGER, updated_at INTEGER, metadata TEXT)")
    db.execute("CREATE INDEX by_session ON messages(session_id, seq)")
    if fts:
        db.execute("CREATE VIRTUAL TABLE fts USING fts5(content, content='messages', content_rowid='seq', "
                   "tokenize='porter unicode61')")
    cur = db.cursor()
    cur.execute("BEGIN")
    with open(jsonl, "rb") as f:
        for line in f:
            m = json.loads(line.decode("utf-8"))
            cur.execute("INSERT OR IGNORE INTO messages(message_id, session_id, ts, role, content, revision, "
                        "updated_at, metadata) VALUES (?,?,?,?,?,?,?,?)",
                        (m["message_id"], m["session_id"], m["timestamp"], m["role"], m["content"], m["revision"],
                         m["updated_at"], json.dumps(m["metadata"], ensure_ascii=False)))
            if fts and cur.rowcount:
                cur.execute("INSERT INTO fts(rowid, content) VALUES (?, ?)", (cur.lastrowid, m["content"]))
    cur.execute("COMMIT")
    db.close()
    return time.perf_counter() - t


def run(n: int, workdir: str) -> dict[str, Any]:
    jsonl = os.path.join(workdir, "messages.jsonl")
    size = make_file(jsonl, n)
    data_dir = os.path.join(workdir, "data")
    proc, _ = start_daemon(data_dir)
    try:
        startup, _ = cli(data_dir, "health")
        t_import, rep = cli(data_dir, "import", jsonl)
        assert isinstance(rep, dict) and rep["imported"] == n and rep["existing"] == 0, rep
        t_again, rep2 = cli(data_dir, "import", jsonl)
        assert isinstance(rep2, dict) and rep2["imported"] == 0 and rep2["existing"] == n, rep2
        _, health = cli(data_dir, "health", "--json")
        assert isinstance(health, dict) and health["active_messages"] == n, health
        log_size = health["log_size"]
    finally:
        stop(proc)
    t_sql = sqlite_bulk(os.path.join(workdir, "plain.db"), jsonl, fts=False)
    t_fts = sqlite_bulk(os.path.join(workdir, "fts.db"), jsonl, fts=True)
    return {
        "messages": n, "file_bytes": size, "log_bytes": log_size,
        "convmem_import_s": round(t_import, 3), "convmem_reimport_s": round(t_again, 3),
        "convmem_cli_startup_s": round(startup, 3),
        "sqlite_bulk_s": round(t_sql, 3), "sqlite_bulk_fts5_s": round(t_fts, 3),
        "batches": -(-n // 1000),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--messages", type=int, default=100_000)
    p.add_argument("--json", help="write the figures to this file ('-' for stdout, no table)")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    a = p.parse_args(argv)
    workdir = tempfile.mkdtemp(prefix="cvimp-")
    try:
        r = run(a.messages, workdir)
    finally:
        if not a.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    n = r["messages"]

    def row(name: str, secs: float, note: str) -> list[Any]:
        return [name, f"{secs:.2f}", f"{n / secs:,.0f}", f"{secs / r['sqlite_bulk_s']:.1f}x", note]

    if a.json != "-":
        print_table(f"Bulk import of {n:,} messages ({r['file_bytes'] / 2**20:.1f} MiB of JSON Lines)", [
            row("convmem import (CLI -> daemon)", r["convmem_import_s"],
                f"{r['batches']} batches, 1 fsync each, searchable; incl. {r['convmem_cli_startup_s']:.2f} s CLI start"),
            row("convmem import again", r["convmem_reimport_s"], "all existing: nothing written"),
            row("SQLite bulk insert", r["sqlite_bulk_s"], "one transaction, WAL, synchronous=FULL"),
            row("SQLite bulk insert + FTS5", r["sqlite_bulk_fts5_s"], "same, with a full-text index"),
        ], ["path", "seconds", "msgs/s", "vs SQLite", "notes"])
    if a.json:
        text = json.dumps(r, indent=2)
        if a.json == "-":
            print(text)
        else:
            with open(a.json, "w") as f:
                f.write(text + "\n")
    return r


if __name__ == "__main__":
    main()
