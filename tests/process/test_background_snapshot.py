"""Background snapshots: a forked child writes the snapshot while the daemon keeps serving, so a
start after a crash replays only the log written since, never the whole history."""
from __future__ import annotations

import os
import time

import pytest

from tests.support.daemon_proc import Daemon
from tests.support.words import unique_word as _word

pytestmark = pytest.mark.timeout(120)

EVERY = 300


def _wait(cond, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def test_crash_after_background_snapshot_replays_only_the_tail(tmp_path):
    data = tmp_path / "data"
    with Daemon(data, extra_args=["--snapshot-every", str(EVERY)]) as d:
        d.start()
        with d.client() as c:
            acked = {c.write(f"s{i % 7}", f"message {i} ünïcödé 日本語")["message_id"] for i in range(EVERY + 50)}
            # the child wrote it and put it in place, and the loop installed it: only then does the size
            # count the segments it names (the file alone is there from the child's rename on)
            _wait(lambda: c.health()["snapshot_size"] > (os.path.getsize(data / "snapshot")
                                                         if os.path.exists(data / "snapshot") else 0))
            snap_bytes = c.health()["snapshot_size"]
            acked |= {c.write("tail", f"after the snapshot {i}")["message_id"] for i in range(40)}
            # the snapshot file and the index and row segments it names
            assert os.path.getsize(data / "snapshot") + sum(
                os.path.getsize(data / n) for n in [*_named_segments(data), *_named_rows(data)]) == snap_bytes
        first_log = d.stderr()
        d.kill()
        d.start()
        with d.client() as c:
            h = c.health()
            assert h["snapshot_valid"] is True and h["status"] == "OK"
            assert h["active_messages"] == len(acked)
            assert {m["message_id"] for m in c.all_messages()} == acked
        assert "background snapshot installed" in first_log
        # the start used the snapshot: only the records after it were replayed
        replayed = int(d.stderr().split("replayed ")[1].split()[0])
        assert 40 <= replayed < 40 + EVERY


def _named_segments(data) -> list[str]:
    from storaged import snapshot
    from storaged.fileio import FileIO

    return [name for name, _, _ in snapshot.read(FileIO(), str(data / "snapshot"))[2]["segments"]]


def _named_rows(data) -> list[str]:
    from storaged import snapshot
    from storaged.fileio import FileIO

    with snapshot.Reader(FileIO(), str(data / "snapshot")) as reader:
        return [entry[0] for entry in reader.row_segments or ()]


def test_background_snapshots_write_merge_and_collect_index_segments(tmp_path):
    """Each background snapshot writes the postings indexed since the last one as a segment file and
    merges small ones, and the rows written since the last one as a delta row segment; the files on
    disk are the ones the snapshot names (the merged-away ones are removed), and a start after SIGKILL
    maps them and finds every message by its own word."""
    data = tmp_path / "data"
    words: dict[str, str] = {}
    with Daemon(data, extra_args=["--snapshot-every", "100"]) as d:
        d.start()
        with d.client() as c:
            for round_ in range(6):
                before = c.health()["snapshot_size"]
                for i in range(110):
                    w = _word(round_ * 1000 + i)
                    words[w] = c.write(f"s{round_}", f"{w} common text of round {round_}")["message_id"]
                _wait(lambda: c.health()["snapshot_size"] != before)
                # every message searchable meanwhile, whatever part of the index it is in
                assert c.call("search_messages", {"query": _word(round_ * 1000 + 7), "limit": 3})[
                    "results"][0]["message_id"] == words[_word(round_ * 1000 + 7)]
            _wait(lambda: sorted(p.name for p in data.glob("index.*.seg")) == sorted(_named_segments(data)))
            named = _named_segments(data)
            assert 1 <= len(named) < 6  # merged: fewer segments than snapshots
            _wait(lambda: sorted(p.name for p in data.glob("rows.*.seg")) == sorted(_named_rows(data)))
            assert len(_named_rows(data)) >= 2  # a base and the deltas after it (folded at half the base)
        d.kill()
        (data / "index.0123456789abcdef.seg").write_bytes(b"an orphan a crash left")
        d.start()
        with d.client() as c:
            assert c.health()["snapshot_valid"] is True
            for w, mid in words.items():
                got = c.call("search_messages", {"query": w, "limit": 3})["results"]
                assert got and got[0]["message_id"] == mid, w
            # the orphan is collected; the start may be writing a segment of its own meanwhile (the
            # replayed tail's), which is on disk a moment before the snapshot naming it is
            _wait(lambda: sorted(p.name for p in data.glob("index.*.seg")) == sorted(_named_segments(data)))
            assert not (data / "index.0123456789abcdef.seg").exists()
            _wait(lambda: sorted(p.name for p in data.glob("rows.*.seg")) == sorted(_named_rows(data)))
        with d.client() as c:
            assert {m["message_id"] for m in c.all_messages()} == set(words.values())


def test_a_background_snapshot_leaves_nothing_queued_for_the_index(tmp_path):
    """An import queues its messages for the index, which the loop indexes between requests; a background
    snapshot's child indexes what is still queued in its own copy and writes it as a segment, so the
    snapshot never leaves messages queued (a start after SIGKILL indexes only the log past it)."""
    from ulid import ULID

    from storaged import snapshot
    from storaged.fileio import FileIO

    data = tmp_path / "data"
    words: dict[str, str] = {}
    with Daemon(data, extra_args=["--snapshot-every", "200"]) as d:
        d.start()
        with d.client() as c:
            for batch in range(3):
                msgs = []
                for i in range(250):
                    n = batch * 1000 + i
                    ts = 1_700_000_000_000 + n * 1000
                    mid = str(ULID.from_bytes(((ts << 80) | n).to_bytes(16, "big")))
                    words[_word(n)] = mid
                    msgs.append({"message_id": mid, "session_id": f"s{batch}", "timestamp": ts, "role": "user",
                                 "content": f"{_word(n)} " + "a long tool output line " * 200, "revision": 1,
                                 "updated_at": ts, "metadata": {}})
                assert c.call("import_messages", {"messages": msgs})["imported"] == 250
                _wait(lambda: (data / "snapshot").exists() and c.health()["snapshot_size"] > 0)
            before = c.health()["snapshot_size"]
            _wait(lambda: c.health()["snapshot_size"] != before or not (data / "snapshot.bg.tmp").exists())
            meta, _, dump = snapshot.read(FileIO(), str(data / "snapshot"))
            assert meta["unindexed"] == []
            assert all((data / name).exists() for name, _, _ in dump["segments"])
        d.kill()
        d.start()
        with d.client() as c:
            assert c.health()["snapshot_valid"] is True
            for w, mid in words.items():
                # BUSY while the index catches up on the replayed tail: waited out
                got = c.call("search_messages", {"query": w, "limit": 3}, busy_retry=True,
                             deadline=time.monotonic() + 30)["results"]
                assert got and got[0]["message_id"] == mid, w


def test_kill_while_child_writes_leaves_a_clean_store(tmp_path):
    """However the daemon dies while a snapshot is being written, the next start is whole."""
    data = tmp_path / "data"
    with Daemon(data, extra_args=["--snapshot-every", "50"]) as d:
        for round_ in range(5):
            d.start()
            with d.client() as c:
                for i in range(60):
                    c.write("s", f"round {round_} message {i}")
            d.kill()  # often lands while a child is writing snapshot.bg.tmp
        d.start()
        with d.client() as c:
            assert c.health()["active_messages"] == 300
            assert c.health()["status"] == "OK"
        assert d.terminate() == 0  # a clean stop ends a child still writing and removes its file
        assert not (data / "snapshot.bg.tmp").exists()


def test_snapshot_every_zero_takes_none_in_the_background(tmp_path):
    data = tmp_path / "data"
    with Daemon(data, extra_args=["--snapshot-every", "0"]) as d:
        d.start()
        with d.client() as c:
            for i in range(120):
                c.write("s", f"m{i}")
            assert c.health()["snapshot_size"] == 0
        d.terminate()  # a clean stop still writes one
        assert (data / "snapshot").exists()


def test_a_start_indexes_its_replayed_tail_before_it_forks_a_snapshot(tmp_path, monkeypatch):
    """The loop indexes a start's replayed tail before any background snapshot: a child forked at once
    would index the same messages again on the other core while the loop's writes to pages the child
    shares are copied, which held a start after SIGKILL's first search back by seconds. The snapshot
    follows once the tail is indexed, and after REPLAY_CATCH_UP_MAX_S whatever is left. The daemon's
    loop is driven in-process (the fork is real)."""
    from storaged import server as server_mod
    from storaged.server import Server
    from storaged.store import Store
    from tests.support.faultio import write

    d = str(tmp_path / "data")
    store = Store.open(d)
    for i in range(30):
        write(store, "s1", f"before the snapshot {i}")
    store.index_step(None)
    assert store.write_snapshot()
    for i in range(60):
        write(store, "s2", f"the tail {i} kiwi")
    store.close()  # no snapshot: as if killed
    for waited_out in (False, True):
        store = Store.open(d)
        assert len(store.unindexed) == 60 and store.snapshot_pos < store.log_size()
        if waited_out:
            monkeypatch.setattr(server_mod, "REPLAY_CATCH_UP_MAX_S", 0.0)
        server = Server(store, f"inproc://convmem-replay-catch-up-{waited_out}")
        server.snapshot_every_records = 10
        try:
            server._background_snapshot()
            if not waited_out:
                assert server.snapshot_child is None  # the tail is the loop's first
                write(store, "s3", "written while the tail is indexed")
                server._background_snapshot()
                assert server.snapshot_child is None
                store.index_step(None)
                assert not store.unindexed
                server._background_snapshot()
            assert server.snapshot_child is not None
            server._reap_snapshot_child(block=True)
            assert store.snapshot_pos == store.log_size()
        finally:
            server.close()
            store.close()
        if not waited_out:  # the next start replays nothing; make a tail again for the second round
            again = Store.open(d)
            assert again.snapshot_pos == again.log_size() and not again.unindexed
            again.index_step(None)
            for i in range(60):
                write(again, "s4", f"another tail {i}")
            again.close()


def test_a_snapshot_forked_under_a_long_queue_leaves_it_to_the_loop_and_the_next_one_holds_it(tmp_path, monkeypatch):
    """The loop's own background snapshots (an in-process Server over a real Store, real forked children):
    forked while at least SPLIT_MIN messages wait for the index (an import's backlog), the child does not
    index them too — the snapshot names them unindexed — and once the loop has indexed them the next
    snapshot is due by itself (INDEXED_SINCE_SNAPSHOT) and holds them. A short queue is still indexed by
    the child, as before."""
    from storaged import server as server_module
    from storaged import snapshot
    from storaged.fileio import FileIO
    from storaged.server import Server
    from storaged.store import Store
    from tests.support.faultio import search, write

    monkeypatch.setattr(server_module, "SPLIT_MIN", 20)
    monkeypatch.setattr(server_module, "INDEXED_SINCE_SNAPSHOT", 20)
    d = str(tmp_path / "data")
    store = Store.open(d)
    server = Server(store, "inproc://convmem-snapshot-queue")
    server.snapshot_every_records = 10

    def snapshot_now() -> tuple:
        server._background_snapshot()
        assert server.snapshot_child is not None
        plan = server.snapshot_child[3]
        server._reap_snapshot_child(block=True)
        assert server.snapshot_child is None and store.snapshot_pos == store.log_size()
        return plan, snapshot.read(FileIO(), os.path.join(d, "snapshot"))[0]["unindexed"]

    try:
        ids = {_word(i): write(store, "s", f"{_word(i)} queued text")["message"]["message_id"] for i in range(30)}
        queued = sorted(store.unindexed)
        plan, unindexed = snapshot_now()
        assert plan.catchup_name is None and sorted(unindexed) == queued
        store.index_step(None)   # the loop's work meanwhile
        server.snapshot_every_records = 1000   # (so that only INDEXED_SINCE_SNAPSHOT makes it due)
        _, unindexed = snapshot_now()   # nothing new in the log: due because the index caught up
        assert unindexed == []
        server.snapshot_every_records = 10
        more = {_word(i): write(store, "s", f"{_word(i)} queued text")["message"]["message_id"]
                for i in range(30, 42)}   # 12 queued: fewer than SPLIT_MIN
        plan, unindexed = snapshot_now()
        assert plan.catchup_name is not None and unindexed == []
        ids.update(more)
    finally:
        server.close()
        store.close()
    store = Store.open(d)
    try:
        assert not store.unindexed
        for word, mid in ids.items():
            assert search(store, query=word)["results"][0]["message_id"] == mid, word
    finally:
        store.close()
