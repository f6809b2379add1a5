"""A rebuild interrupted at every step leaves the old store or the new one, whole.

For each mutating I/O call of ``compaction.rebuild`` (enumerated until the rebuild completes) the
call fails, either as an ``OSError`` the process survives or as a power cut that also drops what
was not synced. The directory is then reopened: the same live messages, a healthy store, and a log
that is byte for byte the old one or record for record the compacted one, never a mix. A process
that survived the failure must go on storing durably (nothing appended to a log that was renamed
away), and request ids remembered before the rebuild still answer their retries.
"""
from __future__ import annotations

import os
import random
import shutil

import pytest

from tests.support.faultio import FaultIO, PowerCut, TrackingIO, delete, live_state, rid, update, write
from protocol import errors as E
from protocol.errors import ProtocolError
from storaged import compaction
from storaged import log as logfile
from storaged.fileio import FileIO
from storaged.segment import is_segment_name
from storaged.store import Store

pytestmark = pytest.mark.timeout(120)


def decoded(path: str) -> list:
    buf = open(path, "rb").read()
    salt = logfile.parse_header(buf)
    res = logfile.ScanResult()
    records = [r for _, _, r in logfile.scan(buf, salt, logfile.HEADER_SIZE, res)]
    assert not res.torn_tail and res.damage is None
    return records


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """A store with dead records, a stale snapshot and remembered request ids; and its rebuilt form."""
    base = tmp_path_factory.mktemp("compaction")
    d = str(base / "template")
    s = Store.open(d)
    rids = {"w": rid(), "u": rid(), "d": rid()}
    ids = [write(s, f"s{i % 3}", f"message {i} 日本語" * (i + 1), tags=[f"t{i % 4}"])["message"]["message_id"]
           for i in range(12)]
    first_w = write(s, "s0", "remembered", request_id=rids["w"])
    first_u = update(s, ids[0], content="edited", request_id=rids["u"])
    update(s, ids[1], importance=1)
    delete(s, ids[2], request_id=rids["d"])
    delete(s, ids[3])
    assert s.write_snapshot()
    update(s, ids[4], content="after the snapshot")
    delete(s, ids[5])
    write(s, "s9", "tail message")
    state = live_state(s)
    s.close()
    new = str(base / "reference")
    shutil.copytree(d, new)
    s = Store.open(new)
    compaction.rebuild(s)
    s.close()
    return {
        "dir": d, "state": state, "old_log": open(os.path.join(d, "log"), "rb").read(),
        "new_records": decoded(os.path.join(new, "log")), "new_size": os.path.getsize(os.path.join(new, "log")),
        "rids": rids, "first_w": first_w, "first_u": first_u, "ids": ids,
    }


def fresh_copy(template, dest: str) -> str:
    shutil.copytree(template["dir"], dest)
    return dest


def check_old_or_new(d: str, template) -> str:
    """Reopen ``d`` and demand exactly the old store or exactly the new one. Returns which."""
    log = open(os.path.join(d, "log"), "rb").read()
    if log == template["old_log"]:
        which = "old"
    else:
        assert decoded(os.path.join(d, "log")) == template["new_records"], "the log is neither old nor new"
        which = "new"
    s = Store.open(d, io=FileIO())
    try:
        h = s.health()
        assert h["status"] == "OK" and h["last_error"] == "" and not s.recovered_tail
        assert live_state(s) == template["state"]
        if which == "new":
            assert h["dead_bytes"] == 0 and h["log_size"] == template["new_size"]
        else:
            assert h["log_size"] == len(template["old_log"]) and h["dead_bytes"] > 0
        for name in ("log.compact", "snapshot.tmp"):
            assert not os.path.exists(os.path.join(d, name))
        # request ids remembered before the rebuild still answer their retries
        r = template["rids"]
        assert write(s, "s0", "remembered", request_id=r["w"])["message"]["message_id"] == \
            template["first_w"]["message"]["message_id"]
        assert update(s, template["ids"][0], content="edited", request_id=r["u"]) == template["first_u"]
        assert delete(s, template["ids"][2], request_id=r["d"]) == {"status": "OK"}
        assert live_state(s) == template["state"]
    finally:
        s.close()
    return which


def rebuild_call_count(template, tmp_path) -> int:
    d = fresh_copy(template, str(tmp_path / "count"))
    io = FaultIO()
    s = Store.open(d, io=io)
    io.arm(None)
    compaction.rebuild(s)
    s.close()
    assert io.count >= 8, io.log
    return io.count


