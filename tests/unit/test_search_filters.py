"""A search filtered by event type asks the filter of every doc it reached at once, in C
(Store.etype_filter, SearchIndex.search_own's ``accept_docs``): the same hits as asking each doc,
whatever mix of event types, deletes and updates the store holds."""
from __future__ import annotations

import copy
import random

import pytest

from protocol.history import EVENT_TYPES, validate_search_sessions
from storaged.history import HistoryViews
from storaged.rank import ranked_search
from storaged.store import Store
from protocol.validation import validate_import_messages
from tests.support.faultio import delete, update
from ulid import ULID

ROLE = {"user_input": "user", "assistant_response": "assistant", "reasoning": "assistant", "tool_call": "assistant",
        "tool_response": "user", "system": "system"}

pytestmark = pytest.mark.unit

WORDS = ["deploy", "database", "migration", "error", "timeout", "cache", "retry", "schema", "index", "query"]


def _store(tmp_path) -> Store:
    s = Store.open(str(tmp_path / "d"))
    rng = random.Random(4)
    ids = []
    batch = []
    for i in range(1500):
        etype = rng.choice(EVENT_TYPES)
        mid = str(ULID.from_timestamp(1_700_000_000 + i))
        ids.append(mid)
        ts = 1_700_000_000_000 + i * 1000
        batch.append({"message_id": mid, "session_id": f"s{i % 40}", "role": ROLE[etype], "timestamp": ts,
                      "content": " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 12))),
                      "revision": 1, "updated_at": ts, "event": {"type": etype},
                      "metadata": {"tags": [], "memory_kind": "episode", "memory_tier": "short", "importance": 50,
                                   "relations": [], "source_message_ids": []}})
        if len(batch) == 100:
            s.import_messages(validate_import_messages({"messages": batch}))
            batch = []
    for mid in rng.sample(ids, 200):
        delete(s, mid)
    for mid in rng.sample([m for m in ids if m in s.by_id], 100):
        update(s, mid, content="database migration " + rng.choice(WORDS))
    s.search  # index the queue
    return s


@pytest.mark.parametrize("types", [("user_input", "assistant_response"), ("tool_response",), EVENT_TYPES])
def test_the_filter_in_c_finds_what_asking_each_doc_finds(tmp_path, types):
    s = _store(tmp_path)
    by_seq = s.by_seq
    allowed = frozenset(types)

    def accept(doc: int) -> bool:
        m = by_seq.get(doc)
        return m is not None and m.etype in allowed

    fast = s.etype_filter(types)
    for q in WORDS + ["database migration", "error timeout retry"]:
        for limit in (1, 10, 60):
            slow = ranked_search(s.search, q, limit, accept, None, (0,))
            quick = ranked_search(s.search, q, limit, accept, None, (0,), accept_docs=fast)
            assert [(h.doc, round(h.score, 9)) for h in quick] == [(h.doc, round(h.score, 9)) for h in slow], q
            assert all(by_seq[h.doc].etype in allowed for h in quick)
    s.close()


def test_search_sessions_is_the_same_either_way(tmp_path, monkeypatch):
    s = _store(tmp_path)
    views = HistoryViews(s)
    def results(q: str, **more) -> list:
        return views.search_sessions(validate_search_sessions({"query": q, **more}))["data"]["results"]

    asks = [({}), ({"event_types": ["tool_response", "reasoning"]}), ({"n_hits": 40})]
    got = {(q, i): results(q, **more) for q in WORDS for i, more in enumerate(asks)}
    assert all(got.values())
    monkeypatch.setattr(Store, "etype_filter", lambda self, types: None)  # every doc asked one by one
    for q in WORDS:
        for i, more in enumerate(asks):
            assert results(q, **more) == got[(q, i)], (q, more)
    s.close()


def test_a_filters_key_moves_when_a_live_message_changes_type(tmp_path):
    # what the search index keeps of a filter (its verdict by slot, bounds over its docs) is kept
    # under Store.etype_filter's cache_key, which holds the table's etype epoch: a row put again
    # with another type moves it; a new row, a delete, or the same type again do not
    s = _store(tmp_path)
    key = s.etype_filter(("user_input",)).cache_key
    assert s.etype_filter(("user_input",)).cache_key == key
    assert s.etype_filter(("tool_response",)).cache_key != key
    m = next(m for m in s.by_seq.values() if m.etype == "user_input")
    epoch = s.table.etype_epoch
    s.table.put(m)  # the same type again
    assert s.table.etype_epoch == epoch
    retyped = copy.copy(m)
    retyped.etype = "tool_response"
    s.table.put(retyped)
    assert s.table.etype_epoch == epoch + 1
    assert s.etype_filter(("user_input",)).cache_key != key
    s.close()
