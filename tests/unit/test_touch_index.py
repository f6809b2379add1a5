"""TouchIndex: a start's load gives the index the events' one-by-one adds give; it is loaded by the
request loop's idle slices (TouchIndex.load_later, load_step), not before the first request. Whatever
changes meanwhile (events deleted, new events touching the same files) stands, a lookup finishes the
load first, and the result is the index an eager build of the final state gives."""
from __future__ import annotations

import random

from protocol import wire
from storaged.indexes import LOAD_STEP, TouchIndex
from storaged.store import Store
from tests.unit.test_history_views import Book, touch

N = 3 * LOAD_STEP + 17


def test_a_load_is_the_same_index_as_adding_each_event():
    rng = random.Random(7)
    names = ["a.py", "b.md", "dir/c.py", "/abs/path/a.py", "noslash", "trailing/", "x/y/z/b.md", "日本語/ファイル.txt"]
    exts = {}
    for seq in rng.sample(range(1, 5000), 600):
        exts[seq] = (False, 0, None, tuple((rng.choice(names), None, None, None, "read")
                                            for _ in range(rng.choice((1, 1, 1, 2, 3)))))
    one, bulk = TouchIndex(), TouchIndex()
    for seq in sorted(exts):
        one.add_files(seq, exts[seq][3])
    bulk.load_later(exts)
    assert bulk.pending and not bulk.load_step(None) and not bulk.pending
    assert bulk.by_name == one.by_name
    assert set(bulk.by_name) == {"a.py", "b.md", "c.py", "noslash", "", "ファイル.txt"}
    assert all(seqs == sorted(set(seqs)) for seqs in bulk.by_name.values())


def _eager(store: Store) -> dict[str, list[int]]:
    index = TouchIndex()
    for seq in sorted(store.table.ext_files):
        index.add_files(seq, store.table.ext_files[seq][3])
    return index.by_name


def _stored(tmp_path) -> tuple[str, list[dict]]:
    d = str(tmp_path / "d")
    store = Store.open(d)
    book = Book(store)
    events = []
    for at in range(0, N, 200):
        batch = [touch(book, f"claude-code:s{i % 7}", f"/repo/src/mod{i % 50}.py", "/repo", f"src/mod{i % 50}.py")
                 for i in range(at, min(N, at + 200))]
        book.put(batch, [{"session_id": f"claude-code:s{k}", "harness": "claude-code", "source": "claude"}
                         for k in range(7)])
        events += batch
    assert store.write_snapshot()
    store.close()
    return d, events


def test_a_start_loads_the_touches_in_steps_and_what_changes_meanwhile_stands(tmp_path):
    d, events = _stored(tmp_path)
    store = Store.open(d)
    assert store.touches.pending and not store.touches.by_name
    assert store.touches.load_step(0.0)    # one step (a deadline already past), more to come
    loaded = sum(map(len, store.touches.by_name.values()))
    assert 0 < loaded <= LOAD_STEP
    # meanwhile: events deleted on both sides of the load's position, new ones touching the same files
    for event in (events[3], events[N - 5], events[2 * LOAD_STEP + 1]):
        rep = store.delete_message(wire.validate_args("delete_message", {"message_id": event["message_id"]}))
        assert rep["status"] == "OK", rep
    book = Book(store)
    book.n = N + 10
    book.put([touch(book, "claude-code:s1", "/repo/src/mod3.py", "/repo", "src/mod3.py"),
              touch(book, "claude-code:new", "/repo/src/other.py", "/repo", "src/other.py")],
             [{"session_id": "claude-code:new", "harness": "claude-code", "source": "claude"}])
    steps = 2   # the first, and the last (which says none remain)
    while store.touches.load_step(0.0):
        steps += 1
    assert steps == -(-N // LOAD_STEP) and not store.touches.pending
    assert store.touches.by_name == _eager(store)
    assert all(seqs == sorted(set(seqs)) for seqs in store.touches.by_name.values())
    store.close()


def test_a_lookup_before_the_load_is_done_finishes_it(tmp_path):
    d, _ = _stored(tmp_path)
    store = Store.open(d)
    assert store.touches.pending
    assert len(store.touches.candidates("mod7.py")) == len(range(7, N, 50))
    assert not store.touches.pending and store.touches.by_name == _eager(store)
    store.close()


def test_a_store_without_touches_has_nothing_pending(tmp_path):
    d = str(tmp_path / "d")
    store = Store.open(d)
    Book(store).put([Book(store).event("claude-code:s", "user_input", "no files here")],
                    [{"session_id": "claude-code:s", "harness": "claude-code", "source": "claude"}])
    assert store.write_snapshot()
    store.close()
    again = Store.open(d)
    assert not again.touches.pending and not again.touches.load_step(None) and again.touches.by_name == {}
    again.close()
