"""Store mutations: write, update, delete, request-id idempotency, the clock, health, I/O faults."""
from __future__ import annotations

import os
import time

import pytest
from ulid import ULID

from tests.support.faultio import FaultIO, delete, full_history, live_state, read, rid, search, update, write
from protocol import errors as E
from protocol.errors import ProtocolError
from storaged import compaction
from storaged import log as logfile
from storaged.fileio import FileIO
from storaged.store import Store

pytestmark = pytest.mark.timeout(60)


def reopen(s: Store, io=None) -> Store:
    s.close()
    return Store.open(s.dir, io=io)


def without_memory(h: dict) -> dict:
    return {k: v for k, v in h.items() if k != "memory_estimate"}


def file_size(s: Store) -> int:
    return os.path.getsize(s.log_path)


def code_of(fn, *a, **kw) -> str:
    with pytest.raises(ProtocolError) as info:
        fn(*a, **kw)
    return info.value.code


# ---------------------------------------------------------------------------------------- write
def test_write_result_shape_and_defaults(store):
    r = write(store, "s1", "Remember this")
    assert r["status"] == "OK"
    m = r["message"]
    assert set(m) == {"message_id", "session_id", "timestamp", "role", "content", "revision", "updated_at", "metadata"}
    assert str(ULID.from_str(m["message_id"])) == m["message_id"]
    assert m["session_id"] == "s1" and m["role"] == "user" and m["content"] == "Remember this"
    assert m["revision"] == 1
    assert m["timestamp"] == m["updated_at"] == ULID.from_str(m["message_id"]).milliseconds
    assert m["metadata"] == {"tags": [], "memory_tier": "short", "memory_kind": "conversation", "importance": 50,
                             "relations": [], "source_message_ids": []}  # tool_call_id, summary omitted
    assert read(store, session_id="s1")["history"] == [m]


def test_write_full_metadata_round_trips(store):
    target = write(store)["message"]["message_id"]
    md = {"tool_call_id": "call-1", "tags": ["project", "決定"], "memory_tier": "long", "memory_kind": "semantic",
          "importance": 80, "summary": "要約 😀", "relations": [{"type": "derived_from", "message_id": target}],
          "source_message_ids": [target]}
    m = write(store, "s", "body", role="assistant", **md)["message"]
    assert m["metadata"] == md
    store = reopen(store)
    assert store.by_id[m["message_id"]].to_dict() == m
    store.close()


def test_ids_are_strictly_monotonic_within_one_millisecond(store):
    store.clock._wall_ms = lambda: 1_720_843_200_000
    ids = [write(store, content=f"m{i}")["message"]["message_id"] for i in range(300)]
    assert ids == sorted(ids) and len(set(ids)) == 300
    assert all(ULID.from_str(i).milliseconds == 1_720_843_200_000 for i in ids)
    assert [m["message_id"] for m in read(store, session_id="s", limit=1000)["history"]] == ids


# ---------------------------------------------------------------------------------------- update
def test_partial_metadata_merge_keeps_other_fields(store):
    m = write(store, content="c", tags=["a"], importance=70, summary="sum", memory_kind="episode",
              tool_call_id="t1")["message"]
    r = update(store, m["message_id"], importance=90)
    assert r["changed"] is True
    u = r["message"]
    assert u["revision"] == 2 and u["content"] == "c"
    assert u["metadata"] == dict(m["metadata"], importance=90)
    for key in ("message_id", "session_id", "role", "timestamp"):
        assert u[key] == m[key]
    assert u["updated_at"] >= m["updated_at"]


def test_content_only_update_keeps_metadata(store):
    m = write(store, content="old", tags=["x"], summary="s")["message"]
    u = update(store, m["message_id"], content="new")["message"]
    assert u["content"] == "new" and u["revision"] == 2 and u["metadata"] == m["metadata"]
    assert store.by_id[m["message_id"]].to_dict() == u


def test_unset_summary_with_empty_string(store):
    m = write(store, content="c", summary="s")["message"]
    u = update(store, m["message_id"], summary="")["message"]
    assert "summary" not in u["metadata"] and u["revision"] == 2


