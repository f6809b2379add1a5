"""What the daemon does when it cannot fork (``children.start`` raises OSError: EAGAIN, ENOMEM).

A background snapshot's plan takes the rows, session metadata and checkpoints changed since the last
snapshot, and freezes the search index's live lists (``Store.plan_snapshot``); when its writer cannot
be forked the plan is abandoned and all of that must go into the next snapshot — a delta that left it
out would make a start from that snapshot lose acknowledged writes. A rebuild whose worker cannot be
forked answers the contract's retryable BUSY, and leaves the daemon taking writes and able to rebuild.

The daemon's loop is driven a step at a time in this process (``tests.support.loop_steps``) so that
``os.fork`` — not our component — can fail for one fork; the forks that succeed are real.
"""
from __future__ import annotations

import errno
import os

import pytest

from protocol import errors as E
from protocol import wire
from storaged.server import Server
from storaged.store import Store
from tests.support.faultio import delete, full_history, live_state, rid, search, update, write
from tests.support.loop_steps import call, run_rebuild

pytestmark = pytest.mark.timeout(120)

REAL_FORK = os.fork
WORDS = ("kiwi", "mango", "papaya", "quince", "lychee", "durian", "guava")


@pytest.fixture
def fork_fails(monkeypatch):
    """``fork_fails(True)``: every os.fork from now on raises EAGAIN (the calls are counted);
    ``fork_fails(False)``: forks work again."""
    calls: list[int] = []

    def failing_fork() -> int:
        calls.append(1)
        raise OSError(errno.EAGAIN, os.strerror(errno.EAGAIN))

    def switch(fail: bool) -> list[int]:
        monkeypatch.setattr(os, "fork", failing_fork if fail else REAL_FORK)
        return calls
    return switch


def _ingest(store: Store, n: int, sid: str, key: str) -> None:
    """An ingester's batch: an event of ``sid``, the session's metadata, a file's checkpoint."""
    ts = 1_767_225_600_000 + n * 1000
    args = {"messages": [{"message_id": str(_ulid(ts, n)), "session_id": sid, "timestamp": ts, "role": "user",
                          "content": f"ingested {n} {WORDS[n % len(WORDS)]}", "event": {"type": "user_input"}}],
            "sessions": [{"session_id": sid, "harness": "codex", "source": "codex", "title": f"title {n}"}],
            "checkpoints": [{"source": "codex", "key": key, "value": {"offset": n}}]}
    assert store.import_messages(wire.validate_args("import_messages", args))["status"] == "OK"


def _ulid(ts: int, n: int):
    from ulid import ULID
    return ULID.from_bytes(((ts << 80) | n).to_bytes(16, "big"))


def _state(store: Store):
    """Everything a start must bring back: the messages (revisions and deletions included), every
    history page, what each word finds, the counters, the session metadata and the checkpoints."""
    store.index_step(None)
    found = {w: sorted(r["message_id"] for r in search(store, query=w, limit=100)["results"]) for w in WORDS}
    return (live_state(store), full_history(store), found, store.last_seq, store.deleted_messages,
            store.update_records, store.session_meta, store.ingest.checkpoints)


def test_a_snapshot_whose_writer_cannot_be_forked_hands_everything_to_the_next(tmp_path, fork_fails):
    d = str(tmp_path / "data")
    store = Store.open(d)
    server = Server(store, "inproc://convmem-fork-fails-snapshot")
    server.snapshot_every_records = 10
    try:
        ids = [write(store, f"s{i % 4}", f"message {i} {WORDS[i % len(WORDS)]}")["message"]["message_id"]
               for i in range(40)]
        _ingest(store, 0, "codex:a", "/a.jsonl")
        assert store.write_snapshot() and len(store.row_segments) == 1  # a base on disk
        on_disk = store.snapshot_pos

        # changed since the base: what the failed snapshot's plan takes
        update(store, ids[0], content="changed before the failed fork kiwi kiwi")
        delete(store, ids[1])
        fresh = [write(store, "s9", f"written before the failed fork {w}")["message"]["message_id"] for w in WORDS]
        _ingest(store, 1, "codex:b", "/b.jsonl")   # a new session's metadata, a new checkpoint
        _ingest(store, 2, "codex:a", "/a.jsonl")   # changed metadata, a checkpoint moved on
        kept_rid = rid()
        kept = write(store, "s9", "written with a request id before the failed fork", request_id=kept_rid)
        store.index_step(None)  # indexed: the plan freezes these postings

        calls = fork_fails(True)
        server._background_snapshot()
        assert calls == [1] and server.snapshot_child is None and store.snapshot_pos == on_disk
        server._background_snapshot()
        assert calls == [1]  # counted as taken: not tried again at every request

        # the daemon keeps serving, writes included
        served = call(server, "write_message", {"session_id": "s9", "role": "user",
                                                "content": "served after the failed fork guava"})
        assert served["status"] == "OK", served
        assert call(server, "update_message", {"message_id": ids[2], "content": "updated after it"})["status"] == "OK"
        assert call(server, "delete_message", {"message_id": fresh[1]})["status"] == "OK"  # planned, then deleted
        assert call(server, "search_messages", {"query": "kiwi"})["results"][0]["message_id"] == ids[0]
        history = call(server, "read_messages", {"session_id": "s9"})["history"]
        assert served["message"]["message_id"] in {m["message_id"] for m in history}
        assert call(server, "get_system_health", {})["status"] == "OK"
        for i in range(10):
            write(store, "s8", f"after the failed fork {i} papaya")

        fork_fails(False)
        server._background_snapshot()
        assert server.snapshot_child is not None
        plan = server.snapshot_child[3]
        assert plan.rows_name is not None and not plan.rows_base  # a delta: only the given-back rows carry them
        server._reap_snapshot_child(block=True)
        assert store.snapshot_pos == store.log_size() and len(store.row_segments) == 2
        expected = _state(store)
    finally:
        server.close()
        store.close()  # no snapshot at close: as if killed right after the background one

    again = Store.open(d)
    try:
        assert again.snapshot_pos == again.log_size()  # started from that snapshot, no tail replayed
        assert _state(again) == expected
        assert write(again, "s9", "written with a request id before the failed fork",
                     request_id=kept_rid)["message"] == kept["message"]  # idempotent still
    finally:
        again.close()
    os.remove(os.path.join(d, "snapshot"))
    replayed = Store.open(d)  # the whole log replayed gives the same
    try:
        assert _state(replayed) == expected
    finally:
        replayed.close()


