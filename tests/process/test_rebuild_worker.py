"""A rebuild's worker is a forked child of the daemon (``compaction.run_child``), not a thread: the
store it writes is the one the daemon installs, its death leaves the store as it was, it dies with
the daemon, and what it finds (a damaged text) reaches the daemon's own state.

Real daemons; ``CONVMEM_FAULT_REBUILD_DELAY_S`` holds a worker before its work, so that a test can
find it, kill it or kill its daemon while it runs."""
from __future__ import annotations

import os
import signal
import time

import pytest

from protocol import wire
from storaged import children
from tests.support.daemon_proc import Daemon, pid_alive
from tests.support.loop_steps import run_rebuild

pytestmark = pytest.mark.timeout(120)

TEMPS = {"log.compact", "snapshot.tmp", "rebuild.tmp"}


def _wait(cond, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(x) for x in f.read().split() if pid_alive(int(x))]


def _nice(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[16])  # field 19, nice


def _segments(data) -> set[str]:
    return {n for n in os.listdir(data) if n.startswith("index.") and n.endswith(".seg")}


def _fill(c, n: int = 300) -> list[dict]:
    for i in range(n):
        c.write(f"s{i % 7}", f"message {i} about the tokyo launch, token{i}")
    for i in range(0, n, 10):  # dead records for the rebuild to drop
        rep = c.call("delete_message", {"message_id": c.history(f"s{i % 7}")[0]["message_id"]})
        assert rep["status"] == "OK", rep
    return c.all_messages()


def _status(c, rid: str) -> dict:
    return c.call("rebuild_status", {"rebuild_id": rid})


def test_the_worker_is_a_child_and_its_store_is_installed(tmp_path, monkeypatch):
    """The rebuild runs in a child of the daemon; once it ends the daemon serves its log and its
    index (one new segment, named by the new snapshot; the old segments removed) and so does a
    restart. Requests are served while the worker runs."""
    monkeypatch.setenv("CONVMEM_FAULT_REBUILD_DELAY_S", "1")  # long enough to be seen
    data = tmp_path / "data"
    with Daemon(data, extra_args=["--snapshot-every", "100"]) as d:
        d.start()
        with d.client() as c:
            before = _fill(c)
            old_segments = _segments(data)
            assert old_segments  # the background snapshots wrote some
            hits_before = c.call("search_messages", {"query": "token42"})["results"]
            rep = c.call("rebuild_index", {})
            assert rep["status"] == wire.REBUILDING
            [worker] = _children(d.pid)
            assert c.call("ping")["status"] == "OK" and c.call("ping")["rebuilding"] is True
            _wait(lambda: _status(c, rep["rebuild_id"])["status"] != wire.REBUILDING)
            done = _status(c, rep["rebuild_id"])
            assert done["status"] == "OK" and done["messages_indexed"] == len(before), done
            assert not pid_alive(worker)
            # the rows the rebuild relocated make a background snapshot due (its base takes their place:
            # Store.rebase_due), whose child may be running now, with its temp file
            _wait(lambda: not _children(d.pid))
            assert c.all_messages() == before
            hits = c.call("search_messages", {"query": "token42"})["results"]
            assert {h["message_id"] for h in hits} == {h["message_id"] for h in hits_before}
            assert hits[0]["message_id"] == next(m["message_id"] for m in before if m["content"].endswith("token42"))
            assert not TEMPS & set(os.listdir(data))
            _wait(lambda: not old_segments & _segments(data))  # removed by a thread
            assert len(_segments(data)) == 1
            after_rebuild = c.health()
            assert after_rebuild["dead_bytes"] == 0 and after_rebuild["status"] == "OK"
        assert d.terminate() == 0
        d.start()
        with d.client() as c:
            assert c.all_messages() == before
            assert c.health()["snapshot_valid"] is True
            assert c.call("search_messages", {"query": "token42"})["results"] == hits


def test_a_worker_that_dies_leaves_the_store_as_it_was(tmp_path, monkeypatch):
    """SIGKILL the worker (the OOM killer's way): the rebuild's status says why, no temp stays, the
    store is unchanged and writable, and the next rebuild (after a restart without the delay) works."""
    monkeypatch.setenv("CONVMEM_FAULT_REBUILD_DELAY_S", "600")
    data = tmp_path / "data"
    with Daemon(data) as d:
        d.start()
        with d.client() as c:
            before = _fill(c, 100)
            h0 = c.health()
            rid = c.call("rebuild_index", {})["rebuild_id"]
            _wait(lambda: bool(_children(d.pid)))
            (worker,) = _children(d.pid)
            # it runs nicer than its daemon, so the request loop wins the cores it shares with it
            _wait(lambda: _nice(worker) == min(19, _nice(d.pid) + children.CHILD_NICE))
            assert c.call("write_message", {"session_id": "s", "role": "user", "content": "x"})["error"]["code"] == "BUSY"
            os.kill(worker, signal.SIGKILL)
            _wait(lambda: _status(c, rid)["status"] != wire.REBUILDING)
            rep = _status(c, rid)
            assert rep["status"] == "ERROR" and rep["error"]["code"] == "INTERNAL_ERROR", rep
            assert "killed by signal 9" in rep["error"]["message"] and "unchanged" in rep["error"]["message"]
            assert c.all_messages() == before
            h1 = c.health()
            assert (h1["log_size"], h1["status"], h1["rebuilding"]) == (h0["log_size"], "OK", False)
            assert not TEMPS & set(os.listdir(data))
            c.write("after", "writable")
        assert d.terminate() == 0
        monkeypatch.delenv("CONVMEM_FAULT_REBUILD_DELAY_S")
        d.start()
        with d.client() as c:
            assert c.rebuild()["status"] == "OK"


