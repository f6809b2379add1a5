"""Simulated power cuts: nothing acknowledged is ever lost, and the checker can tell when it would be.

Each run drives a store through random writes, updates, deletes, snapshots, rebuilds and restarts
on a ``TrackingIO`` that knows what has been made durable; the machine dies at a random I/O call
(mid-append included, after a partial write) or after the last operation. The directory is then
rewritten as a restarted machine could find it (``TrackingIO.power_cut``) and reopened with plain
``FileIO``. The checker demands that every acknowledged mutation is there exactly (content,
revision, metadata, timestamps), that nothing else is (the one operation in flight may or may not
have happened, but whole), that the store is healthy and writable, and that retrying the operation
in flight with its request id applies it exactly once.
"""
from __future__ import annotations

import os
import random

import pytest

from tests.support.faultio import NoSyncIO, PowerCut, TrackingIO, delete, live_state, rid, update, write
from storaged import compaction
from storaged.fileio import FileIO
from storaged.store import Store

pytestmark = pytest.mark.timeout(120)

RUNS = 300


def _content(rng: random.Random, i: int) -> str:
    return rng.choice(["note", "メモ", "😀 emoji", "décision", "x" * rng.randint(1, 300)]) + f" #{i}"


def _run(seed: int, root: str, io_class=TrackingIO, double_cut: bool = True) -> list[str]:
    """One run; returns the problems found (empty: all good)."""
    rng = random.Random(seed)
    problems: list[str] = []
    n_ops = rng.randint(1, 30)
    io = io_class(root, crash_at=None, rng=random.Random(seed * 7 + 1))
    # die somewhere in the run: during the first open, an operation, or not at all (cut at the end)
    io.crash_at = rng.randint(0, 4 * n_ops + 12)
    acked: dict[str, dict] = {}          # message_id -> the message as last acknowledged
    acked_deleted: set[str] = set()
    in_flight = None                     # (kind, args, request id, extra)
    store = None
    try:
        store = Store.open(root, io=io)
        if io_class is NoSyncIO:
            io.armed = True
        for i in range(n_ops):
            roll = rng.random()
            live = sorted(acked)
            if roll < 0.5 or not live:
                content, r = _content(rng, i), rid()
                kw = {"importance": rng.randint(0, 100)} if rng.random() < 0.3 else {}
                in_flight = ("write", (f"s{rng.randint(0, 3)}", content, kw), r, None)
                m = write(store, in_flight[1][0], content, request_id=r, **kw)["message"]
                acked[m["message_id"]] = m
            elif roll < 0.72:
                mid, content, r = rng.choice(live), _content(rng, i), rid()
                in_flight = ("update", (mid, content), r, acked[mid]["revision"])
                res = update(store, mid, content=content, request_id=r)
                acked[mid] = res["message"]
            elif roll < 0.85:
                mid, r = rng.choice(live), rid()
                in_flight = ("delete", (mid,), r, None)
                assert delete(store, mid, request_id=r) == {"status": "OK"}
                del acked[mid]
                acked_deleted.add(mid)
            elif roll < 0.91:
                in_flight = ("snapshot", (), None, None)
                if rng.random() < 0.6:
                    store.search  # indexes the queue: the snapshot then writes (and merges) segments
                store.write_snapshot()
            elif roll < 0.96:
                in_flight = ("rebuild", (), None, None)
                compaction.rebuild(store)
            else:
                in_flight = ("restart", (), None, None)
                store.close()
                store = Store.open(root, io=io)
            in_flight = None
    except PowerCut:
        pass
    except Exception as exc:  # noqa: BLE001 - any other failure is a finding
        problems.append(f"seed {seed}: {type(exc).__name__} during the run: {exc}")
        return problems
    io.power_cut(random.Random(seed * 13 + 5))

    if double_cut and rng.random() < 0.25:  # the machine dies again while recovering
        io2 = TrackingIO(root, crash_at=rng.randint(0, 6), rng=random.Random(seed))
        try:
            Store.open(root, io=io2)
        except PowerCut:
            pass
        io2.power_cut(random.Random(seed * 17 + 3))

    # -- check --
    try:
        s = Store.open(root, io=FileIO())
    except Exception as exc:  # noqa: BLE001
        return [f"seed {seed}: reopen failed: {type(exc).__name__}: {exc}"]
    h = s.health()
    if h["status"] != "OK" or s.corrupt or s.writer is None:
        problems.append(f"seed {seed}: store not healthy after the cut: {h['last_error']!r}")
    state = live_state(s)
    kind = in_flight[0] if in_flight else None
    flying_mid = in_flight[1][0] if kind in ("update", "delete") else None
    for mid, m in acked.items():
        got = state.get(mid)
        if mid == flying_mid and kind == "delete" and got is None:
            continue
        if mid == flying_mid and kind == "update" and got is not None and got["revision"] == m["revision"] + 1:
            if got["content"] != in_flight[1][1]:
                problems.append(f"seed {seed}: in-flight update of {mid} is corrupt")
            continue
        if got != m:
            problems.append(f"seed {seed}: acknowledged {mid} {'lost' if got is None else 'differs'}")
    for mid in acked_deleted:
        if mid in state:
            problems.append(f"seed {seed}: acknowledged delete of {mid} undone")
    extra = set(state) - set(acked)
    if kind == "write" and len(extra) == 1:
        m = state[extra.pop()]
        if (m["content"], m["session_id"], m["revision"]) != (in_flight[1][1], in_flight[1][0], 1):
            problems.append(f"seed {seed}: in-flight write is corrupt")
    if extra:
        problems.append(f"seed {seed}: unexpected messages {sorted(extra)}")
    # the search index (segments named by the snapshot, plus the replayed tail) holds exactly the live
    # messages, and finds them by their words
    index = s.search
    if index.doc_count() != len(s.by_seq) or not all(seq in index for seq in s.by_seq):
        problems.append(f"seed {seed}: the search index does not hold exactly the live messages")
    for msg in list(s.by_seq.values())[:8]:
        if msg.seq not in {h.doc for h in index.search(msg.content, 200)}:
            problems.append(f"seed {seed}: a search for {msg.message_id}'s text does not find it")
    if problems:
        s.close()
        return problems

    # -- retry the operation in flight with its request id: exactly once --
    try:
        if kind == "write":
            sid, content, kw = in_flight[1]
            m = write(s, sid, content, request_id=in_flight[2], **kw)["message"]
            if sum(x["content"] == content and x["session_id"] == sid for x in live_state(s).values()) != 1:
                problems.append(f"seed {seed}: retried write applied twice or not at all")
            acked[m["message_id"]] = m
        elif kind == "update":
            mid, content = in_flight[1]
            m = update(s, mid, content=content, request_id=in_flight[2])["message"]
            if m["revision"] != in_flight[3] + 1 or m["content"] != content:
                problems.append(f"seed {seed}: retried update applied twice or not at all")
            acked[mid] = m
        elif kind == "delete":
            mid = in_flight[1][0]
            if delete(s, mid, request_id=in_flight[2]) != {"status": "OK"} or mid in s.by_id:
                problems.append(f"seed {seed}: retried delete did not end deleted")
            acked.pop(mid, None)
        after = write(s, "s0", f"after the cut {seed}")["message"]
        acked[after["message_id"]] = after
        s.close()
        s = Store.open(root)
        if live_state(s) != acked or s.health()["status"] != "OK" or s.recovered_tail:
            problems.append(f"seed {seed}: state after retry and restart differs")
        s.close()
    except Exception as exc:  # noqa: BLE001
        problems.append(f"seed {seed}: {type(exc).__name__} after recovery: {exc}")
    return problems


