"""Faults from outside the daemon's control: records from the far future, a daemon killed while its
snapshot child writes, a transient I/O failure, request ids that outlive their retention.

Each test reproduces a finding of the hardening review (issue 12) and fails without its fix.
"""
from __future__ import annotations

import json
import os
import signal
import time

import pytest
from ulid import ULID

from tests.support.admin_cli import convmem, out_json
from tests.support.daemon_proc import Daemon, new_rid, pid_alive
from tests.support.faultio import FaultIO, delete, write
from protocol import errors as E
from protocol import limits as L
from protocol.errors import ProtocolError
from storaged.idgen import IdClock
from storaged.store import Store

pytestmark = pytest.mark.timeout(120)

YEAR_9999_MS = 253402300799000  # 9999-12-31T23:59:59Z
MAX_ULID = "7ZZZZZZZZZZZZZZZZZZZZZZZZZ"
HOUR_MS = 3_600_000


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def assert_fresh(msg: dict) -> None:
    """A message written now: its timestamp is the wall clock's, its id a valid ULID of that time."""
    assert abs(msg["timestamp"] - now_ms()) < HOUR_MS, msg
    assert ULID.from_str(msg["message_id"]).milliseconds == msg["timestamp"]


def _wait(cond, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


# ------------------------------------------------------------------ 1: imported future times
@pytest.mark.unit  # in-process, unlike the rest of this module
def test_id_clock_ignores_times_beyond_the_bound():
    clock = IdClock()
    clock.observe_id(MAX_ULID)
    clock.observe_ms(YEAR_9999_MS)
    ulid, ms = clock.new_id()
    assert abs(ms - now_ms()) < HOUR_MS and ULID.from_str(ulid).milliseconds == ms
    assert clock.rejected == 2
    # within the skew a time is still observed: ids never go below it (an NTP step back)
    ahead = now_ms() + HOUR_MS
    clock.observe_ms(ahead)
    assert clock.new_id()[1] >= ahead
    # whatever state it is put in, it never hands out an id beyond 48 bits of milliseconds
    clock.last_id_ms, clock.last_rand, clock.last_ms = L.TIME_MS_MAX, (1 << 80) - 1, L.TIME_MS_MAX
    with pytest.raises(OverflowError):
        clock.new_id()


def test_import_of_future_ids_and_times_leaves_writes_working(tmp_path):
    """`convmem import` of an id 7ZZZ... and of a message dated 9999: both stored as they are, the CLI
    warns, and later writes get ids and times of now — after a restart and a rebuild too."""
    home = tmp_path / "home"
    home.mkdir()
    data = tmp_path / "data"
    normal = {"message_id": str(ULID()), "session_id": "imp", "timestamp": now_ms(), "role": "user",
              "content": "an ordinary message"}
    far_id = {"message_id": MAX_ULID, "session_id": "imp", "timestamp": now_ms(), "role": "user",
              "content": "an id at the end of time"}
    far_ts = {"message_id": str(ULID()), "session_id": "imp", "timestamp": YEAR_9999_MS, "role": "assistant",
              "content": "dated 9999"}
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(m) + "\n" for m in (normal, far_id, far_ts)))
    with Daemon(data) as d:
        d.start()
        p = convmem(data, home, "import", str(src))
        assert out_json(p) == {"imported": 3, "existing": 0, "malformed_lines": 0, "first_malformed": [],
                               "invalid_lines": 0, "first_invalid": [], "future_times": 2}
        warning = [ln for ln in p.stderr.decode().splitlines() if "warning" in ln]
        assert len(warning) == 1 and "2 imported messages" in warning[0] and "future" in warning[0]
        with d.client() as c:
            assert_fresh(c.write("s", "written after the import"))
            stored = {m["message_id"]: m for m in c.history("imp")}
            assert stored[MAX_ULID]["content"] == far_id["content"]          # kept as it is
            assert stored[far_ts["message_id"]]["timestamp"] == YEAR_9999_MS
        d.kill()
        d.start()
        with d.client() as c:
            assert_fresh(c.write("s", "after a crash and restart"))
            assert c.rebuild()["status"] == "OK"
            assert_fresh(c.write("s", "after rebuild_index"))
            assert c.health()["status"] == "OK"
        assert d.terminate() == 0
        d.start()  # from the snapshot written at the clean stop
        with d.client() as c:
            assert_fresh(c.write("s", "after a clean restart"))
            assert len(c.history("imp")) == 3


@pytest.mark.parametrize("load", ["replay", "snapshot"])
def test_a_store_poisoned_before_the_bound_heals_on_start(tmp_path, load):
    """A store whose writes were stamped 9999 (the clock had observed an import) is served with times
    of now again after a start, whether it replays the log or loads a snapshot of the bad clock."""
    data = str(tmp_path / "data")
    s = Store.open(data)
    s.clock._wall_ms = lambda: YEAR_9999_MS  # what the unbounded clock did after observing 9999
    poisoned = write(s, "s", "stamped 9999")["message"]
    assert poisoned["timestamp"] == YEAR_9999_MS
    if load == "snapshot":
        assert s.write_snapshot()
    s.close()
    with Daemon(data) as d:
        d.start()
        with d.client() as c:
            assert c.health()["snapshot_valid"] is True
            assert_fresh(c.write("s", "healed"))
            assert {m["message_id"] for m in c.history("s")} >= {poisoned["message_id"]}


# ------------------------------------------------------------------ 5: a crash during a background snapshot
def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != b"Z":
                out.append(int(entry))
    return out


def _open_files(pid: int) -> set[str]:
    out = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                out.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
            except OSError:
                pass
    except OSError:
        pass
    return out


