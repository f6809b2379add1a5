"""A daemon that imports lets go of the rows it holds in memory once a background snapshot's base of
them is on disk: the base is mapped in their place (MessageTable.rebase_*), its RSS falls by them, and
every answer — rows changed while the snapshot's child wrote, and while the base was checked,
included — is what the same daemon answers after a restart."""
from __future__ import annotations

import signal
import time

import pytest

from tests.process.test_release_idle import N, _answers, _import
from tests.support.daemon_proc import Daemon

pytestmark = pytest.mark.timeout(240)

BASE_IN_PLACE = "are read from the base"


def test_an_importing_daemon_maps_its_base_in_place_of_its_rows(tmp_path, monkeypatch):
    data = tmp_path / "data"
    # the snapshot's child waits a moment before writing: the updates below land after its fork
    monkeypatch.setenv("CONVMEM_FAULT_SNAPSHOT_DELAY_S", "1.0")
    d = Daemon(data)
    with d:
        d.start()
        with d.client(timeout_ms=60_000) as c:
            ids = _import(c, N)   # past SNAPSHOT_EVERY_RECORDS: a background snapshot, a base (the first)
            deadline = time.monotonic() + 60
            while "background snapshot started" not in d.stderr():
                assert time.monotonic() < deadline, d.stderr()[-2000:]
                c.call("ping", {})
                time.sleep(0.05)
            for i in (5, N // 2):
                rep = c.call("update_message", {"message_id": ids[i], "content": f"changed after the fork {i}"})
                assert rep["status"] == "OK", rep
            while BASE_IN_PLACE not in d.stderr():
                assert time.monotonic() < deadline, d.stderr()[-2000:]
                c.call("ping", {})   # (each request's batch also takes a step)
                time.sleep(0.05)
            assert "cannot take the place" not in d.stderr()
            rep = c.call("update_message", {"message_id": ids[7], "content": "changed after the base"})
            assert rep["status"] == "OK", rep
            before = _answers(c, ids)
            assert "changed after the fork 5" in repr(before[3]) and "changed after the fork" in repr(before[4])
            line = next(x for x in d.stderr().splitlines() if BASE_IN_PLACE in x)
            assert int(line.split("the rows below seq ")[1].split()[0]) > 10_000   # the first snapshot's rows
        d.terminate(signal.SIGKILL)   # the restart replays what the snapshot does not hold
        d.start()
        with d.client(timeout_ms=60_000) as c:
            deadline = time.monotonic() + 60
            while "results" not in c.call("search_messages", {"query": "detail", "limit": 1}):
                assert time.monotonic() < deadline
                time.sleep(0.1)
            assert _answers(c, ids) == before
            assert "changed after the base" in repr(c.call("read_messages", {"view": "content", "message_id": ids[7]}))


def test_after_a_rebuild_the_daemon_maps_a_base_in_place_of_the_rows_it_relocated(tmp_path):
    """A rebuild_index moves every message to the compacted log, which rewrites every row (on the heap
    from then on: until a restart, before): once all have moved, the next background snapshot writes a
    base that is mapped in their place, deleted messages' seqs and all, and every answer stays the same
    — after a restart too."""
    data = tmp_path / "data"
    d = Daemon(data)
    with d:
        d.start()
        with d.client(timeout_ms=120_000) as c:
            ids = _import(c, N)
            for mid in ids[100:3000:50]:
                assert c.call("delete_message", {"message_id": mid})["status"] == "OK"
            rep = c.call("rebuild_index", {})
            deadline = time.monotonic() + 120
            while rep.get("status") == "REBUILDING":
                assert time.monotonic() < deadline, d.stderr()[-3000:]
                time.sleep(0.05)
                rep = c.call("rebuild_status", {"rebuild_id": rep["rebuild_id"]})
            assert rep["status"] == "OK", rep
            mapped = d.stderr().count(BASE_IN_PLACE)
            while d.stderr().count(BASE_IN_PLACE) <= mapped:
                assert time.monotonic() < deadline, d.stderr()[-3000:]
                c.call("ping", {})
                time.sleep(0.05)
            assert "cannot take the place" not in d.stderr()
            before = _answers(c, ids)
            assert all(c.call("read_messages", {"view": "content", "message_id": mid})["status"] == "ERROR"
                       for mid in ids[100:3000:500])
        d.terminate(signal.SIGTERM)
        d.start()
        with d.client(timeout_ms=60_000) as c:
            assert _answers(c, ids) == before
