"""A message text that rotted on disk, read through a real daemon: the read fails CORRUPT_STORE, never
serves the bad bytes, and the daemon marks the store damaged — health DEGRADED, mutations refused —
while every other message still reads.

Texts live in the log and are read back by position (``storaged/text.py``); a start after a clean stop
replays nothing before the snapshot's position, so rot there is first seen when the text is read. The
test makes exactly that: messages written, the daemon stopped cleanly (its snapshot covers them), one
byte of one text flipped in the ``log`` file, a new daemon started on it. ``tests/unit/test_text.py``
checks the same promise in-process; this is the wire's view of it.
"""
from __future__ import annotations

import signal
from pathlib import Path

import pytest

from protocol import errors as E
from storaged import layout
from tests.support.daemon_proc import Client, Daemon, DaemonPool

pytestmark = pytest.mark.timeout(120)

MARKER = "rotmarker7q4z"          # in the damaged message only (the test finds its bytes by it)
KEEP = "keptmarker2w9x"           # in every other message


@pytest.fixture
def pool(tmp_path):
    p = DaemonPool(tmp_path)
    yield p
    p.close_all()


def _code(rep: dict) -> str | None:
    return rep.get("error", {}).get("code") if rep.get("status") == "ERROR" else None


def _damaged_store(pool: DaemonPool) -> tuple[Daemon, dict[str, str]]:
    """A daemon started on a store whose message ``MARKER`` has one byte flipped in the log, before the
    snapshot's position. Returns it and the ids of the messages (by name)."""
    d = pool.new("d").start()
    with d.client() as c:
        ids = {"bad": c.write("rot", f"{MARKER} the text that rots " + "x" * 200)["message_id"],
               "same_session": c.write("rot", f"{KEEP} a neighbour in the same session")["message_id"],
               "other": c.write("fine", f"{KEEP} a message of another session")["message_id"]}
    assert d.terminate(signal.SIGTERM) == 0       # a clean stop: the snapshot covers every record
    log = Path(d.data_dir) / layout.LOG
    data = bytearray(log.read_bytes())
    at = data.find(MARKER.encode())
    assert at > 0 and data.find(MARKER.encode(), at + 1) == -1, "the marker must be in the log exactly once"
    data[at + 3] ^= 0x01                          # still ASCII: only the record's checksum can tell
    log.write_bytes(bytes(data))
    d.start()
    assert "replayed 0 records after the snapshot" in d.stderr(), d.stderr()[-2000:]
    return d, ids


def test_a_damaged_text_is_corrupt_store_and_the_store_degraded(pool):
    d, ids = _damaged_store(pool)
    with d.client() as c:
        # every read that would serve the text refuses it: the message itself, its session's history,
        # a search that finds it (the index was built before the rot)
        rep = c.call("read_messages", {"view": "content", "message_id": ids["bad"]})
        assert _code(rep) == E.CORRUPT_STORE, rep
        assert MARKER not in str(rep)
        health = c.health()
        assert health["status"] == "DEGRADED" and "log damaged" in health["last_error"], health
        for args in ({"view": "history", "session_id": "rot"},
                     {"view": "context", "message_id": ids["same_session"]}):
            rep = c.call("read_messages", args)
            assert _code(rep) == E.CORRUPT_STORE, (args, rep)
        rep = c.call("search_messages", {"query": MARKER})
        assert _code(rep) == E.CORRUPT_STORE, rep

        # every other message still reads, and a search that does not meet the bad text answers
        for name in ("other", "same_session"):
            rep = c.call("read_messages", {"view": "content", "message_id": ids[name]})
            assert KEEP in rep["content_range"]["content"] and rep["content_range"]["complete"], rep
        assert [m["message_id"] for m in c.history("fine")] == [ids["other"]]
        rep = c.call("search_messages", {"query": KEEP, "session_id": "fine"})
        assert [r["message_id"] for r in rep["results"]] == [ids["other"]], rep

        # mutations are refused until salvage, whatever they touch
        mutations = [
            ("write_message", {"session_id": "fine", "role": "user", "content": "after the damage"}),
            ("update_message", {"message_id": ids["other"], "content": "changed"}),
            ("delete_message", {"message_id": ids["other"]}),
            ("import_messages", {"messages": [{"message_id": "01KB0000000000000000000000", "session_id": "new",
                                               "timestamp": 1_767_225_600_000, "role": "user",
                                               "content": "imported"}]}),
        ]
        for op, args in mutations:
            rep = c.call(op, args)
            assert _code(rep) == E.CORRUPT_STORE, (op, rep)
        assert c.health()["active_messages"] == 3
        assert d.alive()
