"""``Store.import_steps``: an import stored as a series of durable slices, with other mutations served
between them (the daemon's loop does that; here the test does, step by step) — and a replay of the log
finds exactly the state the live store shows."""
from __future__ import annotations

import pytest

from protocol import errors as E
from protocol import requests as R
from protocol.errors import ProtocolError
from protocol.validation import validate
from storaged import log as logfile
from storaged import records
from storaged.store import IMPORT_SLICE_BYTES, IMPORT_SLICE_MESSAGES, Store
from tests.support.faultio import live_state, write

pytestmark = pytest.mark.unit

N = 3 * IMPORT_SLICE_MESSAGES + 5   # four slices


def _mid(n: int) -> str:
    return f"01J{n:023d}"


def _msg(n: int, content: str | None = None) -> dict:
    return {"message_id": _mid(n), "session_id": f"s{n % 3}", "timestamp": 1_700_000_000_000 + n,
            "role": "user", "content": content or f"imported message {n}"}


def _req(ns, checkpoints=(), sessions=()) -> R.ImportMessages:
    return validate("import_messages", {"messages": [_msg(n) for n in ns], "checkpoints": list(checkpoints),
                                        "sessions": list(sessions)})


def _records(store: Store) -> list[list]:
    with open(store.log_path, "rb") as f:
        buf = f.read()
    return [r for _, _, r in logfile.scan(buf, store.salt, logfile.HEADER_SIZE, logfile.ScanResult())]


def test_slices_are_durable_commits_with_other_mutations_between_them(tmp_path):
    store = Store.open(str(tmp_path))
    syncs = store.io.counters.flush_calls
    steps = store.import_steps(_req(range(N), checkpoints=[{"source": "claude", "key": "/t.jsonl",
                                                             "value": {"events": N}}],
                                     sessions=[{"session_id": "s1", "title": "one"}]))
    next(steps)  # the first slice is stored and synced before the loop could serve anyone else
    assert len(store.by_id) == IMPORT_SLICE_MESSAGES and store.io.counters.flush_calls == syncs + 1
    written = write(store, "s1", "a write served between two slices")["message"]["message_id"]
    # another import of overlapping ids, served whole between two slices: nothing is stored twice
    other = store.import_messages(_req(range(IMPORT_SLICE_MESSAGES - 2, IMPORT_SLICE_MESSAGES + 3)))
    assert other == {"status": "OK", "imported": 3, "existing": 2}
    reply = R.run_steps(steps)
    assert reply == {"status": "OK", "imported": N - 3, "existing": 3}
    assert len(store.by_id) == N + 1 and written in store.by_id
    assert store.io.counters.flush_calls >= syncs + 4 + 2  # a sync per slice (and the two others)
    recs = _records(store)
    kinds = [r[records.TAG] for r in recs]
    # the session record is the first, the checkpoint the very last: no checkpoint ever claims events
    # that a crash before it could have lost
    assert kinds[0] == records.SESSION and kinds[-1] == records.INGEST and kinds.count(records.INGEST) == 1
    seqs = [r[records.W_MESSAGE][records.SEQ] for r in recs if r[records.TAG] == records.WRITE]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs) == N + 1
    live = live_state(store)
    store.close()
    again = Store.open(str(tmp_path))  # a replay of the log: the same state
    assert live_state(again) == live and again.session_meta["s1"] == {"title": "one"}
    again.close()


