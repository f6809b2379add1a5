"""The daemon as a process: one per data directory, private socket, CURVE for TCP, clean and
unclean stops, salvage of a damaged log, quiet logs. Real processes and sockets throughout."""
from __future__ import annotations

import json
import os
import signal
import socket
import stat
import struct
import threading
import time

import pytest
import zmq

from tests.support.daemon_proc import DaemonPool, new_rid, run_storaged, state_of
from storaged import log as logfile


@pytest.fixture
def pool(tmp_path):
    p = DaemonPool(tmp_path)
    yield p
    p.close_all()


def _fill(c, n: int, sessions: int = 5, tag: str = "m") -> list[dict]:
    """n writes over a few sessions, then some updates and deletes; returns the live messages."""
    msgs = [c.write(f"s{i % sessions}", f"{tag} {i} content {'x' * (i % 7)}",
                    metadata={"tags": [f"t{i % 3}"], "importance": i % 101}) for i in range(n)]
    for m in msgs[::7]:
        rep = c.call("update_message", {"message_id": m["message_id"], "content": m["content"] + " (edited)"})
        assert rep["status"] == "OK" and rep["changed"] is True, rep
    for m in msgs[3::11]:
        assert c.call("delete_message", {"message_id": m["message_id"]}) == {"status": "OK"}
    return c.all_messages()


# ------------------------------------------------------------------ one daemon per data directory
@pytest.mark.timeout(60)
def test_second_daemon_refused_first_keeps_serving(pool):
    d = pool.new().start()
    with d.client() as c:
        c.write("s", "before the second daemon")
        # Same directory, default endpoint, and same directory on another endpoint: both refused.
        for extra in ([], ["--endpoint", "ipc://" + os.path.join(str(pool.base), "other.sock")]):
            r = run_storaged(["--data-dir", d.data_dir, *extra], timeout=30)
            assert r.returncode == 3, (r.returncode, r.stderr)
            assert os.path.abspath(d.data_dir) in r.stderr
            assert str(d.pid) in r.stderr  # names the owner
            assert r.stdout == ""
        assert not os.path.exists(os.path.join(str(pool.base), "other.sock"))
        # The first daemon still owns its socket and answers.
        assert c.call("ping")["pid"] == d.pid
        c.write("s", "after the second daemon")
        assert [m["content"] for m in c.history("s")] == ["before the second daemon", "after the second daemon"]
    assert d.alive()
    assert d.terminate() == 0


@pytest.mark.timeout(60)
def test_run_dir_private_socket_and_pid_file(pool):
    d = pool.new().start()
    run = d.run_dir()
    st = os.stat(run)
    assert stat.S_IMODE(st.st_mode) == 0o700
    sock_path = d.endpoint[len("ipc://"):]
    assert os.path.dirname(sock_path) == run
    assert stat.S_ISSOCK(os.stat(sock_path).st_mode)
    with open(os.path.join(run, "storaged.pid")) as f:
        assert int(f.read()) == d.pid
    assert d.terminate() == 0
    assert not os.path.exists(os.path.join(run, "storaged.pid"))


@pytest.mark.timeout(60)
def test_run_dir_permissions_are_repaired(pool):
    d = pool.new()
    os.makedirs(d.run_dir(), mode=0o755)
    os.chmod(d.run_dir(), 0o755)
    d.start()
    assert stat.S_IMODE(os.stat(d.run_dir()).st_mode) == 0o700
    assert d.terminate() == 0


# ------------------------------------------------------------------ TCP needs CURVE
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(60)
def test_tcp_without_curve_keys_refused(tmp_path):
    t0 = time.monotonic()
    r = run_storaged(["--data-dir", str(tmp_path / "d"), "--endpoint", f"tcp://127.0.0.1:{_free_port()}"])
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "CURVE" in r.stderr
    assert r.stdout == ""
    assert time.monotonic() - t0 < 20
    # A non-loopback address is refused too (opt-in only).
    r = run_storaged(["--data-dir", str(tmp_path / "d"), "--endpoint", f"tcp://0.0.0.0:{_free_port()}"])
    assert r.returncode == 2 and "loopback" in r.stderr, r.stderr


@pytest.mark.timeout(60)
def test_tcp_with_curve_keys(pool, tmp_path):
    server_public, server_secret = zmq.curve_keypair()
    key_file = tmp_path / "server.key"
    key_file.write_bytes(server_secret + b"\n")
    os.chmod(key_file, 0o600)
    endpoint = f"tcp://127.0.0.1:{_free_port()}"
    d = pool.new(endpoint=endpoint, extra_args=["--curve-secret-key-file", str(key_file), "--curve-allow-any"],
                 curve_server_public=server_public).start()
    with d.client() as c:
        m = c.write("tcp", "over CURVE")
        assert c.history("tcp") == [m]
        assert c.health()["status"] == "OK"
    # A client without CURVE gets nothing (the handshake fails, no reply ever comes).
    with d.client(curve_server_public=None) as plain:
        assert plain.try_call("ping", timeout_ms=500) is None
    # A client that trusts another server key gets nothing either.
    with d.client(curve_server_public=zmq.curve_keypair()[0]) as wrong:
        assert wrong.try_call("ping", timeout_ms=500) is None
    assert d.terminate() == 0