@pytest.mark.parametrize("change", [
    {"content": "same"}, {"importance": 50}, {"tags": ["a", "b"]}, {"summary": ""},
    {"content": "same", "memory_tier": "short", "tags": ["a", "b"]},
])
def test_noop_update_changes_nothing(store, change):
    m = write(store, content="same", tags=["a", "b"])["message"]
    size, io_before, seq = file_size(store), store.io.counters.as_dict(), store.last_seq
    r = update(store, m["message_id"], **change)
    assert r == {"status": "OK", "changed": False, "message": m}
    assert file_size(store) == size == store.health()["log_size"]
    assert store.io.counters.as_dict() == io_before and store.last_seq == seq
    assert store.health()["update_records"] == 0
    store = reopen(store)
    assert store.by_id[m["message_id"]].to_dict() == m
    store.close()


def test_expected_revision(store):
    m = write(store, content="v1")["message"]
    update(store, m["message_id"], content="v2", expected_revision=1)
    size = file_size(store)
    assert code_of(update, store, m["message_id"], content="v3", expected_revision=1) == E.CONFLICT
    assert code_of(update, store, m["message_id"], content="v3", expected_revision=99) == E.CONFLICT
    assert file_size(store) == size and store.by_id[m["message_id"]].content == "v2"
    assert update(store, m["message_id"], content="v3", expected_revision=2)["message"]["revision"] == 3


def test_update_unknown_or_deleted_is_not_found(store):
    assert code_of(update, store, str(ULID()), content="x") == E.NOT_FOUND
    m = write(store)["message"]
    delete(store, m["message_id"])
    size = file_size(store)
    assert code_of(update, store, m["message_id"], content="x") == E.NOT_FOUND
    assert file_size(store) == size


# ---------------------------------------------------------------------------------------- delete
def test_delete_then_not_found(store):
    keep = write(store, "s", "banana keep")["message"]
    m = write(store, "s", "banana gone")["message"]
    ref = write(store, "t", "refers", relations=[{"type": "related_to", "message_id": m["message_id"]}])["message"]
    assert len(search(store, query="banana")["results"]) == 2
    assert delete(store, m["message_id"]) == {"status": "OK"}
    assert delete(store, m["message_id"]) == {"status": "NOT_FOUND"}
    assert delete(store, str(ULID())) == {"status": "NOT_FOUND"}
    assert [h["message_id"] for h in read(store, session_id="s")["history"]] == [keep["message_id"]]
    assert [r["message_id"] for r in search(store, query="banana")["results"]] == [keep["message_id"]]
    assert code_of(read, store, view="content", message_id=m["message_id"]) == E.NOT_FOUND
    assert code_of(read, store, view="context", message_id=m["message_id"]) == E.NOT_FOUND
    ctx = read(store, view="context", message_id=ref["message_id"])
    assert ctx["relations"] == [{"type": "related_to", "direction": "outgoing", "depth": 1,
                                 "message_id": m["message_id"], "status": "deleted"}]
    h = store.health()
    assert h["active_messages"] == 2 and h["deleted_messages"] == 1
    store2 = reopen(store)
    assert m["message_id"] not in store2.by_id and len(store2.by_id) == 2
    assert [r["message_id"] for r in search(store2, query="banana")["results"]] == [keep["message_id"]]
    store2.close()


def test_delete_session_guard(store):
    m = write(store, "right", "x")["message"]
    size = file_size(store)
    assert delete(store, m["message_id"], session_id="wrong") == {"status": "NOT_FOUND"}
    assert m["message_id"] in store.by_id and file_size(store) == size
    assert delete(store, m["message_id"], session_id="right") == {"status": "OK"}
    assert m["message_id"] not in store.by_id


def test_deleting_last_message_removes_session(store):
    a = write(store, "only", "x")["message"]
    write(store, "other", "y")
    assert store.health()["session_count"] == 2
    delete(store, a["message_id"])
    assert store.health()["session_count"] == 1
    assert read(store, session_id="only") == {"history": []}
    assert [s["session_id"] for s in read(store, view="sessions")["sessions"]] == ["other"]