def test_kill_during_background_snapshot_restarts_at_once(tmp_path, monkeypatch):
    """SIGKILL the daemon while its snapshot child writes: the child neither holds the data
    directory's lock nor outlives the daemon, and a new daemon starts at once with every
    acknowledged write."""
    monkeypatch.setenv("CONVMEM_FAULT_SNAPSHOT_DELAY_S", "600")  # the child stays "writing"
    data = tmp_path / "data"
    children: list[int] = []
    try:
        with Daemon(data, extra_args=["--snapshot-every", "20"]) as d:
            d.start()
            with d.client() as c:
                acked = {c.write("s", f"m{i}")["message_id"] for i in range(30)}
            _wait(lambda: bool(_children(d.pid)))
            children = _children(d.pid)
            lock = str(data / "LOCK")
            _wait(lambda: lock not in _open_files(children[0]))  # it lets go of the lock at once
            assert lock in _open_files(d.pid)
            d.kill()
            _wait(lambda: not pid_alive(children[0]))             # and dies with its parent
            d.start()                                               # no "already owns the data directory"
            with d.client() as c:
                assert {m["message_id"] for m in c.all_messages()} == acked
                assert c.health()["status"] == "OK"
    finally:
        for pid in children:
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)


# ------------------------------------------------------------------ 11a: a transient I/O failure
@pytest.mark.unit  # in-process, unlike the rest of this module
def test_transient_append_failure_clears_on_next_success(tmp_path):
    io = FaultIO(kinds=["sync"])
    store = Store.open(str(tmp_path / "data"), io=io)
    write(store, "s", "before")
    io.arm(0)
    with pytest.raises(ProtocolError) as info:
        write(store, "s", "lost to ENOSPC")
    assert info.value.code == E.IO_ERROR
    h = store.health()
    assert h["status"] == "DEGRADED" and "log append failed" in h["last_error"]
    io.arm(None)
    write(store, "s", "the disk has room again")
    h = store.health()
    assert (h["status"], h["last_error"]) == ("OK", "")
    store.close()


@pytest.mark.unit  # in-process, unlike the rest of this module
def test_append_failure_that_could_not_be_undone_stays_degraded(tmp_path):
    io = FaultIO(kinds=["sync", "truncate"], repeat=True)
    store = Store.open(str(tmp_path / "data"), io=io)
    write(store, "s", "before")
    io.arm(0)
    with pytest.raises(ProtocolError):
        write(store, "s", "maybe")
    io.arm(None)
    with pytest.raises(ProtocolError) as info:
        write(store, "s", "refused")
    assert info.value.code == E.IO_ERROR
    assert store.health()["status"] == "DEGRADED"
    store.close()


# ------------------------------------------------------------------ 11b: request-id retention
def test_rebuild_forgets_expired_request_ids(tmp_path):
    """Request ids older than REQUEST_ID_RETENTION_S are not carried into a rebuilt log, while a
    fresh one is still answered with its first result (after the rebuild and after a restart)."""
    data = str(tmp_path / "data")
    s = Store.open(data)
    past = now_ms() - (L.REQUEST_ID_RETENTION_S * 1000 + 2 * HOUR_MS)
    s.clock._wall_ms = lambda: past        # the daemon that wrote these ran two days ago
    s.group_commit = True                  # one fdatasync at the end, not thousands
    for i in range(2000):
        mid = write(s, "old", f"old {i}")["message"]["message_id"]
        delete(s, mid)
    s.writer.sync()
    s.close()
    with Daemon(data) as d:
        d.start()
        with d.client() as c:
            r = new_rid()
            first = c.call("write_message", {"session_id": "new", "role": "user", "content": "fresh"}, rid=r)
            assert first["status"] == "OK"
            done = c.rebuild()
            assert done["status"] == "OK"
            # header, the checkpoint record (one request id) and one message: no 4000 old request ids
            assert done["bytes_after"] < 2048, done
            again = c.call("write_message", {"session_id": "new", "role": "user", "content": "fresh"}, rid=r)
            assert again["message"]["message_id"] == first["message"]["message_id"]
        d.kill()
        d.start()
        with d.client() as c:
            again = c.call("write_message", {"session_id": "new", "role": "user", "content": "fresh"}, rid=r)
            assert again["message"]["message_id"] == first["message"]["message_id"]
            assert c.health()["active_messages"] == 1


@pytest.mark.unit  # in-process, unlike the rest of this module
@pytest.mark.parametrize("seed", range(8))
def test_what_a_restart_replays_is_made_durable_before_it_is_acknowledged(tmp_path, seed):
    """A daemon that exited after a failed shared fdatasync (EXIT_FSYNC_FAILED) left its batch in the page
    cache only. The restarted daemon replays it and answers the clients' retries "already applied" — so
    opening the store must make what it replayed durable first: a power cut afterwards keeps it."""
    import random

    from tests.support.faultio import NoSyncIO

    io = NoSyncIO(str(tmp_path))
    store = Store.open(str(tmp_path), io)
    io.armed = True                        # the fdatasync of this write does not happen
    rid = new_rid()
    first = write(store, content="in the page cache only", request_id=rid)
    store.close()                          # the process dies; the machine (and its page cache) does not
    io.armed = False
    again = Store.open(str(tmp_path), io)  # the restart, on the same page cache
    assert write(again, content="in the page cache only", request_id=rid) == first  # "already applied"
    again.close()
    io.power_cut(random.Random(seed))      # ... and then the power goes
    after = Store.open(str(tmp_path))
    assert [m.content for m in after.by_id.values()] == ["in the page cache only"]
    after.close()