# ------------------------------------------------------------------ clean and unclean stops
@pytest.mark.timeout(90)
def test_sigterm_writes_snapshot_and_restart_is_identical(pool):
    d = pool.new().start()
    with d.client() as c:
        before = _fill(c, 400)
        h1 = c.health()
    assert h1["status"] == "OK"
    snap = os.path.join(d.data_dir, "snapshot")
    assert d.terminate(signal.SIGTERM) == 0
    assert os.path.getsize(snap) > 0
    assert "snapshot written" in d.stderr()
    assert d.stdout() == ""
    # Quiet logs: a few lines per run, none per request, no request ids.
    lines = d.stderr().splitlines()
    assert len(lines) < 12, lines
    assert not any(m["message_id"] in d.stderr() for m in before)

    ready_s = d.start().wait_ready()
    with d.client() as c:
        after = c.all_messages()
        h2 = c.health()
    assert state_of(after) == state_of(before)
    assert after == before
    assert h2["snapshot_valid"] is True and h2["recovered_tail"] is False and h2["status"] == "OK"
    for k in ("active_messages", "session_count", "deleted_messages", "last_sequence", "update_records",
              "log_size", "dead_bytes"):
        assert h2[k] == h1[k], k
    assert ready_s < 15
    # SIGINT is a clean stop too; with nothing changed the snapshot is left as it was.
    mtime = os.stat(snap).st_mtime_ns
    assert d.terminate(signal.SIGINT) == 0
    assert os.stat(snap).st_mtime_ns == mtime


@pytest.mark.timeout(90)
def test_sigterm_under_load_keeps_every_acknowledged_write(pool):
    d = pool.new().start()
    acked: list[dict] = []
    stop = threading.Event()

    def writer(k: int) -> None:
        with d.client(timeout_ms=1000, retries=0) as c:
            i = 0
            while not stop.is_set():
                rep = c.try_call("write_message", {"session_id": f"w{k}", "role": "user", "content": f"w{k}-{i}"})
                if rep is None:
                    return  # the daemon stopped: this one is in doubt, not acknowledged
                assert rep["status"] == "OK", rep
                acked.append(rep["message"])
                i += 1

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    while len(acked) < 200:
        time.sleep(0.01)
    assert d.terminate(signal.SIGTERM) == 0
    stop.set()
    for t in threads:
        t.join(30)
    d.start()
    with d.client() as c:
        stored = state_of(c.all_messages())
        assert c.health()["snapshot_valid"] is True
    for m in acked:
        assert stored[m["message_id"]] == m
    # Nothing beyond the acknowledged writes plus at most one in-flight write per writer.
    assert len(acked) <= len(stored) <= len(acked) + len(threads)
    assert d.terminate() == 0


@pytest.mark.timeout(90)
def test_sigkill_then_restart_keeps_acknowledged_state(pool):
    d = pool.new().start()
    with d.client() as c:
        before = _fill(c, 300)
        h1 = c.health()
    assert d.kill() == -signal.SIGKILL
    assert not os.path.exists(os.path.join(d.data_dir, "snapshot"))  # no clean stop, no snapshot
    d.start()
    with d.client() as c:
        assert c.all_messages() == before
        h2 = c.health()
        for k in ("active_messages", "session_count", "deleted_messages", "last_sequence", "update_records",
                  "log_size"):
            assert h2[k] == h1[k], k
        assert h2["status"] == "OK"
        # A retried mutation from before the kill is answered with its first result, not applied again.
        rid = new_rid()
        first = c.call("write_message", {"session_id": "again", "role": "user", "content": "once"}, rid=rid)
    d.kill()
    d.start()
    with d.client() as c:
        again = c.call("write_message", {"session_id": "again", "role": "user", "content": "once"}, rid=rid)
        assert again == first
        assert len(c.history("again")) == 1
    assert d.terminate() == 0


# ------------------------------------------------------------------ damage and salvage
def _record_offsets(buf: bytes) -> list[tuple[int, int]]:
    """(offset, framed size) of each record of a log file."""
    out = []
    pos = logfile.HEADER_SIZE
    while pos + logfile.FRAME_SIZE <= len(buf):
        (length,) = struct.unpack_from("<I", buf, pos)
        out.append((pos, logfile.FRAME_SIZE + length))
        pos += logfile.FRAME_SIZE + length
    assert pos == len(buf)
    return out