@pytest.fixture(params=["one segment", "a segment every 3 messages"])
def flushing(request, monkeypatch):
    """A rebuild writes its index a segment at a time past REBUILD_FLUSH_BYTES (merged as it goes):
    each test below runs with the template's index in one segment, and with one every 3 messages."""
    if request.param != "one segment":
        monkeypatch.setattr(compaction, "FLUSH_CHECK_EVERY", 3)
        monkeypatch.setattr(compaction, "REBUILD_FLUSH_BYTES", 1)
    return request.param


def test_exception_at_every_step_of_a_rebuild(tmp_path, template, flushing):
    total = rebuild_call_count(template, tmp_path)
    seen = set()
    for k in range(total + 1):
        d = fresh_copy(template, str(tmp_path / f"k{k}"))
        io = FaultIO()
        s = Store.open(d, io=io)
        io.arm(k)
        try:
            compaction.rebuild(s)
            failed = False
        except OSError:
            failed = True
        # removing a segment file nothing names any more is best effort (an orphan is collected later)
        best_effort = k < total and io.log[k][1] in ("remove", "release") and is_segment_name(os.path.basename(io.log[k][2]))
        assert failed == (k < total and not best_effort), (k, total, io.log)
        # what a restart right now would find
        disk = shutil.copytree(d, str(tmp_path / f"k{k}-disk"))
        seen.add(check_old_or_new(disk, template))
        # the process survived the failure: it must go on storing durably, or refuse to
        io.arm(None)
        assert live_state(s) == template["state"]
        acked = dict(template["state"])
        try:
            m = write(s, "s0", f"after failure {k}")["message"]
            acked[m["message_id"]] = m
            u = update(s, template["ids"][6], content=f"updated after failure {k}")["message"]
            acked[u["message_id"]] = u
            assert delete(s, template["ids"][7]) == {"status": "OK"}
            del acked[template["ids"][7]]
            retry = compaction.rebuild(s)  # and a rebuild can be retried
            assert retry["status"] == "OK"
            m = write(s, "s0", f"after the retried rebuild {k}")["message"]
            acked[m["message_id"]] = m
        except ProtocolError as exc:
            assert exc.code == E.IO_ERROR and s.broken  # refused as a whole, never half-done
        assert live_state(s) == acked
        s.close()
        s = Store.open(d)
        assert live_state(s) == acked and s.health()["status"] == "OK"
        s.close()
    assert seen == {"old", "new"}


@pytest.mark.parametrize("seed,flushes", [*((s, f) for s in range(4) for f in (False, True)),
                                          *(pytest.param(s, s % 2 == 1, marks=pytest.mark.slow) for s in range(4, 100))])
def test_power_cut_at_every_step_of_a_rebuild(tmp_path, template, seed, flushes, monkeypatch):
    if flushes:  # a rebuild that writes its index a segment every 3 messages (see ``flushing``)
        monkeypatch.setattr(compaction, "FLUSH_CHECK_EVERY", 3)
        monkeypatch.setattr(compaction, "REBUILD_FLUSH_BYTES", 1)
    total = rebuild_call_count(template, tmp_path)
    seen = set()
    for k in range(total + 1):
        d = fresh_copy(template, str(tmp_path / f"k{k}"))
        io = TrackingIO(d)
        s = Store.open(d, io=io)
        io.crash_at = io.calls + k
        try:
            compaction.rebuild(s)
        except PowerCut:
            pass
        else:
            assert k >= total
        io.power_cut(random.Random(seed * 1000 + k))
        seen.add(check_old_or_new(d, template))
    assert "old" in seen and "new" in seen


def test_writes_after_a_rebuild_survive_a_power_cut(tmp_path, template):
    """The swap made the new log durable (directory fsync) before the store wrote to it."""
    for seed in range(30):
        d = fresh_copy(template, str(tmp_path / f"s{seed}"))
        io = TrackingIO(d)
        s = Store.open(d, io=io)
        compaction.rebuild(s)
        m = write(s, "s0", "acknowledged after the rebuild")["message"]
        io.power_cut(random.Random(seed))
        s = Store.open(d)
        assert live_state(s) == dict(template["state"], **{m["message_id"]: m})
        s.close()


def test_failed_rebuild_leaves_no_temporary_files(tmp_path, template, flushing):
    total = rebuild_call_count(template, tmp_path)
    for k in range(total):
        d = fresh_copy(template, str(tmp_path / f"t{k}"))
        io = FaultIO()
        s = Store.open(d, io=io)
        io.arm(k, kinds=["open_new", "write", "sync"])
        try:
            compaction.rebuild(s)
        except OSError:
            # what the store had: its log, its snapshot and the row segment that names
            assert sorted(os.listdir(d)) == sorted(os.listdir(template["dir"]))
            assert {n.split(".")[0] for n in os.listdir(d)} == {"cursor", "log", "snapshot", "rows"}
        s.close()