# ---------------------------------------------------------------------------------------- idempotency
@pytest.mark.parametrize("between", ["nothing", "reopen", "snapshot+reopen", "rebuild", "rebuild+reopen"])
def test_request_id_repeats_return_first_result(store, between):
    rw, ru, rd = rid(), rid(), rid()
    first_w = write(store, "s", "once", request_id=rw, tags=["t"])
    target = write(store, "s", "to update")["message"]["message_id"]
    first_u = update(store, target, importance=99, request_id=ru)
    victim = write(store, "s", "to delete")["message"]["message_id"]
    first_d = delete(store, victim, request_id=rd)
    write(store, "s", "dead weight")  # so that a rebuild has something to drop
    update(store, target, importance=99)  # a no-op: nothing remembered
    if "snapshot" in between:
        assert store.write_snapshot()
    if "rebuild" in between:
        compaction.rebuild(store)
    if "reopen" in between:
        store = reopen(store)
    state, seq, size = live_state(store), store.last_seq, file_size(store)
    # the same request again (as a front-end retry after a timeout) is answered, not re-applied
    assert write(store, "s", "once", request_id=rw, tags=["t"]) == first_w
    assert update(store, target, importance=99, request_id=ru) == first_u
    assert delete(store, victim, request_id=rd) == first_d == {"status": "OK"}
    assert live_state(store) == state and store.last_seq == seq and file_size(store) == size
    assert sum(m.content == "once" for m in store.by_id.values()) == 1
    assert store.by_id[target].revision == 2
    store.close()


def test_request_id_repeat_of_write_is_exact(store):
    r = rid()
    first = write(store, "s", "x", request_id=r, tags=["a"])
    assert write(store, "s", "x", request_id=r, tags=["a"]) == first
    assert len(store.by_id) == 1 and store.health()["last_sequence"] == 1


def test_request_id_reused_for_another_operation(store):
    r = rid()
    m = write(store, request_id=r)["message"]
    assert code_of(update, store, m["message_id"], content="new", request_id=r) == E.VALIDATION_ERROR
    assert code_of(delete, store, m["message_id"], request_id=r) == E.VALIDATION_ERROR
    assert store.by_id[m["message_id"]].revision == 1


def test_failed_request_is_not_remembered(store):
    r = rid()
    m = write(store)["message"]
    assert code_of(update, store, m["message_id"], content="x", expected_revision=5, request_id=r) == E.CONFLICT
    assert update(store, m["message_id"], content="x", expected_revision=1, request_id=r)["changed"] is True


# ---------------------------------------------------------------------------------------- the clock
@pytest.mark.parametrize("how", ["replay", "snapshot", "rebuild"])
def test_clock_stepping_back_never_goes_below_the_log(store, how):
    now = time.time_ns() // 1_000_000  # a real "now": replay bounds what the clock believes by the wall clock
    store.clock._wall_ms = lambda: now
    old = [write(store, content=f"m{i}")["message"] for i in range(5)]
    upd = update(store, old[0]["message_id"], content="edited")["message"]
    if how == "snapshot":
        store.write_snapshot()
    if how == "rebuild":
        compaction.rebuild(store)
    store = reopen(store)
    store.clock._wall_ms = lambda: now - 3_600_000  # NTP stepped the clock back an hour
    newest_id = max(m["message_id"] for m in old)
    newest_ms = max(upd["updated_at"], *(m["updated_at"] for m in old))
    fresh = [write(store, content=f"n{i}")["message"] for i in range(3)]
    for m in fresh:
        assert m["message_id"] > newest_id and m["timestamp"] >= newest_ms
        newest_id = m["message_id"]
    u = update(store, old[1]["message_id"], content="later")["message"]
    assert u["updated_at"] >= newest_ms and u["updated_at"] >= u["timestamp"]
    hist = read(store, session_id="s", limit=100)["history"]
    assert [h["message_id"] for h in hist] == sorted(h["message_id"] for h in hist)
    store.close()


def test_clock_stepping_back_within_a_run(store):
    t = [2_000_000_000_000]
    store.clock._wall_ms = lambda: t[0]
    a = write(store)["message"]
    t[0] -= 10_000
    b = write(store)["message"]
    assert b["message_id"] > a["message_id"] and b["timestamp"] >= a["timestamp"]


