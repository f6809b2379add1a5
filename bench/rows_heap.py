"""Rows on the heap after deletes and a rebuild: ``python -m bench.rows_heap --dir D [--prefix 0.1]``.

Copies a store (``D/data``, e.g. what ``python -m bench.scale --dir D --phases gen,ingest`` leaves) to
``D/rows-heap`` and, through a real daemon on the copy, measures its memory (``/proc``: RssAnon is the
heap, RssFile the mapped files the kernel counts as the daemon's) at four points, each once the daemon
has rested (``--release-idle-s``; it then lets its mapped pages go):

1. ``start``: after a start, as the store is;
2. ``deleted``: after deleting one message in the middle and the oldest ``--prefix`` of them;
3. ``rebuilt``: after a ``rebuild_index`` (which writes a base of the rows, moves every message to the
   compacted log, rewriting each row) and, where the daemon maps a base in place of the rows it rewrote,
   once it has (the log says "are read from the base"; waited for up to ``--map-wait-s``);
4. ``restarted``: after a clean stop and a start from that base.

Why: a base listed only the live rows, so after any delete between two messages (or of the oldest ~10%)
every start copied all the rows to the heap — 85 bytes a message, 430 MB at five million events — and a
rebuild's relocation left every row on the heap until a restart (bench/SPIKES.md, part 18). Run it at
each commit to compare; there is no SQLite counterpart to set beside it (SQLite's pages are its page
cache's, bounded by ``cache_size``, whatever was deleted).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from typing import Any

from bench.common import proc_mem
from bench.daemon import Daemon

BASE_IN_PLACE = "are read from the base"   # what the daemon logs once a base is mapped in place of its rows


def _mem(pid: int) -> dict[str, float]:
    return {k: v for k, v in proc_mem(pid).items() if k in ("VmRSS", "RssAnon", "RssFile")}


def _rested(d: Daemon, rest_s: float) -> dict[str, float]:
    """The memory once the daemon has rested (no request meanwhile: one would restart its rest)."""
    time.sleep(rest_s + max(1.0, rest_s))   # (its release round, and the allocator's trim after it)
    return _mem(d.pid)


def _rebuild(c) -> dict[str, Any]:
    rep = c.call("rebuild_index", {})
    while rep.get("status") == "REBUILDING":
        time.sleep(0.2)
        rep = c.call("rebuild_status", {"rebuild_id": rep["rebuild_id"]})
    if rep.get("status") != "OK":
        raise RuntimeError(f"rebuild_index failed: {rep}")
    return rep


def run(src: str, work: str, prefix: float, rest_s: float, map_wait_s: float) -> dict[str, Any]:
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(src, work, ignore=shutil.ignore_patterns("LOCK", "run"))
    os.chmod(work, 0o700)
    out: dict[str, Any] = {}
    d = Daemon(work, extra_args=["--release-idle-s", str(rest_s)])
    try:
        d.start(timeout=600)
        out["start"] = _rested(d, rest_s)
        with d.client(timeout_ms=600_000, retries=0) as c:
            want = int(c.health()["active_messages"] * prefix)
            sessions = _sessions_oldest_first(c)
            middle = _history(c, sessions[len(sessions) // 2])
            deleted = _delete(c, middle[len(middle) // 2:len(middle) // 2 + 1])   # one between two others
            for sid in sessions:   # the oldest, session by session (a retention policy's way)
                if deleted >= want:
                    break
                deleted += _delete(c, _history(c, sid)[:want - deleted])
            out["deleted_messages"] = deleted
        out["deleted"] = _rested(d, rest_s)
        with d.client(timeout_ms=600_000, retries=0) as c:
            mapped = d.stderr().count(BASE_IN_PLACE)
            t0 = time.monotonic()
            out["rebuild"] = {k: v for k, v in _rebuild(c).items() if k != "status"}
            out["rebuild"]["seconds"] = round(time.monotonic() - t0, 1)
            deadline = time.monotonic() + map_wait_s
            while d.stderr().count(BASE_IN_PLACE) <= mapped and time.monotonic() < deadline:
                c.call("ping", {})
                time.sleep(0.2)
            out["rebuilt_base_mapped"] = d.stderr().count(BASE_IN_PLACE) > mapped
        out["rebuilt"] = _rested(d, rest_s)
        d.terminate(timeout=600)
        d.start(timeout=600)
        out["restarted"] = _rested(d, rest_s)
        d.terminate(timeout=600)
    finally:
        d.close()
    return out


def _sessions_oldest_first(c) -> list[str]:
    sessions, cursor = [], None
    while True:
        page = c.call("read_messages", {"view": "sessions", "limit": 1000, **({"cursor": cursor} if cursor else {})})
        sessions += [(x["started_at"], x["session_id"]) for x in page["sessions"]]
        cursor = page.get("nextCursor")
        if not cursor:
            return [sid for _, sid in sorted(sessions)]


def _history(c, sid: str) -> list[str]:
    ids, cursor = [], None
    while True:
        page = c.call("read_messages", {"view": "history", "session_id": sid, "limit": 1000,
                                        **({"cursor": cursor} if cursor else {})})
        ids += [m["message_id"] for m in page["history"]]
        cursor = page.get("nextCursor")
        if not cursor:
            return ids


def _delete(c, ids: list[str]) -> int:
    return sum(c.call("delete_message", {"message_id": mid}).get("status") == "OK" for mid in ids)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", required=True, help="a bench.scale directory (its data/ is copied, not changed)")
    p.add_argument("--prefix", type=float, default=0.1, help="the share of the oldest messages deleted")
    p.add_argument("--rest-s", type=float, default=3.0, help="the daemon's --release-idle-s, waited at each point")
    p.add_argument("--map-wait-s", type=float, default=300.0)
    a = p.parse_args(argv)
    res = run(os.path.join(a.dir, "data"), os.path.join(a.dir, "rows-heap"), a.prefix, a.rest_s, a.map_wait_s)
    print(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    main()