@pytest.mark.timeout(120)
def test_salvage_of_a_log_damaged_mid_way(pool):
    d = pool.new().start()
    with d.client() as c:
        msgs = [c.write(f"s{i % 3}", f"record {i}") for i in range(40)]
    d.kill()  # no snapshot: the start must read the whole log
    log_path = os.path.join(d.data_dir, "log")
    buf = bytearray(open(log_path, "rb").read())
    records = _record_offsets(bytes(buf))
    assert len(records) == 40
    victim = 5
    off, size = records[victim]
    buf[off + logfile.FRAME_SIZE + size // 2 - 4] ^= 0x5A  # one byte inside the 6th record's payload
    with open(log_path, "wb") as f:
        f.write(buf)
    damaged = bytes(buf)

    # 1. The daemon starts DEGRADED: reads served, mutations CORRUPT_STORE, the file untouched.
    d.start()
    with d.client() as c:
        h = c.health()
        assert h["status"] == "DEGRADED" and str(off) in h["last_error"], h
        assert h["active_messages"] == victim
        rep = c.call("write_message", {"session_id": "s0", "role": "user", "content": "refused"})
        assert rep["status"] == "ERROR" and rep["error"]["code"] == "CORRUPT_STORE", rep
        rep = c.call("delete_message", {"message_id": msgs[0]["message_id"]})
        assert rep["status"] == "ERROR" and rep["error"]["code"] == "CORRUPT_STORE", rep
        rep = c.call("update_message", {"message_id": msgs[0]["message_id"], "content": "no"})
        assert rep["status"] == "ERROR" and rep["error"]["code"] == "CORRUPT_STORE", rep
        rep = c.call("rebuild_index", {})
        assert rep["status"] == "ERROR" and rep["error"]["code"] == "CORRUPT_STORE", rep
        assert [m["content"] for m in c.history("s0")] == ["record 0", "record 3"]
        assert "results" in c.call("search_messages", {"query": "record"})
    assert d.terminate() == 0
    assert open(log_path, "rb").read() == damaged
    assert not os.path.exists(os.path.join(d.data_dir, "snapshot"))

    # 2. --salvage keeps a copy of the damaged file and rebuilds a clean log.
    r = run_storaged(["--data-dir", d.data_dir, "--salvage"])
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["records_recovered"] == 39
    assert report["messages"] == 39
    assert open(report["damaged_copy"], "rb").read() == damaged
    assert os.path.dirname(report["damaged_copy"]) == os.path.abspath(d.data_dir)

    # 3. A clean start with every intact record.
    d.start()
    with d.client() as c:
        h = c.health()
        assert h["status"] == "OK" and h["last_error"] == "", h
        assert h["active_messages"] == 39
        stored = state_of(c.all_messages())
        expected = {m["message_id"]: m for i, m in enumerate(msgs) if i != victim}
        assert stored == expected
        c.write("s0", "writable again")
    assert d.terminate() == 0


@pytest.mark.timeout(60)
def test_salvage_refused_while_the_daemon_runs(pool):
    d = pool.new().start()
    r = run_storaged(["--data-dir", d.data_dir, "--salvage"])
    assert r.returncode == 3 and os.path.abspath(d.data_dir) in r.stderr
    assert d.client().call("ping")["pid"] == d.pid
    assert d.terminate() == 0


def test_a_clean_stop_writes_the_queued_search_index_into_the_snapshot(pool):
    """An import only queues its messages for the search index; a clean stop indexes the queue (within
    a few seconds) before it writes the snapshot, so the next start can search at once."""
    from ulid import ULID

    from storaged import snapshot
    from storaged.fileio import FileIO

    d = pool.new().start()
    batch = [{"message_id": str(ULID()), "session_id": f"imp{i % 4}", "timestamp": 1_700_000_000_000 + i,
              "role": "assistant", "content": f"imported wombat {i} " * 30, "revision": 1,
              "updated_at": 1_700_000_000_000 + i, "metadata": {}} for i in range(2000)]
    with d.client(timeout_ms=30_000) as c:
        for k in range(0, 2000, 500):
            assert c.call("import_messages", {"messages": batch[k:k + 500]})["imported"] == 500
    d.terminate()
    meta, rows, _ = snapshot.read(FileIO(), os.path.join(d.data_dir, "snapshot"))
    assert len(rows) == 2000 and meta["unindexed"] == []
    assert "indexed the search queue" in d.stderr() or "snapshot written" in d.stderr()
    d.start()
    with d.client(timeout_ms=30_000) as c:
        rep = c.call("search_messages", {"query": "wombat", "limit": 5})
        assert len(rep["results"]) == 5, rep
