"""The search index's queue (Store.unindexed): mutations and replay only queue a message for the
index, the daemon indexes the queue between requests, and every search sees it all."""
from __future__ import annotations

import pytest

from protocol import errors as E
from protocol.errors import ProtocolError
from storaged import compaction
from storaged.store import Store
from tests.support.faultio import delete, search, update, write

pytestmark = pytest.mark.unit


def _found(store, query):
    return [h["content"] for h in search(store, query=query)["results"]]


def test_writes_are_queued_and_every_search_sees_them(tmp_path):
    store = Store.open(str(tmp_path))
    ids = [write(store, "s", f"zebra number {i}")["message"]["message_id"] for i in range(50)]
    assert len(store.unindexed) == 50 and store._index.doc_count() == 0
    delete(store, ids[0])                       # queued, then gone: never indexed
    update(store, ids[1], content="okapi now")  # queued twice: the new text is what gets indexed
    hits = search(store, query="zebra", limit=100)["results"]
    assert sum("zebra" in h["content"] for h in hits) == 48  # (okapi's may come as a neighbour)
    assert _found(store, "okapi")[0] == "okapi now"
    assert "zebra number 1" not in [h["content"] for h in hits]  # the old text left the index
    assert not store.unindexed and store._index.doc_count() == 49
    store.close()


def test_index_steps_are_bounded_and_skip_what_is_no_longer_live(tmp_path):
    store = Store.open(str(tmp_path))
    for i in range(40):
        write(store, "s", f"lemur {i}")
    assert store.index_step(0.0)            # a deadline already past: one message, then it stops
    assert store._index.doc_count() == 1 and len(store.unindexed) == 39
    asked = []
    # a request waits: asked every 4 messages, the second time it says yes
    assert store.index_step(float("inf"), lambda: asked.append(1) or len(asked) == 2)
    assert store._index.doc_count() == 9 and len(asked) == 2
    assert not store.index_step(None) and store._index.doc_count() == 40
    store.close()


def test_a_search_through_the_daemon_is_refused_busy_while_the_index_catches_up(tmp_path):
    store = Store.open(str(tmp_path))
    for i in range(200):
        write(store, "s", f"tapir {i} " * 50)
    with pytest.raises(ProtocolError) as exc:
        store.catch_up(0.0)
    assert exc.value.code == E.BUSY and exc.value.retry_after_ms
    while store.unindexed:
        try:
            store.catch_up(0.01)
        except ProtocolError:
            pass
    store.catch_up(0.0)  # nothing queued: no refusal
    assert len(search(store, query="tapir", limit=50)["results"]) == 50
    store.close()


def test_the_queue_survives_a_snapshot_and_a_rebuild_empties_it(tmp_path):
    d = str(tmp_path)
    store = Store.open(d)
    for i in range(30):
        write(store, "s", f"quokka {i}")
    store.index_step(0.0)  # partly indexed, partly queued, when the snapshot is taken
    assert store.unindexed and store._index.doc_count()
    store.write_snapshot()
    store.close()
    store = Store.open(d)
    assert store.snapshot_valid and store.unindexed
    assert len(search(store, query="quokka", limit=50)["results"]) == 30
    for i in range(5):
        write(store, "s", f"quokka late {i}")
    compaction.rebuild(store)
    assert not store.unindexed and len(search(store, query="quokka", limit=50)["results"]) == 35
    store.close()


def test_a_snapshot_that_left_a_queue_is_due_once_the_index_caught_up(tmp_path):
    """After a replay (or a migration) the snapshot on disk may hold little of the index and a long
    queue: once the queue is indexed, the snapshot is due again even though the log did not grow."""
    d = str(tmp_path)
    store = Store.open(d)
    for i in range(40):
        write(store, "s", f"capybara {i}")
    assert store.write_snapshot() and store.snapshot_unindexed == 40
    assert not store.snapshot_due()
    store.index_step(None)
    assert store.snapshot_due() and store.write_snapshot()
    assert store.snapshot_unindexed == 0 and not store.snapshot_due()
    store.close()
    store = Store.open(d)
    assert not store.unindexed and store._index.doc_count() == 40
    store.close()


def test_imports_wait_busy_while_the_queue_is_full_and_change_nothing(tmp_path):
    from protocol.validation import validate

    store = Store.open(str(tmp_path))
    store.index_queue_max = 20
    for i in range(20):
        write(store, "s", f"ibex {i}")
    size = store.log_size()
    req = validate("import_messages", {"messages": [{
        "message_id": "01J00000000000000000000009", "session_id": "s", "timestamp": 1_700_000_000_000,
        "role": "user", "content": "imported", "revision": 1, "updated_at": 1_700_000_000_000, "metadata": {}}]})
    with pytest.raises(ProtocolError) as exc:
        store.import_messages(req)
    assert exc.value.code == E.BUSY and store.log_size() == size
    store.index_step(None)
    assert store.import_messages(req)["imported"] == 1
    store.close()
