"""Data directories written by earlier releases, opened by a real daemon of this checkout.

Issue 15 changes the on-disk format and migrates old data directories on first start. These tests are
how that is checked: ``fixtures/store-log2-snap3`` was written by a real daemon of the release before
the change (log format 2, snapshot 3; ``fixtures/make_store.py`` says how), ``store-log2-snap4`` by the
release before the search index's segments (snapshot 4), and each ``expected.json`` is what that
daemon answered. A daemon of this checkout opens a copy and must answer the same: every
message to the byte, deleted ones gone, counters, sessions and their metadata, ingest checkpoints, the
old daemon's cursors, its request ids (a retry answered from the window, nothing written) — and keep
all of it across a new write, a clean stop, a SIGKILL and a ``rebuild_index``. ``fixtures/store-v1``
(release 0.1) is opened the same way, for its messages.

Request ids are answered from the window only for REQUEST_ID_RETENTION_S after the old daemon saw them,
so the test that retries them runs its daemon with the wall clock set to the fixture's day
(``tests.support.clockshift``); the others run on the real clock, on which they have long expired.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support import clockshift
from tests.support.daemon_proc import Client, DaemonPool
from tests.support.fixtures.make_store import export, pages
from tests.support.release_store import EXPECTED, RELEASES, STORE, STORE_0_1, copy_store, without_event

NEW_SESSION = "after-migration"   # where the tests write; the old sessions stay as recorded


@pytest.fixture
def pool(tmp_path):
    p = DaemonPool(tmp_path)
    yield p
    p.close_all()


def check_state(c: Client, added: list[dict[str, Any]], recorded: dict[str, Any] = EXPECTED) -> None:
    """Everything expected.json recorded (``recorded``), plus the messages written since (``added``, one new session)."""
    expected = recorded["messages"] + added
    assert export(c) == expected
    by_session: dict[str, list[dict[str, Any]]] = {}
    for m in expected:
        by_session.setdefault(m["session_id"], []).append(without_event(m))
    for sid, messages in by_session.items():
        assert c.history(sid) == messages, sid
    for mid in recorded["deleted"]:
        rep = c.call("read_messages", {"view": "content", "message_id": mid})
        assert rep["status"] == "ERROR" and rep["error"]["code"] == "NOT_FOUND", rep
    health = c.health()
    assert (health["status"], health["last_error"]) == ("OK", ""), health
    new_sessions = len({m["session_id"] for m in added})
    want = recorded["health"]
    assert {k: health[k] for k in want} == {"active_messages": want["active_messages"] + len(added),
                                           "session_count": want["session_count"] + new_sessions,
                                           "last_sequence": want["last_sequence"] + len(added)}
    listed = c.call("list_sessions", recorded["list_sessions"]["args"])["data"]["sessions"]
    old = [s for s in listed if s["session"]["memory_session_id"] != NEW_SESSION]
    assert [s["session"] for s in old] == [s["session"] for s in recorded["list_sessions"]["sessions"]]
    for source, reply in recorded["ingest_checkpoints"].items():
        assert c.call("ingest_checkpoints", {"source": source}) == reply
    for cur in recorded["cursors"]:
        got = [[i for i in page if i != NEW_SESSION] for page in pages(c, cur["args"], cur["key"])]
        assert [page for page in got if page] == cur["pages"], cur["args"]


def new_write(c: Client, text: str) -> dict[str, Any]:
    """A message written by this release into the opened store, as export returns it."""
    mid = c.write(NEW_SESSION, text, metadata={"tags": ["new"]})["message_id"]
    [m] = [m for m in c.call("export_messages", {"session_id": NEW_SESSION})["messages"] if m["message_id"] == mid]
    return m


@pytest.mark.parametrize("release", sorted(RELEASES))
def test_release_store_opens_with_everything_intact(pool, tmp_path, release):
    store, expected = RELEASES[release]
    d = pool.new("d")
    copy_store(store, Path(d.data_dir))
    d.start()
    with d.client() as c:
        check_state(c, [], expected)
        added = [new_write(c, "written by the new release")]
    assert d.terminate() == 0
    d.start()
    with d.client() as c:
        check_state(c, added, expected)
        added.append(new_write(c, "written before a SIGKILL"))
    d.kill()
    d.start()
    with d.client() as c:
        check_state(c, added, expected)
        assert c.rebuild()["status"] == "OK"
        check_state(c, added, expected)
    d.kill()
    d.start()
    with d.client() as c:
        check_state(c, added, expected)


def test_a_store_with_row_segments_of_an_earlier_version_gets_a_current_base_without_a_write(pool):
    """The release before the narrow row wrote version 2 row segments, which each start converts: the
    daemon is due a snapshot at once (nothing written, no clean stop), its background snapshot writes a
    version 3 base, and a start after SIGKILL reads that one with everything intact."""
    import os
    import time

    from storaged import snapshot
    from tests.support.release_store import STORE_ROWS2

    store, expected = STORE_ROWS2, RELEASES[STORE_ROWS2.name][1]
    d = pool.new("d")
    copy_store(store, Path(d.data_dir))

    def versions() -> list[int]:
        out = []
        for name in sorted(n for n in os.listdir(d.data_dir) if n.startswith("rows.") and n.endswith(".seg")):
            try:
                with open(os.path.join(d.data_dir, name), "rb") as f:
                    out.append(snapshot.HEAD.unpack(f.read(snapshot.HEAD.size))[1])
            except FileNotFoundError:  # removed by the daemon since the listing: an old one gone
                continue
        return out

    assert set(versions()) == {2}
    d.start()
    deadline = time.monotonic() + 60
    while versions() != [snapshot.ROWS_VERSION]:   # the old segments go once the new snapshot is in
        assert time.monotonic() < deadline, versions()
        time.sleep(0.05)
    with d.client() as c:
        check_state(c, [], expected)
    d.kill()
    d.start()
    with d.client() as c:
        check_state(c, [], expected)


def retry_all(c: Client) -> None:
    """Each recorded request id again: the recorded answer, nothing appended."""
    size = c.health()["log_size"]
    for entry in EXPECTED["request_ids"]:
        assert c.call(entry["op"], entry["args"], rid=entry["request_id"]) == entry["reply"], entry
    assert c.health()["log_size"] == size
    assert export(c) == EXPECTED["messages"]


def test_release_store_answers_its_request_ids_from_the_window(pool):
    """On the fixture's day (a shifted wall clock): the old daemon's request ids, carried by the
    compacted log's checkpoint record, by records the snapshot covers and by the tail after it."""
    assert {e["phase"] for e in EXPECTED["request_ids"]} == {1, 2, 3}
    assert {e["op"] for e in EXPECTED["request_ids"]} == {"write_message", "update_message", "delete_message"}
    d = pool.new("d", command=clockshift.command(EXPECTED["made_at_ms"] + 60_000))
    copy_store(STORE, Path(d.data_dir))
    d.start()
    with d.client() as c:
        retry_all(c)
        assert c.rebuild()["status"] == "OK"
        retry_all(c)
    d.kill()
    d.start()
    with d.client() as c:
        retry_all(c)


def test_release_0_1_store_opens_in_a_daemon(pool):
    d = pool.new("d")
    copy_store(STORE_0_1, Path(d.data_dir))
    d.start()
    expected = json.loads((STORE_0_1 / "expected.json").read_text())
    with d.client() as c:
        assert [without_event(m) for m in export(c)] == expected
        assert c.health()["active_messages"] == len(expected)