def _runs(tmp_path, seeds, io_class=TrackingIO):
    problems, losses = [], 0
    for seed in seeds:
        found = _run(seed, str(tmp_path / f"run{seed}"), io_class)
        problems += found
        losses += bool(found)
    return problems, losses


def test_power_cuts_lose_nothing_acknowledged(tmp_path):
    problems, _ = _runs(tmp_path, range(RUNS))
    assert problems == []


@pytest.mark.slow
def test_power_cuts_lose_nothing_acknowledged_long(tmp_path):
    problems, _ = _runs(tmp_path, range(RUNS, RUNS + 3000))
    assert problems == []


def test_checker_catches_missing_fsync(tmp_path):
    """The same runs with an fsync that does nothing: the checker must see acknowledged writes lost."""
    problems, losses = _runs(tmp_path, range(100), NoSyncIO)
    assert losses >= 30, problems
    assert any("lost" in p or "differs" in p or "undone" in p for p in problems)


def test_power_cut_model_keeps_synced_bytes_only(tmp_path):
    """The fault model itself: synced data survives, unsynced data may not, renames need sync_dir."""
    root = str(tmp_path)
    io = TrackingIO(root)
    fd = io.open_new(os.path.join(root, "a"))
    io.write(fd, b"durable")
    io.sync(fd)
    io.write(fd, b"-volatile")
    io.close(fd)
    io.sync_dir(root)
    fd = io.open_new(os.path.join(root, "b.tmp"))
    io.write(fd, b"new")
    io.sync(fd)
    io.close(fd)
    io.replace(os.path.join(root, "b.tmp"), os.path.join(root, "b"))
    seen_a, seen_b = set(), set()
    for seed in range(200):
        disk = io.power_cut(random.Random(seed))
        assert disk["a"][:7] == b"durable" and len(disk["a"]) <= len(b"durable-volatile")
        seen_a.add(disk["a"])
        seen_b.add(tuple(sorted(disk)))
        io.dead = False
    assert b"durable" in seen_a and b"durable-volatile" in seen_a and len(seen_a) > 5
    assert seen_b == {("a",), ("a", "b.tmp"), ("a", "b")}  # creation and rename: journal, not yet durable