def _is_retryable_busy(reply: dict) -> bool:
    err = reply.get("error", {})
    return (reply["status"] == "ERROR" and err["code"] == E.BUSY and E.BUSY in E.RETRYABLE
            and err["retryable"] is True and err["retry_after_ms"] > 0)


def _not_rebuilding(server: Server) -> bool:
    return (not server.store.rebuilding and server.rebuild_id is None and server.rebuild_child is None
            and not server.rebuild_waiting and call(server, "ping", {})["rebuilding"] is False
            and call(server, "get_system_health", {})["rebuilding"] is False)


def _messages(store: Store, n: int) -> None:
    ids = [write(store, f"s{i % 3}", f"message {i} {WORDS[i % len(WORDS)]}")["message"]["message_id"]
           for i in range(n)]
    for mid in ids[::4]:
        delete(store, mid)


def test_a_rebuild_whose_worker_cannot_be_forked_answers_busy_and_a_retry_rebuilds(tmp_path, fork_fails):
    store = Store.open(str(tmp_path / "data"))
    server = Server(store, "inproc://convmem-fork-fails-rebuild")
    try:
        _messages(store, 60)
        fork_fails(True)
        rebuild_rid = rid()
        reply = call(server, "rebuild_index", {}, rebuild_rid)
        assert _is_retryable_busy(reply), reply
        assert _not_rebuilding(server)
        # writes are accepted again at once (during a rebuild they are BUSY)
        written = call(server, "write_message", {"session_id": "s1", "role": "user", "content": "after it mango"})
        assert written["status"] == "OK", written
        before = live_state(store)

        fork_fails(False)
        # the very same request sent again (the BUSY said it may succeed) starts the rebuild
        again = call(server, "rebuild_index", {}, rebuild_rid)
        assert again["status"] == wire.REBUILDING, again
        assert run_rebuild(server, rebuild_rid)["status"] == "OK"
        assert not store.rebuilding and live_state(store) == before and store.deleted_messages == 0
        assert call(server, "write_message", {"session_id": "s1", "role": "user", "content": "x"})["status"] == "OK"
    finally:
        server.close()
        store.close()


def _event(ts: int, n: int) -> dict:
    return {"message_id": str(_ulid(ts, n)), "session_id": "imp", "timestamp": ts, "role": "user",
            "content": f"imported {n}"}


def test_a_rebuild_that_waited_for_imports_and_cannot_fork_reports_busy_to_its_poll(tmp_path, fork_fails):
    """A rebuild asked for while an import is in progress starts when the import is stored (what
    ``Server._serve`` does: ``_start_waiting_rebuild``); its requester, told REBUILDING, polls
    rebuild_status and gets the BUSY there. Sent again under its request id, it starts."""
    store = Store.open(str(tmp_path / "data"))
    server = Server(store, "inproc://convmem-fork-fails-waiting-rebuild")
    sent: list[dict] = []
    server._reply = lambda envelope, reply: sent.append(reply)  # the socket's side, noted
    try:
        _messages(store, 30)
        imported = [_event(1_767_225_600_000 + n, n) for n in range(5)]
        assert call(server, "import_messages", {"messages": imported}) is None  # queued
        rebuild_rid = rid()
        assert call(server, "rebuild_index", {}, rebuild_rid)["status"] == wire.REBUILDING
        assert server.rebuild_waiting
        fork_fails(True)
        while server.imports:
            server._import_slice(None)
        server._start_waiting_rebuild()
        assert sent == [{"status": "OK", "imported": 5, "existing": 0}]
        status = call(server, "rebuild_status", {"rebuild_id": rebuild_rid})
        assert _is_retryable_busy(status), status
        assert _not_rebuilding(server)
        assert call(server, "write_message", {"session_id": "s1", "role": "user", "content": "y"})["status"] == "OK"
        more = [_event(1_767_225_700_000 + n, n) for n in range(5)]
        assert call(server, "import_messages", {"messages": more}) is None  # imports taken again, not BUSY
        while server.imports:
            server._import_slice(None)
        before = live_state(store)

        fork_fails(False)
        again = call(server, "rebuild_index", {}, rebuild_rid)
        assert again["status"] == wire.REBUILDING, again
        assert run_rebuild(server, rebuild_rid)["status"] == "OK"
        assert live_state(store) == before
    finally:
        server.close()
        store.close()
