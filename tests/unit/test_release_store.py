"""The store written by the release before issue 15's format change, opened in-process.

The same fixture and expectations as ``tests/process/test_release_store.py`` (``fixtures/make_store.py``
says how they were made), read through ``Store.open`` and ``Store.by_id`` instead of a daemon, so that a
migration that loses or alters something fails here in a second, with the message that differs.
"""
from __future__ import annotations

import pytest

from storaged.store import Store
from tests.support.release_store import EXPECTED, STORE, copy_store, without_event

pytestmark = pytest.mark.unit


@pytest.fixture
def opened(tmp_path):
    s = Store.open(str(copy_store(STORE, tmp_path / "d")))
    yield s
    s.close()


def test_every_message_as_the_old_daemon_returned_it(opened):
    for m in EXPECTED["messages"]:
        assert opened.by_id[m["message_id"]].to_dict() == without_event(m)
    assert len(opened.by_id) == len(EXPECTED["messages"])
    assert not set(EXPECTED["deleted"]) & set(opened.by_id)


def test_counters_and_checkpoints_survive(opened):
    health = opened.health()
    assert (health["status"], health["last_error"]) == ("OK", "")
    assert {k: health[k] for k in EXPECTED["health"]} == EXPECTED["health"]
    for source, reply in EXPECTED["ingest_checkpoints"].items():
        assert opened.ingest.of_source(source) == reply["checkpoints"]


def test_the_first_start_migrates_the_snapshot_once(tmp_path):
    """The release's snapshot (format 3) holds texts, not their places in the log: the first start
    replays the log once and writes a snapshot of the current format, which the next start uses."""
    from storaged import snapshot

    d = copy_store(STORE, tmp_path / "d")
    with open(d / "snapshot", "rb") as f:
        assert snapshot.HEAD.unpack(f.read(snapshot.HEAD.size))[1] == 3
    first = Store.open(str(d))
    assert not first.snapshot_outdated and first.snapshot_pos == first.log_size()
    texts = {mid: m.content for mid, m in first.by_id.items()}
    first.close()
    with open(d / "snapshot", "rb") as f:
        assert snapshot.HEAD.unpack(f.read(snapshot.HEAD.size))[1] == snapshot.VERSION
    again = Store.open(str(d))
    assert again.snapshot_valid and again.snapshot_pos == again.log_size()
    assert {mid: m.content for mid, m in again.by_id.items()} == texts
    for m in EXPECTED["messages"]:
        assert again.by_id[m["message_id"]].to_dict() == without_event(m)
    again.close()