# ---------------------------------------------------------------------------------------- health
def test_health_figures_are_real(store):
    h = store.health()
    assert h["status"] == "OK" and h["last_error"] == "" and h["format_version"] == logfile.FORMAT_VERSION
    assert h["log_size"] == file_size(store) == logfile.HEADER_SIZE
    assert h["active_messages"] == h["session_count"] == h["deleted_messages"] == h["update_records"] == 0
    assert h["dead_bytes"] == 0 and h["snapshot_size"] == 0
    mem0 = h["memory_estimate"]
    assert mem0["total_bytes"] == sum(v for k, v in mem0.items() if k != "total_bytes")

    io0 = dict(h["io"])
    # (a summary is held beside the row; tags are a number in it: metadata_bytes counts the summaries)
    ids = [write(store, f"s{i % 3}", "alpha beta gamma " * 20 + str(i), tags=["t"], summary=f"summary {i}")
           ["message"]["message_id"] for i in range(12)]
    h = store.health()
    assert h["log_size"] == file_size(store)
    assert (h["active_messages"], h["session_count"], h["last_sequence"]) == (12, 3, 12)
    assert h["io"]["write_bytes"] - io0["write_bytes"] == file_size(store) - logfile.HEADER_SIZE
    assert h["io"]["write_calls"] >= io0["write_calls"] + 12
    assert h["io"]["flush_calls"] >= io0["flush_calls"] + 12
    assert h["dead_bytes"] == 0
    mem1 = h["memory_estimate"]
    assert mem1["total_bytes"] > mem0["total_bytes"]
    assert mem1["body_bytes"] == mem0["body_bytes"] == 0  # the text stays in the log, read back by offset
    for key in ("store_entries_bytes", "search_index_bytes", "history_index_bytes", "metadata_bytes"):
        assert mem1[key] > mem0[key], key

    # reads change no counter and no figure
    read(store, session_id="s0")
    read(store, view="content", message_id=ids[0])
    read(store, view="context", message_id=ids[1])
    read(store, view="sessions")
    search(store, query="alpha")
    assert without_memory(store.health()) == without_memory(h)  # a search may build lazy caches

    for mid in ids[:4]:
        update(store, mid, content="changed")
    for mid in ids[4:7]:
        delete(store, mid)
    h = store.health()
    assert h["log_size"] == file_size(store)
    assert (h["active_messages"], h["deleted_messages"], h["update_records"], h["last_sequence"]) == (9, 3, 4, 19)
    assert h["dead_bytes"] > 12 * len("alpha beta gamma " * 20) * 0.5  # old versions and deleted bodies
    assert h["memory_estimate"]["body_bytes"] == 0

    before = file_size(store)
    r = compaction.rebuild(store)
    h2 = store.health()
    assert r["status"] == "OK" and r["messages_indexed"] == 9 and r["records_removed"] == 19 - 9
    assert r["bytes_before"] == before and r["bytes_after"] == file_size(store) == h2["log_size"] < before
    assert h2["dead_bytes"] == 0 and h2["update_records"] == 0 and h2["deleted_messages"] == 0
    # the snapshot's size counts the segment holding the rebuilt index, which it names
    segments = [n for n in os.listdir(store.dir) if n.endswith(".seg")]
    assert len(segments) == 2 and sorted(store.snapshot_segments) == sorted(segments)
    assert h2["active_messages"] == 9 and h2["snapshot_size"] == sum(
        os.path.getsize(os.path.join(store.dir, n)) for n in ["snapshot", *segments])
    assert h2["io"]["replace_calls"] == h["io"]["replace_calls"] + 2

    store2 = reopen(store)
    h3 = store2.health()
    for key in ("log_size", "active_messages", "session_count", "deleted_messages", "last_sequence",
                "update_records", "dead_bytes", "snapshot_size"):
        assert h3[key] == h2[key], key
    assert h3["snapshot_valid"] is True and h3["io"]["write_calls"] == 0
    store2.close()


def test_dead_bytes_match_replay(store):
    ids = [write(store, content="x" * 100)["message"]["message_id"] for _ in range(5)]
    update(store, ids[0], content="y" * 100)
    delete(store, ids[1])
    h = store.health()
    store = reopen(store)
    h2 = store.health()
    for key in ("log_size", "dead_bytes", "active_messages", "deleted_messages", "update_records", "last_sequence"):
        assert h2[key] == h[key], key
    store.close()