def test_crash_after_sync_before_reply_is_not_lost_nor_duplicated(tmp_path):
    """Killed between the fsync and the reply: the retry finds the first result."""
    root = str(tmp_path)
    io = TrackingIO(root)
    s = Store.open(root, io=io)
    write(s, "s", "first")
    r = rid()
    io.crash_at = io.calls + 2  # the append's write and sync succeed; the next call dies
    m = write(s, "s", "unreplied", request_id=r)["message"]  # the store finished; the reply is "lost"
    try:
        write(s, "s", "never")
    except PowerCut:
        pass
    io.power_cut(random.Random(1))
    s = Store.open(root)
    again = write(s, "s", "unreplied", request_id=r)["message"]
    assert again == m and [x.content for x in s.by_id.values()] == ["first", "unreplied"]
    s.close()


# ---------------------------------------------------------------------------------------------------
# Agent history: an ingester's batch (session metadata, events, the file's checkpoint) is one append.
# ---------------------------------------------------------------------------------------------------
def _ingest_batch(rng: random.Random, n: int, offset: int) -> tuple[dict, int]:
    """import_messages args of one ingester batch: events of a session, its metadata, a checkpoint."""
    from protocol import wire
    from ulid import ULID

    sid = f"codex:s{rng.randint(0, 2)}"
    events = []
    for k in range(rng.randint(1, 6)):
        ts = 1_767_225_600_000 + n * 100 + k
        etype = rng.choice(["user_input", "assistant_response", "tool_call", "tool_response", "reasoning"])
        ev = {"type": etype}
        if etype.startswith("tool"):
            ev.update(tool_name="shell", exit_code=rng.randint(0, 2), is_error=False)
        if etype == "tool_call":
            ev["files"] = [{"path": f"/r/f{k}.py", "root": "/r", "tail": f"f{k}.py", "project": "/r/.git",
                            "op": "edit"}]
        events.append({"message_id": str(ULID.from_bytes(((ts << 80) | (n * 16 + k)).to_bytes(16, "big"))),
                       "session_id": sid, "timestamp": ts,
                       "role": {"user_input": "user", "tool_response": "user"}.get(etype, "assistant"),
                       "content": _content(rng, n) + f" batch {n} event {k}", "event": ev})
        offset += rng.randint(50, 5000)
    meta = {"session_id": sid, "harness": "codex", "source": "codex", "title": f"title {n}"}
    cp = {"source": "codex", "key": "/home/u/.codex/sessions/rollout.jsonl",
          "value": {"offset": offset, "bytes": offset, "events": n}}
    return wire.validate_args("import_messages", {"messages": events, "sessions": [meta], "checkpoints": [cp]}), offset


