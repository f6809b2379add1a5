"""A start after a crash that replayed a long tail: a forked child indexes the first half of the search
index's queue on the other core while the daemon indexes the rest (server.SPLIT_MIN, Store.split_catch_up).
Searches are answered BUSY until both halves are in, then find every message; if the child dies, its
half is queued again and indexed by the daemon: nothing is left out either way."""
from __future__ import annotations

import os
import re
import signal
import time

import pytest
from ulid import ULID

from protocol import limits as L
from storaged.server import SPLIT_MIN
from tests.support.daemon_proc import Daemon, pid_alive
from tests.support.words import unique_word as _word

pytestmark = pytest.mark.timeout(180)

N = SPLIT_MIN + 1_000
T0 = 1_767_225_600_000


def _import(c, n: int) -> list[str]:
    ids = []
    for at in range(0, n, L.IMPORT_BATCH_MAX):
        msgs = []
        for i in range(at, min(n, at + L.IMPORT_BATCH_MAX)):
            ts = T0 + i
            mid = str(ULID.from_bytes(((ts << 80) | i).to_bytes(16, "big")))
            ids.append(mid)
            msgs.append({"message_id": mid, "session_id": f"claude-code:s{i // 500}", "timestamp": ts, "role": "user",
                         "content": f"entry {_word(i)} of the replayed tail, common words deploy build",
                         "event": {"type": "user_input"}})
        rep = c.call("import_messages", {"messages": msgs}, busy_retry=True)
        assert rep["status"] == "OK", rep
    return ids


def _search(c, query: str, limit: int = 5, deadline_s: float = 90.0) -> list[dict]:
    """search_messages until it is not BUSY (the index catching up); its results."""
    deadline = time.monotonic() + deadline_s
    while True:
        rep = c.call("search_messages", {"query": query, "limit": limit})
        if "results" in rep:
            return rep["results"]
        assert rep.get("error", {}).get("code") == "BUSY", rep
        assert time.monotonic() < deadline, "the search index did not catch up"
        time.sleep(0.05)


def _check_all_found(c, ids: list[str]) -> None:
    for i in [*range(0, N, 37), N // 2 - 1, N // 2, N - 1]:
        hits = _search(c, _word(i))   # the message holding the word first (its session neighbours may follow)
        assert hits and hits[0]["message_id"] == ids[i] and hits[0]["score_breakdown"]["content"] > 0, i


def _crashed_store(tmp_path) -> tuple[Daemon, list[str]]:
    d = Daemon(tmp_path / "data", extra_args=["--snapshot-every", "0"])   # all of it stays the log's tail
    d.start()
    with d.client(timeout_ms=60_000) as c:
        ids = _import(c, N)
    d.kill()
    return d, ids


def test_the_replayed_tail_is_indexed_half_by_a_child_and_searches_find_all_of_it(tmp_path):
    d, ids = _crashed_store(tmp_path)
    with d:
        d.start()
        with d.client(timeout_ms=60_000) as c:
            _check_all_found(c, ids)
            common = [(h["message_id"], h["score"]) for h in _search(c, "deploy build", 20)]
        log = d.stderr()
        # half of what is still queued when the loop forks it (a first search may have indexed a few)
        m = re.search(r"catch-up: (\d+) of (\d+) queued messages indexed by a child", log)
        assert m and SPLIT_MIN <= int(m.group(2)) <= N and int(m.group(1)) == int(m.group(2)) // 2, log[-3000:]
        assert "its segment installed" in log
        # the child's segment is the index's: a clean stop's snapshot names it, the next start maps it
        d.terminate(signal.SIGTERM)
        d.start()
        with d.client(timeout_ms=60_000) as c:
            assert [(h["message_id"], h["score"]) for h in _search(c, "deploy build", 20)] == common
            _check_all_found(c, ids)
        assert "indexed by a child" not in d.stderr()    # nothing replayed: no child


def test_a_child_that_dies_gives_its_half_back_to_the_daemon(tmp_path, monkeypatch):
    d, ids = _crashed_store(tmp_path)
    monkeypatch.setenv("CONVMEM_FAULT_SPLIT_DELAY_S", "60")   # the child waits: it is killed first
    with d:
        d.start()
        deadline = time.monotonic() + 60
        while not (m := re.search(r"indexed by a child \(pid (\d+)\)", d.stderr())):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        child = int(m.group(1))
        with d.client(timeout_ms=60_000) as c:
            assert c.call("search_messages", {"query": _word(0), "limit": 5})["error"]["code"] == "BUSY"
            os.kill(child, signal.SIGKILL)
            _check_all_found(c, ids)
        assert not pid_alive(child)
        log = d.stderr()
        assert "its messages queued again" in log
        assert log.count("indexed by a child") == 1   # no second child right after a failed one (SPLIT_RETRY_S)