# ---------------------------------------------------------------------------------------- I/O faults
def snapshot_of(store):
    h = store.health()
    return live_state(store), {k: h[k] for k in ("log_size", "active_messages", "session_count", "deleted_messages",
                                                 "last_sequence", "update_records", "dead_bytes")}


MUTATIONS = {
    "write": lambda s, ids: write(s, "s", "new message"),
    "update": lambda s, ids: update(s, ids[0], content="updated"),
    "delete": lambda s, ids: delete(s, ids[1]),
}


@pytest.mark.parametrize("op", sorted(MUTATIONS))
@pytest.mark.parametrize("fault", ["write", "partial-write", "sync"])
def test_eio_during_mutation_changes_nothing(tmp_path, op, fault):
    io = FaultIO(kinds=["write"] if "write" in fault else ["sync"], partial=fault == "partial-write")
    store = Store.open(str(tmp_path), io=io)
    ids = [write(store, "s", f"m{i}")["message"]["message_id"] for i in range(3)]
    state, figures = snapshot_of(store)
    on_disk = open(store.log_path, "rb").read()
    io.arm(0)
    r = rid()
    with pytest.raises(ProtocolError) as info:
        MUTATIONS[op](store, ids) if op != "write" else write(store, "s", "new message", request_id=r)
    assert info.value.code == E.IO_ERROR
    assert io.failures == 1
    assert snapshot_of(store) == (state, figures)
    assert open(store.log_path, "rb").read() == on_disk
    h = store.health()
    assert h["status"] == "DEGRADED" and h["last_error"]
    # the next mutation succeeds (and a retry of the failed write is applied, not "repeated")
    io.arm(None)
    if op == "write":
        again = write(store, "s", "new message", request_id=r)
        assert again["message"]["content"] == "new message"
    else:
        MUTATIONS[op](store, ids)
    extra = write(store, "s", "after the fault")["message"]
    expected = live_state(store)
    store.close()
    store = Store.open(str(tmp_path))
    assert live_state(store) == expected and extra["message_id"] in store.by_id
    assert store.health()["status"] == "OK"
    store.close()


def test_eio_on_write_then_reopen_finds_the_file_untouched(tmp_path):
    io = FaultIO(kinds=["sync"])
    store = Store.open(str(tmp_path), io=io)
    write(store, "s", "kept")
    on_disk = open(store.log_path, "rb").read()
    io.arm(0)
    with pytest.raises(ProtocolError):
        write(store, "s", "lost")
    store.close()
    assert open(os.path.join(str(tmp_path), "log"), "rb").read() == on_disk
    store = Store.open(str(tmp_path))
    assert [m.content for m in store.by_id.values()] == ["kept"] and not store.recovered_tail
    store.close()


def test_failed_cut_back_refuses_further_mutations(tmp_path):
    io = FaultIO(kinds=["sync", "truncate"], repeat=True)
    store = Store.open(str(tmp_path), io=io)
    m = write(store, "s", "kept")["message"]
    io.arm(0)
    with pytest.raises(ProtocolError) as info:
        write(store, "s", "maybe")
    assert info.value.code == E.IO_ERROR
    io.arm(None)
    for attempt in (lambda: write(store, "s", "x"), lambda: update(store, m["message_id"], content="y"),
                    lambda: delete(store, m["message_id"])):
        assert code_of(attempt) == E.IO_ERROR
    assert read(store, session_id="s")["history"] == [m]  # reads still served
    assert store.health()["status"] == "DEGRADED"
    store.close()
    # the record was fully written before the sync failed: after a restart it may be there (it was
    # never acknowledged, so either way is right), but the store is whole and writable.
    store = Store.open(str(tmp_path))
    assert store.health()["status"] == "OK"
    assert store.by_id[m["message_id"]].to_dict() == m
    assert {x.content for x in store.by_id.values()} <= {"kept", "maybe"}
    write(store, "s", "works")
    store.close()


def test_history_survives_reopen(store):
    for i in range(30):
        write(store, f"s{i % 4}", f"message {i}")
    before = full_history(store)
    store = reopen(store)
    assert full_history(store) == before
    store.close()


