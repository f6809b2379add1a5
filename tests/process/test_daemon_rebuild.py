"""rebuild_index under load, through a real daemon: while the compaction runs beside the request
loop, mutations get BUSY at once (never another error, never a hang) and reads keep being served;
afterwards the store holds exactly the live messages, before and after restarts, and the figures
agree with the files. Also: a rebuild interrupted by SIGTERM or SIGKILL leaves the old store whole.

The store is pre-built by opening ``storaged.store.Store`` in the test process (much faster than
the protocol), once per module, and copied for each test."""
from __future__ import annotations

import os
import random
import shutil
import signal
import struct
import threading
import time

import pytest
import ulid

from tests.support.daemon_proc import DaemonPool, NoReply, new_rid, state_of
from protocol import wire
from protocol.validation import validate
from storaged import log as logfile
from storaged.fileio import FileIO
from storaged.store import Store

N_MESSAGES = 30_000          # large enough that a rebuild takes seconds on this class of machine
N_LARGE = 54_000             # the slow variant: >= 50k live messages, for the longest-pause figure
N_SESSIONS = 250
WORDS = ("alpha beta gamma delta decision database project meeting tokyo coffee plan review deploy "
         "cache index memory budget launch contract search").split()


class SetupIO(FileIO):
    """Test setup only: skip fsync while pre-building (the page cache serves the daemon all the same)."""

    def sync(self, fd: int) -> None:
        self.counters.flush_calls += 1

    def sync_dir(self, path: str) -> None:
        pass


_BUILT: dict[int, tuple] = {}


def build_store(tmp_path_factory, n: int):
    """A data dir with n writes, every 13th updated, every 17th deleted, plus a snapshot; built once
    per size and session. Returns (path, figures)."""
    if n not in _BUILT:
        _BUILT[n] = _build(tmp_path_factory.mktemp(f"prebuilt{n}") / "d", n)
    return _BUILT[n]


@pytest.fixture(scope="module")
def prebuilt(tmp_path_factory):
    return build_store(tmp_path_factory, N_MESSAGES)


def _build(path, n: int):
    rng = random.Random(5)
    store = Store.open(str(path), SetupIO())
    ids = []
    t0 = time.monotonic()
    for i in range(n):
        args = validate("write_message", {
            "session_id": f"s{i % N_SESSIONS}", "role": rng.choice(["user", "assistant"]),
            "content": " ".join(rng.choice(WORDS) for _ in range(8)) + f" n{i}",
            "metadata_json": '{"tags": ["t%d"], "importance": %d}' % (i % 5, i % 101)})
        ids.append(store.write_message(args, str(ulid.ULID()))["message"]["message_id"])
    updates = deletes = 0
    for i in range(0, n, 13):
        store.update_message(validate("update_message", {"message_id": ids[i], "content": f"updated n{i} decision"}),
                             str(ulid.ULID()))
        updates += 1
    for i in range(5, n, 17):
        store.delete_message(validate("delete_message", {"message_id": ids[i]}), str(ulid.ULID()))
        deletes += 1
    store.index_step(None)  # as a daemon's clean stop does: the snapshot holds the whole search index
    store.write_snapshot()
    live = len(store.by_id)
    store.close()
    figures = {"writes": n, "updates": updates, "deletes": deletes, "live": live,
               "records": n + updates + deletes, "build_s": time.monotonic() - t0}
    return path, figures


@pytest.fixture
def pool(tmp_path):
    p = DaemonPool(tmp_path)
    yield p
    p.close_all()


def _copy(prebuilt, pool, name: str = "d"):
    src, figures = prebuilt
    d = pool.new(name)
    shutil.copytree(src, d.data_dir)
    return d, figures


def _is_err(rep, code: str) -> bool:
    return isinstance(rep, dict) and rep.get("status") == "ERROR" and rep["error"]["code"] == code


def _log_frames(path: str, start: int) -> int:
    """Number of records from ``start`` to the end of the log file; asserts they end exactly at EOF."""
    buf = open(path, "rb").read()
    pos, n = start, 0
    while pos < len(buf):
        (length,) = struct.unpack_from("<I", buf, pos)
        pos += logfile.FRAME_SIZE + length
        n += 1
    assert pos == len(buf)
    return n