def _event_state(store) -> dict:
    return {mid: (m.to_dict(), m.etype, m.tool, m.ext) for mid, m in store.by_id.items()}


def _ingest_run(seed: int, root: str) -> list[str]:
    rng = random.Random(seed)
    n_ops = rng.randint(1, 25)
    io = TrackingIO(root, crash_at=None, rng=random.Random(seed * 7 + 1))
    io.crash_at = rng.randint(0, 4 * n_ops + 12)
    acked: dict = {}
    acked_cp = None
    acked_meta: dict[str, str] = {}
    in_flight = None
    offset = 0
    store = None
    try:
        store = Store.open(root, io=io)
        for i in range(n_ops):
            roll = rng.random()
            if roll < 0.8:
                args, offset = _ingest_batch(rng, i, offset)
                in_flight = ("ingest", args)
                store.import_messages(args)
                for m in args.messages:
                    acked[m.message_id] = _event_state(store)[m.message_id]
                acked_cp = args.checkpoints[0].value
                acked_meta[args.sessions[0].session_id] = args.sessions[0].fields["title"]
            elif roll < 0.88:
                in_flight = ("snapshot", None)
                store.write_snapshot()
            elif roll < 0.95:
                in_flight = ("rebuild", None)
                compaction.rebuild(store)
            else:
                in_flight = ("restart", None)
                store.close()
                store = Store.open(root, io=io)
            in_flight = None
    except PowerCut:
        pass
    io.power_cut(random.Random(seed * 13 + 5))
    s = Store.open(root, io=FileIO())
    problems = []
    if s.health()["status"] != "OK":
        problems.append(f"seed {seed}: not healthy: {s.health()['last_error']}")
    state = _event_state(s)
    for mid, want in acked.items():
        if state.get(mid) != want:
            problems.append(f"seed {seed}: acknowledged event {mid} {'lost' if mid not in state else 'differs'}")
    cp = s.ingest.checkpoints.get(("codex", "/home/u/.codex/sessions/rollout.jsonl"))
    flying = in_flight[1] if in_flight and in_flight[0] == "ingest" else None
    if flying is not None and cp == flying.checkpoints[0].value:
        # the in-flight batch's checkpoint made it: so did every one of its events (never ahead of them)
        missing = [m.message_id for m in flying.messages if m.message_id not in state]
        if missing:
            problems.append(f"seed {seed}: checkpoint stored without its events {missing}")
    elif cp != acked_cp:
        problems.append(f"seed {seed}: checkpoint {cp} is neither the acknowledged one nor the in-flight one")
    for sid, title in acked_meta.items():
        if s.session_meta.get(sid, {}).get("title") is None:
            problems.append(f"seed {seed}: session metadata of {sid} lost")
    extra = set(state) - set(acked) - ({m.message_id for m in flying.messages} if flying else set())
    if extra:
        problems.append(f"seed {seed}: unexpected events {sorted(extra)[:3]}")
    if flying is not None:   # the ingester retries its batch: everything once, checkpoint in place
        s.import_messages(flying)
        if s.ingest.checkpoints.get(("codex", "/home/u/.codex/sessions/rollout.jsonl")) != flying.checkpoints[0].value \
                or any(m.message_id not in s.by_id for m in flying.messages):
            problems.append(f"seed {seed}: retried batch did not complete")
    s.close()
    return problems


def test_power_cuts_in_ingest_batches_keep_checkpoints_with_their_events(tmp_path):
    problems = []
    for seed in range(150):
        problems += _ingest_run(seed, str(tmp_path / f"i{seed}"))
    assert problems == []