def test_plain_fileio_counts_its_calls(tmp_path):
    io = FileIO()
    store = Store.open(str(tmp_path), io=io)
    c0 = io.counters.as_dict()
    write(store, "s", "x")
    c1 = io.counters.as_dict()
    assert c1["write_calls"] == c0["write_calls"] + 1 and c1["flush_calls"] == c0["flush_calls"] + 1
    assert c1["truncate_calls"] == c0["truncate_calls"] == 0
    store.close()


def test_memory_accounting_returns_to_baseline(tmp_path):
    """What inserting a message adds, removing it takes away, whatever happened to its strings in
    between (packing a non-ASCII str makes CPython attach a UTF-8 copy that getsizeof then counts)."""
    d = str(tmp_path)
    store = Store.open(d)
    base = store.health()["memory_estimate"]
    ids = [write(store, "s", "日本語のテキスト😀" * 40, summary="要約 é", tags=["タグ"])["message"]["message_id"]
           for _ in range(20)]
    grown = store.health()["memory_estimate"]
    assert grown["body_bytes"] == base["body_bytes"] == 0  # the text is on disk, not in memory
    assert grown["metadata_bytes"] > base["metadata_bytes"] + 20 * 2 * 3
    store = reopen(store)  # strings fresh from the log
    assert store.health()["memory_estimate"]["body_bytes"] == grown["body_bytes"]
    assert store.health()["memory_estimate"]["metadata_bytes"] == grown["metadata_bytes"]
    compaction.rebuild(store)  # packs every string again
    for mid in ids:
        update(store, mid, summary="")
        delete(store, mid)
    mem = store.health()["memory_estimate"]
    assert mem["body_bytes"] == base["body_bytes"] == 0
    assert mem["metadata_bytes"] == base["metadata_bytes"] == 0
    assert all(v >= 0 for v in mem.values())
    store.close()


def test_metadata_bytes_count_what_the_table_holds_the_same_after_a_load_or_a_replay(tmp_path):
    """health's metadata_bytes is what the live messages hold beside their packed rows (tool_call_ids,
    summaries, relations, source ids, files): the same from a snapshot's load as from a replay of the
    log, and nothing once every message is gone. (A release before counted Python objects per message
    that the packed rows no longer hold: 2 GB at five million events.)"""
    from protocol import wire
    from tests.support.replayed import replay_copy

    d = str(tmp_path / "d")
    store = Store.open(d)
    base = store.health()["memory_estimate"]["metadata_bytes"]
    assert base == 0
    first = write(store, "s", "a", tool_call_id="call-1", summary="要約 é")["message"]["message_id"]
    ids = [first, write(store, "s", "b", relations=[{"type": "depends_on", "message_id": first}],
                        source_message_ids=[first])["message"]["message_id"]]
    events = [{"message_id": str(ULID.from_bytes(((1_767_225_600_000 + k << 80) | k).to_bytes(16, "big"))),
               "session_id": "codex:s1", "timestamp": 1_767_225_600_000 + k, "role": "assistant",
               "content": f"edit {k}", "event": {"type": "tool_call", "tool_name": "shell", "files": [
                   {"path": f"/r/f{k}.py", "root": "/r", "tail": f"f{k}.py", "project": "/r/.git", "op": "edit"}]}}
              for k in range(3)]
    assert store.import_messages(wire.validate_args("import_messages", {"messages": events}), rid())["imported"] == 3
    ids += [e["message_id"] for e in events]
    held = store.health()["memory_estimate"]["metadata_bytes"]
    assert held >= len("call-1") + 3 * len("/r/f0.py")
    assert store.write_snapshot()
    store = reopen(store)   # the snapshot's segments, loaded at once
    assert store.health()["memory_estimate"]["metadata_bytes"] == held
    replayed = Store.open(replay_copy(d, str(tmp_path / "replayed")))   # the log, message by message
    try:
        assert replayed.health()["memory_estimate"]["metadata_bytes"] == held
    finally:
        replayed.close()
    update(store, ids[0], summary="another summary")
    assert store.health()["memory_estimate"]["metadata_bytes"] != held
    for mid in ids:
        delete(store, mid)
    assert store.health()["memory_estimate"]["metadata_bytes"] == 0
    store.close()