class Load:
    """Writers, readers and a pinger hammering the daemon while the rebuild runs."""

    def __init__(self, d, before: dict, sessions: list[str]) -> None:
        self.d = d
        self.ids = list(before)
        self.sessions = sessions
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.busy = 0
        self.bad: list[str] = []
        self.after_rebuild: list[tuple[str, dict, dict]] = []   # (op, args, reply) applied after the rebuild
        self.reads = 0
        self.health_rebuilding = 0
        self.ping_max_ms = 0.0
        self.pings = 0
        self.rebuilding = True
        self.threads = [threading.Thread(target=self.writer, args=(k,), daemon=True) for k in range(2)]
        self.threads += [threading.Thread(target=self.reader, args=(k,), daemon=True) for k in range(2)]
        self.threads.append(threading.Thread(target=self.pinger, daemon=True))

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def join(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(60)
            assert not t.is_alive()

    def writer(self, k: int) -> None:
        rng = random.Random(k)
        with self.d.client(timeout_ms=5000, retries=0) as c:
            while not self.stop.is_set():
                kind = rng.choice(["write", "write", "update", "delete"])
                if kind == "write":
                    op, args = "write_message", {"session_id": f"late{k}", "role": "user", "content": f"late {k}"}
                elif kind == "update":
                    op, args = "update_message", {"message_id": rng.choice(self.ids), "content": f"late update {k}"}
                else:
                    op, args = "delete_message", {"message_id": rng.choice(self.ids)}
                try:
                    rep = c.call(op, args)
                except NoReply:
                    self.bad.append(f"{op}: no reply within 5 s (a hang)")
                    return
                if _is_err(rep, "BUSY"):
                    assert rep["error"].get("retryable") is True and rep["error"]["retry_after_ms"] > 0
                    with self.lock:
                        self.busy += 1
                    time.sleep(0.005)
                    continue
                if rep.get("status") in ("OK", "NOT_FOUND"):  # the rebuild is over: one mutation, then stop
                    with self.lock:
                        self.after_rebuild.append((op, args, rep))
                    return
                self.bad.append(f"{op}: {rep!r:.300}")
                return

    def reader(self, k: int) -> None:
        rng = random.Random(100 + k)
        with self.d.client(timeout_ms=5000, retries=0) as c:
            while not self.stop.is_set():
                which = rng.randrange(4)
                try:
                    if which == 0:
                        rep = c.call("read_messages", {"session_id": rng.choice(self.sessions), "limit": 50})
                        ok = "history" in rep and len(rep["history"]) > 0
                    elif which == 1:
                        rep = c.call("search_messages", {"query": "decision database", "limit": 10})
                        ok = "results" in rep and len(rep["results"]) > 0
                    elif which == 2:
                        rep = c.call("get_system_health")
                        ok = rep.get("status") == "OK"
                        if rep.get("rebuilding"):
                            with self.lock:
                                self.health_rebuilding += 1
                    else:
                        rep = c.call("read_messages", {"view": "content", "message_id": rng.choice(self.ids)})
                        ok = "content_range" in rep or _is_err(rep, "NOT_FOUND")  # deleted after the rebuild
                except NoReply:
                    self.bad.append("read: no reply within 5 s (a hang)")
                    return
                if not ok:
                    self.bad.append(f"read {which}: {rep!r:.300}")
                    return
                with self.lock:
                    self.reads += 1

    def pinger(self) -> None:
        with self.d.client(timeout_ms=10_000, retries=0) as c:
            while not self.stop.is_set():
                t = time.perf_counter()
                try:
                    rep = c.call("ping")
                except NoReply:
                    self.bad.append("ping: no reply within 10 s")
                    return
                ms = (time.perf_counter() - t) * 1000
                if self.rebuilding and rep.get("rebuilding"):
                    self.ping_max_ms = max(self.ping_max_ms, ms)
                    self.pings += 1
                time.sleep(0.005)


@pytest.mark.timeout(240)
def test_rebuild_under_load(prebuilt, pool):
    _rebuild_under_load(prebuilt, pool)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_rebuild_under_load_large(tmp_path_factory, pool):
    """The same with >= 50k live messages; prints the longest ping round trip seen meanwhile."""
    built = build_store(tmp_path_factory, N_LARGE)
    assert built[1]["live"] >= 50_000
    _rebuild_under_load(built, pool)


def _rebuild_under_load(prebuilt, pool) -> None:
    d, fig = _copy(prebuilt, pool)
    d.start()
    with d.client(timeout_ms=30_000) as c:
        h0 = c.health()
        before = state_of(c.all_messages())
    assert h0["active_messages"] == fig["live"] == len(before)
    assert h0["snapshot_valid"] is True and h0["rebuilding"] is False
    sessions = sorted({m["session_id"] for m in before.values()})
    load = Load(d, before, sessions)

    with d.client(timeout_ms=10_000) as c:
        rid = new_rid()
        t0 = time.monotonic()
        first = c.call("rebuild_index", {}, rid=rid)
        assert first["status"] == wire.REBUILDING and first["rebuild_id"] == rid, first
        load.start()
        # The same request again is the same rebuild; another one is BUSY.
        assert c.call("rebuild_index", {}, rid=rid)["rebuild_id"] == rid
        assert _is_err(c.call("rebuild_index", {}), "BUSY")
        while True:
            rep = c.call("rebuild_status", {"rebuild_id": rid})
            if rep.get("status") != wire.REBUILDING:
                break
            assert time.monotonic() - t0 < 180, "rebuild takes too long"
            time.sleep(0.05)
        load.rebuilding = False
        rebuild_s = time.monotonic() - t0
        final = rep
        time.sleep(0.2)  # let each writer see the end and apply its one late mutation
        load.join()
        # Asking again gives the same final figures.
        assert c.call("rebuild_status", {"rebuild_id": rid}) == final
        h1 = c.health()
        after = state_of(c.all_messages())

    print(f"\nrebuild of {fig['live']} live messages ({fig['records']} records) took {rebuild_s:.2f} s under load: "
          f"{load.busy} BUSY replies, {load.reads} reads served, {load.health_rebuilding} health replies showing "
          f"rebuilding, longest ping round trip {load.ping_max_ms:.1f} ms over {load.pings} pings; "
          f"prebuild {fig['build_s']:.1f} s")
    assert load.bad == [], load.bad
    assert load.busy > 0 and load.reads > 0 and load.health_rebuilding > 0

    # The figures.
    assert final["status"] == "OK", final
    assert final["messages_indexed"] == fig["live"] == len(before)
    assert final["records_removed"] == fig["records"] - fig["live"]
    assert final["bytes_before"] == h0["log_size"]
    assert 0 < final["bytes_after"] < final["bytes_before"]
    log_path = os.path.join(d.data_dir, "log")
    assert h1["log_size"] == os.path.getsize(log_path)
    # Past bytes_after the new log holds exactly the late mutations that were applied.
    applied = [(op, args, rep) for op, args, rep in load.after_rebuild if rep.get("status") == "OK"]
    assert _log_frames(log_path, final["bytes_after"]) == len(applied)
    if not applied:
        assert final["bytes_after"] == h1["log_size"]

    # Exactly the live messages survived, plus the late mutations.
    expected = dict(before)
    late_deletes = late_updates = 0
    for op, args, rep in applied:
        if op == "write_message":
            expected[rep["message"]["message_id"]] = rep["message"]
        elif op == "update_message":
            expected[rep["message"]["message_id"]] = rep["message"]
            late_updates += 1
        else:
            del expected[args["message_id"]]
            late_deletes += 1
    assert after == expected
    assert h1["active_messages"] == len(expected)
    assert h1["rebuilding"] is False and h1["status"] == "OK"
    assert h1["update_records"] == late_updates and h1["deleted_messages"] == late_deletes
    assert final["messages_indexed"] == h1["active_messages"] - sum(op == "write_message" for op, _, _ in applied) \
        + late_deletes
    assert not os.path.exists(log_path + ".compact") and not os.path.exists(os.path.join(d.data_dir, "snapshot.tmp"))

    # The same after a crash (the rebuild's own snapshot plus the log) and after a clean stop.
    d.kill()
    d.start()
    with d.client(timeout_ms=30_000) as c:
        assert state_of(c.all_messages()) == expected
        h2 = c.health()
        assert h2["snapshot_valid"] is True and h2["recovered_tail"] is False and h2["status"] == "OK"
        assert h2["log_size"] == h1["log_size"] and h2["active_messages"] == len(expected)
    assert d.terminate() == 0
    d.start()
    with d.client(timeout_ms=30_000) as c:
        assert state_of(c.all_messages()) == expected
        # A second rebuild with nothing going on: bytes_after is exactly the log size.
        second = c.rebuild()
        h3 = c.health()
        assert second["status"] == "OK" and second["messages_indexed"] == h3["active_messages"] == len(expected)
        assert second["bytes_after"] == h3["log_size"] == os.path.getsize(log_path)
        assert second["bytes_before"] == h2["log_size"]
        assert h3["dead_bytes"] == 0 and h3["update_records"] == 0 and h3["deleted_messages"] == 0
        assert state_of(c.all_messages()) == expected
    assert d.terminate() == 0


@pytest.mark.timeout(180)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_rebuild_interrupted_leaves_the_old_store(prebuilt, pool, sig):
    d, fig = _copy(prebuilt, pool)
    d.start()
    with d.client(timeout_ms=30_000) as c:
        h0 = c.health()
        before = c.all_messages()
        assert c.call("rebuild_index", {})["status"] == wire.REBUILDING
        assert c.call("ping")["rebuilding"] is True
    t = time.monotonic()
    rc = d.terminate(sig)
    stop_s = time.monotonic() - t
    if sig == signal.SIGTERM:
        assert rc == 0, d.stderr()
        assert "did not complete" in d.stderr()  # cancelled, not finished in the shutdown path
        assert stop_s < 30
    leftovers = {"log.compact", "snapshot.tmp"} & set(os.listdir(d.data_dir))
    if sig == signal.SIGTERM:
        assert not leftovers
    d.start()
    assert not {"log.compact", "snapshot.tmp"} & set(os.listdir(d.data_dir))
    with d.client(timeout_ms=30_000) as c:
        assert c.all_messages() == before
        h1 = c.health()
        assert h1["log_size"] == h0["log_size"] and h1["active_messages"] == h0["active_messages"]
        assert h1["status"] == "OK" and h1["rebuilding"] is False
        c.write("after", "writable")
    assert d.terminate() == 0
