"""A resting daemon lets go of the resident pages of its store's mapped files (--release-idle-s,
server.RELEASE_IDLE_S): its RSS is its own memory again, not the postings and rows its last requests
read (the page cache keeps those), and every answer after it is the same — a row changed since the
snapshot, which lives only in the process's copy of its page, included."""
from __future__ import annotations

import os
import signal
import time

import pytest
from ulid import ULID

from protocol import limits as L
from tests.support.daemon_proc import Daemon
from tests.support.words import unique_word as _word

pytestmark = pytest.mark.timeout(240)

N = 20_000   # enough for a rows segment and index segments over 1 MB (smaller files are read, not mapped)
T0 = 1_767_225_600_000
IDLE_S = 2.0


def _resident_kib(pid: int, data_dir: str) -> int:
    """KiB of the process's mappings of the data directory's files resident in memory."""
    total, inside = 0, False
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head = line.split(None, 5)
            if head and "-" in head[0] and ":" not in head[0]:
                inside = len(head) == 6 and head[5].startswith(data_dir + os.sep)
            elif inside and head[0] == "Rss:":
                total += int(head[1])
    return total


def _import(c, n: int) -> list[str]:
    ids = []
    for at in range(0, n, L.IMPORT_BATCH_MAX):
        msgs = []
        for i in range(at, min(n, at + L.IMPORT_BATCH_MAX)):
            ts = T0 + i
            mid = str(ULID.from_bytes(((ts << 80) | i).to_bytes(16, "big")))
            ids.append(mid)
            msgs.append({"message_id": mid, "session_id": f"claude-code:s{i // 400}", "timestamp": ts,
                         "role": "assistant", "event": {"type": "assistant_response"},
                         "content": f"entry {_word(i)} about {_word(i % 613)} and {_word(i % 97)}: " + "detail " * 12})
        rep = c.call("import_messages", {"messages": msgs}, busy_retry=True)
        assert rep["status"] == "OK", rep
    return ids


def _answers(c, ids: list[str]) -> list:
    """What a handful of searches and reads answer (each reads the segments and the rows)."""
    out = []
    for i in (3, 4_321, N - 2):
        rep = c.call("search_messages", {"query": f"{_word(i % 613)} detail", "limit": 20})
        out.append([(h["message_id"], h["score"]) for h in rep["results"]])
    for mid in (ids[5], ids[N // 2]):
        out.append(c.call("read_messages", {"view": "content", "message_id": mid}))
    out.append(c.call("read_messages", {"view": "history", "session_id": "claude-code:s0", "limit": 100}))
    return out


def test_a_resting_daemon_lets_its_mapped_pages_go_and_answers_the_same(tmp_path):
    data = tmp_path / "data"
    d = Daemon(data, extra_args=["--release-idle-s", str(IDLE_S)])
    with d:
        d.start()
        with d.client(timeout_ms=60_000) as c:
            ids = _import(c, N)
        d.terminate(signal.SIGTERM)   # the clean stop's snapshot: a mapped rows segment and index segments
        assert max(os.path.getsize(data / n) for n in os.listdir(data) if n.endswith(".seg")) > 1 << 20
        d.start()
        pid = d.proc.pid
        with d.client(timeout_ms=60_000) as c:
            # a row of the mapped base changed after the snapshot: its only copy is the process's page
            rep = c.call("update_message", {"message_id": ids[5], "content": "changed after the snapshot"})
            assert rep["status"] == "OK", rep
            before = _answers(c, ids)
            assert _resident_kib(pid, str(data)) > 64   # the requests read pages of the mapped files
            deadline = time.monotonic() + IDLE_S + 30
            while _resident_kib(pid, str(data)) > 64:   # let go once the daemon has rested IDLE_S
                assert time.monotonic() < deadline, _resident_kib(pid, str(data))
                time.sleep(0.1)
            after = _answers(c, ids)
            assert after == before
            assert "changed after the snapshot" in repr(after[3])
            assert _resident_kib(pid, str(data)) > 64
            # and again after the next rest: the round starts over after each request
            deadline = time.monotonic() + IDLE_S + 30
            while _resident_kib(pid, str(data)) > 64:
                assert time.monotonic() < deadline
                time.sleep(0.1)
            assert _answers(c, ids) == before