def test_the_worker_dies_with_its_daemon(tmp_path, monkeypatch):
    """SIGKILL the daemon while its worker runs: the worker does not outlive it nor hold the data
    directory's lock, and a new daemon starts with the old store and no temps."""
    monkeypatch.setenv("CONVMEM_FAULT_REBUILD_DELAY_S", "600")
    data = tmp_path / "data"
    worker = None
    try:
        with Daemon(data) as d:
            d.start()
            with d.client() as c:
                before = _fill(c, 50)
                assert c.call("rebuild_index", {})["status"] == wire.REBUILDING
                _wait(lambda: bool(_children(d.pid)))
                (worker,) = _children(d.pid)
            d.kill()
            _wait(lambda: not pid_alive(worker))
            monkeypatch.delenv("CONVMEM_FAULT_REBUILD_DELAY_S")
            d.start()
            assert not TEMPS & set(os.listdir(data))
            with d.client() as c:
                assert c.all_messages() == before
                assert c.health()["rebuilding"] is False
    finally:
        if worker is not None and pid_alive(worker):
            os.kill(worker, signal.SIGKILL)


def test_a_damaged_text_the_worker_finds_marks_the_store_damaged(tmp_path):
    """A message's record rotted before the snapshot's position (which a start does not re-read):
    the worker meets it, the rebuild answers CORRUPT_STORE, and the daemon itself now refuses
    mutations until a salvage, as for damage found at start; reads go on."""
    data = tmp_path / "data"
    with Daemon(data) as d:
        d.start()
        with d.client() as c:
            _fill(c, 40)
            c.write("rot", "the zanzibar record that rots")
        assert d.terminate() == 0  # a clean stop: the snapshot covers the whole log
        log = data / "log"
        raw = bytearray(log.read_bytes())
        at = raw.index(b"zanzibar")
        raw[at] ^= 0x20
        log.write_bytes(bytes(raw))
        d.start()
        with d.client() as c:
            assert c.health()["status"] == "OK"
            rep = c.rebuild()
            assert rep["status"] == "ERROR" and rep["error"]["code"] == "CORRUPT_STORE", rep
            assert "salvage" in rep["error"]["message"]
            h = c.health()
            assert h["status"] != "OK" and "damaged" in h["last_error"], h
            w = c.call("write_message", {"session_id": "s", "role": "user", "content": "refused"})
            assert w["status"] == "ERROR" and w["error"]["code"] == "CORRUPT_STORE", w
            assert len(c.history("s1")) > 0
            assert not TEMPS & set(os.listdir(data))


def test_a_rebuild_right_after_another_reads_no_log_the_first_one_frees(tmp_path, monkeypatch):
    """A rebuild asked for while the messages still move off the log an earlier rebuild replaced
    (Store.relocate_step): the old log's blocks are cut away once the last has moved, and the new
    worker, forked before that, must not be left reading texts from the cut file (every text it
    read there would look damaged: CORRUPT_STORE, and the daemon's store marked damaged).
    In-process server, a real forked worker."""
    from ulid import ULID

    from storaged.server import Server
    from storaged.store import Store
    from tests.support.faultio import delete, live_state, write

    store = Store.open(str(tmp_path / "data"))
    server = Server(store, "inproc://convmem-rebuild-twice")
    try:
        ids = [write(store, f"s{i % 3}", f"message {i} about tokyo{i}")["message"]["message_id"] for i in range(200)]
        for mid in ids[::5]:
            delete(store, mid)
        before = live_state(store)

        def rebuild() -> str:
            rep = server.handle([wire.encode_request("rebuild_index", {}, str(ULID()))], [b"peer", b""])
            assert rep["status"] == wire.REBUILDING, rep
            return rep["rebuild_id"]

        assert run_rebuild(server, rebuild())["status"] == "OK"
        assert store.relocation is not None  # the messages still read the replaced log
        old_log = os.dup(store.relocation.old_fd)
        try:
            monkeypatch.setenv("CONVMEM_FAULT_REBUILD_DELAY_S", "1")  # the worker reads after the cut
            second = rebuild()
            store.relocate_step(None)  # the loop's idle steps end the move meanwhile; the old log is cut
            _wait(lambda: os.fstat(old_log).st_size == 0)
        finally:
            os.close(old_log)
        rep = run_rebuild(server, second)
        assert rep["status"] == "OK", rep
        assert store.corrupt is None and store.health()["status"] == "OK"
        assert live_state(store) == before
    finally:
        server.close()
        store.close()