def test_a_slice_is_also_cut_by_the_bytes_of_its_texts(tmp_path):
    store = Store.open(str(tmp_path))
    big = "x" * (IMPORT_SLICE_BYTES // 4 + 1)
    steps = store.import_steps(validate("import_messages", {"messages": [_msg(n, big) for n in range(10)]}))
    next(steps)
    assert len(store.by_id) == 4
    assert R.run_steps(steps)["imported"] == 10
    store.close()


def test_a_failure_between_slices_says_how_much_was_stored(tmp_path):
    store = Store.open(str(tmp_path))
    steps = store.import_steps(_req(range(N)))
    next(steps)
    store.corrupt = "the log was found damaged meanwhile"
    with pytest.raises(ProtocolError) as exc:
        R.run_steps(steps)
    assert exc.value.code == E.CORRUPT_STORE
    assert f"after storing {IMPORT_SLICE_MESSAGES} of its messages" in exc.value.message
    store.corrupt = None
    # sent again, the rest is stored and the first slice is skipped
    assert store.import_messages(_req(range(N))) == {"status": "OK", "imported": N - IMPORT_SLICE_MESSAGES,
                                                     "existing": IMPORT_SLICE_MESSAGES}
    store.close()


def test_the_loop_takes_at_most_imports_max_imports_and_none_while_a_rebuild_waits(tmp_path):
    """Server.handle queues an import (its reply comes when its last slice is stored); past IMPORTS_MAX
    queued, or while a rebuild_index waits for the queued ones, an import is answered BUSY at once."""
    from ulid import ULID

    from protocol import wire
    from storaged.server import IMPORTS_MAX, Server

    store = Store.open(str(tmp_path / "data"))
    server = Server(store, "inproc://convmem-import-admission")
    try:
        def frame(op, args):
            return [wire.encode_request(op, args, str(ULID()))]

        envelope = [b"peer", b""]
        for k in range(IMPORTS_MAX):
            assert server.handle(frame("import_messages", {"messages": [_msg(k)]}), envelope) is None
        busy = server.handle(frame("import_messages", {"messages": [_msg(99)]}), envelope)
        assert busy["error"]["code"] == E.BUSY and busy["error"]["retryable"]
        rebuilding = server.handle(frame("rebuild_index", {}), envelope)
        assert rebuilding["status"] == wire.REBUILDING and server.rebuild_waiting and not store.rebuilding
        status = server.handle(frame("rebuild_status", {"rebuild_id": rebuilding["rebuild_id"]}), envelope)
        assert status["status"] == wire.REBUILDING
        server.imports.popleft()
        waiting = server.handle(frame("import_messages", {"messages": [_msg(98)]}), envelope)
        assert waiting["error"]["code"] == E.BUSY and "rebuild_index" in waiting["error"]["message"]
        assert len(server.imports) == IMPORTS_MAX - 1 and len(store.by_id) == 0  # nothing stored by handle
    finally:
        server.close()
        store.close()


def test_retries_of_an_import_join_it_at_most_imports_max_and_get_its_reply(tmp_path):
    """Requests with the request id of a queued import wait for it (handle answers None), at most
    IMPORTS_MAX of them, the first included; more are answered BUSY at once. When it is stored every
    waiting requester gets its reply, and a retry after that gets it too (Server.import_results)."""
    from ulid import ULID

    from protocol import wire
    from storaged.server import IMPORTS_MAX, Server

    store = Store.open(str(tmp_path / "data"))
    server = Server(store, "inproc://convmem-import-retries")
    sent: list[tuple[list[bytes], dict]] = []
    server._reply = lambda envelope, reply: sent.append((envelope, reply))  # the socket's side, noted
    try:
        rid = str(ULID())
        frame = [wire.encode_request("import_messages", {"messages": [_msg(k) for k in range(N)]}, rid)]
        envelopes = [[f"peer{k}".encode(), b""] for k in range(IMPORTS_MAX + 2)]
        answers = [server.handle(frame, e) for e in envelopes]
        assert answers[:IMPORTS_MAX] == [None] * IMPORTS_MAX and len(server.imports) == 1
        assert all(a["error"]["code"] == E.BUSY for a in answers[IMPORTS_MAX:])
        while server.imports:
            server._import_slice(None)
        expected = {"status": "OK", "imported": N, "existing": 0}
        assert sent == [(e, expected) for e in envelopes[:IMPORTS_MAX]]
        assert server.handle(frame, envelopes[-1]) == expected and len(store.by_id) == N
    finally:
        server.close()
        store.close()


def test_a_failed_append_in_a_later_slice_says_how_much_was_stored(tmp_path):
    """An I/O error storing the second slice is IO_ERROR, and it says the first slice stayed stored (the
    append's own message, "nothing was stored", is true of that slice only)."""
    from tests.support.faultio import FaultIO

    io = FaultIO(kinds={"sync"})
    store = Store.open(str(tmp_path), io=io)
    steps = store.import_steps(_req(range(N)))
    next(steps)
    io.arm(0)  # the next fdatasync fails: the second slice's append is undone
    with pytest.raises(ProtocolError) as exc:
        R.run_steps(steps)
    assert exc.value.code == E.IO_ERROR
    assert f"after storing {IMPORT_SLICE_MESSAGES} of its messages" in exc.value.message
    assert len(store.by_id) == IMPORT_SLICE_MESSAGES
    io.arm(None)
    assert store.import_messages(_req(range(N)))["imported"] == N - IMPORT_SLICE_MESSAGES
    store.close()
