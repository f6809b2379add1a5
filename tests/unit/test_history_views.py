"""The history interface over a store, in-process: the record model (events, turns, sessions), typed ids
and cursors, and every observable rule of the five tools at its edges.

The daemon runs exactly this code behind its socket; the process-level tests (test_mcp_history.py)
check the envelope, the transport and the front-end's launch context on top of it.
"""
from __future__ import annotations

import json

import pytest
from ulid import ULID

from protocol import history as H
from protocol import wire
from protocol.history import HistoryError
from storaged import handles
from storaged.compaction import rebuild
from storaged.history import HistoryViews
from storaged.store import Store
from tests.support import FIXTURES

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def args(op: str, raw: dict, context: dict | None = None) -> dict:
    return wire.validate_args(op, raw, context)


def mid(ts: int, n: int) -> str:
    return str(ULID.from_bytes(((ts << 80) | n).to_bytes(16, "big")))


class Book:
    """Builds imported events for one store (ids derived from a counter, times from T0)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.n = 0

    def event(self, sid: str, etype: str, content: str, ts: int | None = None, **ev) -> dict:
        self.n += 1
        ts = T0 + self.n * 1000 if ts is None else ts
        event = {"type": etype, **ev}
        return {"message_id": mid(ts, self.n), "session_id": sid, "timestamp": ts, "role": H.EVENT_ROLE[etype],
                "content": content, "event": event}

    def put(self, events: list[dict], sessions: list[dict] | None = None, checkpoints: list[dict] | None = None):
        r = self.store.import_messages(args("import_messages", {"messages": events, "sessions": sessions or [],
                                                                "checkpoints": checkpoints or []}))
        assert r["status"] == "OK"
        return r


@pytest.fixture
def book(store):
    return Book(store)


@pytest.fixture
def views(store):
    return HistoryViews(store)


def agent_session(book: Book, sid: str = "claude-code:s1", turns: int = 2, harness: str = "claude-code",
                  source: str = "claude") -> list[dict]:
    """turns × (user_input, tool_call Read, tool_response, assistant_response)."""
    evs = []
    for t in range(turns):
        evs += [
            book.event(sid, "user_input", f"question {t}: why does nginx return 502 in turn {t}?"),
            book.event(sid, "tool_call", json.dumps({"file_path": f"/repo/etc/nginx{t}.conf"}), tool_name="Read",
                       files=[{"path": f"/repo/etc/nginx{t}.conf", "root": "/repo", "tail": f"etc/nginx{t}.conf",
                               "project": "/repo/.git", "op": "read"}]),
            book.event(sid, "tool_response", f"upstream timed out (110) while reading response header {t} " * 300,
                       tool_name="Read", is_error=False, exit_code=0),
            book.event(sid, "assistant_response", f"answer {t}: raise proxy_read_timeout", model="claude-x"),
        ]
    book.put(evs, [{"session_id": sid, "harness": harness, "source": source, "cwd": "/repo", "project": "/repo/.git",
                    "title": f"title of {sid}"}])
    return evs


# ------------------------------------------------------------------------------------------ ids
def test_typed_ids_round_trip_and_are_tamper_evident(store):
    key = store.cursor_key
    m = mid(T0, 7)
    eid = handles.event_id(key, m)
    assert eid.startswith("event:") and handles.decode(key, "event", eid.split(":", 1)[1], "id") == m
    sid = handles.session_id(key, "conversation-1")
    assert handles.decode(key, "session", sid.split(":", 1)[1], "id") == handles.session_digest("conversation-1")
    tid = handles.turn_id(key, None, "conversation-1")
    assert handles.decode(key, "turn", tid.split(":", 1)[1], "id") == ("preamble", handles.session_digest("conversation-1"))
    token = eid.split(":", 1)[1]
    for bad in (token[:-1] + ("A" if token[-1] != "A" else "B"), token[:-2], "x" + token, token.upper()):
        with pytest.raises(HistoryError) as e:
            handles.decode(key, "event", bad, "id")
        assert e.value.code == H.INVALID_ID
    with pytest.raises(HistoryError):   # an event token is not a turn token, even with the same bytes
        handles.decode(key, "turn", token, "id")
    with pytest.raises(HistoryError):   # another store's key
        handles.decode(b"k" * 32, "event", token, "id")
    assert len(eid) < 40 and len(sid) < 40


def test_a_ulid_read_in_c_is_the_bytes_and_the_errors_of_python_ulid():
    # handles.ulid_bytes reads a ULID's text with int() (a search_sessions call makes ~35 ids); it must
    # give ULID.from_str's bytes, and for anything else raise what ULID.from_str raises
    import random
    rng = random.Random(5)
    texts = [str(ULID.from_bytes(rng.randbytes(16))) for _ in range(300)]
    texts += [t.lower() for t in texts[:50]] + ["0" * 26, "7" + "Z" * 25, "7zzzzzzzzzzzzzzzzzzzzzzzzz"]
    for t in texts:
        assert handles.ulid_bytes(t) == ULID.from_str(t).bytes, t
    for bad in ("8" + "0" * 25, "0" * 25, "0" * 27, "0" * 25 + "U", "0" * 25 + "I", "", "٣" * 26, "0" * 25 + "\n"):
        with pytest.raises(ValueError) as mine:
            handles.ulid_bytes(bad)
        with pytest.raises(ValueError) as theirs:
            ULID.from_str(bad)
        assert str(mine.value) == str(theirs.value), bad


def test_ids_survive_restart_and_rebuild(tmp_path):
    s = Store.open(str(tmp_path / "d"))
    b = Book(s)
    agent_session(b)
    v = HistoryViews(s)
    hit = v.search_sessions(args("search_sessions", {"query": "nginx"}))["data"]["results"][0]
    rebuild(s)
    s.close()
    s = Store.open(str(tmp_path / "d"))
    v = HistoryViews(s)
    for key in ("event_id", "turn_id", "session_id"):
        assert v.open(args("open", {"id": hit["open"][key]}))["status"] == "OK"


# ---------------------------------------------------------------------------------- record model
def test_written_messages_are_events_and_turns(store, views):
    from protocol.validation import validate

    for role, text in (("system", "you are terse"), ("user", "first question"), ("assistant", "first answer"),
                       ("user", "second question")):
        store.write_message(validate("write_message", {"session_id": "chat", "role": role, "content": text}))
    sid = handles.session_id(store.cursor_key, "chat")
    s = views.open(args("open", {"id": sid, "limit": 10}))["data"]
    assert s["session"]["turn_count"] == 3 and s["session"]["event_count"] == 4
    assert s["session"]["harness"] == "convmem" and s["session"]["source"] == "memory"
    assert s["session"]["title"] == "chat" and s["session"]["memory_session_id"] == "chat"
    assert s["session"]["mode"] == "chat" and s["session"]["completed"] is False
    turns = s["turns"]
    assert [t["ordinal"] for t in turns] == [1, 2, 3]
    assert turns[0]["user_input"] is None and turns[0]["event_types"] == ["system"]   # the preamble turn
    assert turns[1]["user_input"]["text"] == "first question" and turns[1]["completed"] is True
    assert turns[1]["final_response"]["text"] == "first answer"
    assert turns[2]["completed"] is False and turns[2]["final_response"] is None
    assert turns[2]["terminal_event_id"] is None
    # the preamble turn opens too
    t0 = views.open(args("open", {"id": turns[0]["id"], "limit": 5}))["data"]
    assert [e["type"] for e in t0["events"]] == ["system"] and t0["traversal"]["previous_turn_id"] is None


def test_open_event_full_fidelity_and_traversal(store, book, views):
    evs = agent_session(book, turns=2)
    key = store.cursor_key
    call = views.open(args("open", {"id": handles.event_id(key, evs[1]["message_id"])}))["data"]
    assert call["kind"] == "event" and call["event"]["type"] == "tool_call"
    assert call["content"]["format"] == "tool_call" and call["content"]["tool_name"] == "Read"
    assert call["content"]["arguments"] == {"file_path": "/repo/etc/nginx0.conf"}
    assert call["content"]["truncated"] is False and call["event"]["originating_model"] is None
    out = views.open(args("open", {"id": handles.event_id(key, evs[2]["message_id"])}))["data"]
    assert out["content"]["format"] == "tool_response" and out["content"]["text"] == evs[2]["content"]
    assert out["content"]["exit_code"] == 0 and out["content"]["is_error"] is False
    assert out["event"]["message_id"] == evs[2]["message_id"]
    ans = views.open(args("open", {"id": handles.event_id(key, evs[3]["message_id"])}))["data"]
    assert ans["event"]["terminal"] is True and ans["event"]["model"] == "claude-x" and ans["turn"]["completed"]
    t = ans["traversal"]
    assert t["previous_event_id"] == handles.event_id(key, evs[2]["message_id"])
    # events are adjacent within their turn (null at its ends); the turn ids lead to the next turn
    assert t["next_event_id"] is None
    assert t["previous_turn_id"] is None and t["next_turn_id"] == handles.turn_id(key, evs[4]["message_id"], "x")
    second = views.open(args("open", {"id": handles.event_id(key, evs[4]["message_id"])}))["data"]["traversal"]
    assert second["previous_event_id"] is None and second["next_event_id"] == handles.event_id(key, evs[5]["message_id"])
    last = views.open(args("open", {"id": handles.event_id(key, evs[-1]["message_id"])}))["data"]
    assert last["traversal"]["next_event_id"] is None and last["traversal"]["next_turn_id"] is None
    first = views.open(args("open", {"id": handles.event_id(key, evs[0]["message_id"])}))["data"]
    assert first["traversal"]["previous_event_id"] is None and first["event"]["ordinal"] == 1


def test_encrypted_reasoning_placeholder(store, book, views):
    evs = [book.event("s", "user_input", "q"), book.event("s", "reasoning", H.ENCRYPTED_REASONING),
           book.event("s", "assistant_response", "a")]
    book.put(evs)
    tid = handles.turn_id(store.cursor_key, evs[0]["message_id"], "s")
    page = views.open(args("open", {"id": tid, "limit": 5}))["data"]["events"]
    assert page[1]["summary"] == H.ENCRYPTED_REASONING
    ev = views.open(args("open", {"id": page[1]["id"]}))["data"]
    assert ev["content"] == {"format": "reasoning", "encrypted": True, "text": H.ENCRYPTED_REASONING,
                             "truncated": False}


def test_session_times_are_earliest_and_latest_not_creation_order(store, book, views):
    late, early = book.event("s", "user_input", "late", ts=T0 + 50_000), book.event("s", "user_input", "early", ts=T0)
    book.put([late])
    book.put([early])   # imported after, but older
    sid = handles.session_id(store.cursor_key, "s")
    s = views.open(args("open", {"id": sid}))["data"]["session"]
    assert s["started_at"] == H.iso_ms(T0) and s["updated_at"] == H.iso_ms(T0 + 50_000)
    # in a window that only its earliest and latest events reach, the session is listed
    lst = views.list_sessions(args("list_sessions", {"start_datetime": H.iso_ms(T0 + 1),
                                                     "end_datetime": H.iso_ms(T0 + 2)}))
    assert [x["id"] for x in lst["data"]["sessions"]] == [sid]


# -------------------------------------------------------------------------------- search_sessions
def test_search_defaults_types_snippets_and_ordering(store, book, views):
    agent_session(book, turns=2)
    r = views.search_sessions(args("search_sessions", {"query": "nginx upstream timed out"}))
    assert r["request"]["event_types"] == ["user_input", "assistant_response"] and r["request"]["n_hits"] == 10
    types = [h["event"]["type"] for h in r["data"]["results"]]
    assert types and set(types) <= {"user_input", "assistant_response"}
    r = views.search_sessions(args("search_sessions", {"query": "upstream timed out",
                                                       "event_types": ["tool_response", "tool_response"]}))
    assert r["request"]["event_types"] == ["tool_response"]
    hits = r["data"]["results"]
    assert [h["event"]["type"] for h in hits] == ["tool_response"] * 2
    for h in hits:
        assert len(h["snippet"]["text"]) <= H.SNIPPET_CHARS + 2 and h["snippet"]["truncated"] is True
        assert "upstream timed out" in h["snippet"]["text"]
        assert 0 < h["score"] <= 1 and h["id"] == h["event"]["id"] == h["open"]["event_id"]
        assert h["turn"]["id"] == h["open"]["turn_id"] and h["session"]["id"] == h["open"]["session_id"]
    # equal scores: newer first; the best scores 1 (scores are shares of the best in the response)
    assert hits[0]["event"]["timestamp"] > hits[1]["event"]["timestamp"] and hits[0]["score"] == 1.0
    assert [h["rank"] for h in hits] == [1, 2]
    # the whole response stays small although each output is ~20 KB
    assert len(json.dumps(r)) < 4000


def test_search_orders_many_equal_hits_newest_first_then_by_event_id(store, book, views, monkeypatch):
    # agent history repeats itself: 60 events of the same text (a session each, so no neighbour adds to
    # one), a dozen times each shared by several; a pool that large is ordered by time in C first
    # (SearchIndex._tied_first) and the page is still score, then newer, then the smaller event id
    from storaged.search import SearchIndex
    used = []
    real = SearchIndex._tied_first
    monkeypatch.setattr(SearchIndex, "_tied_first", staticmethod(lambda *a: used.append(1) or real(*a)))
    evs = [book.event(f"s{i}", "user_input", "disk quota exceeded on the build host", ts=T0 + (i % 12) * 1000)
           for i in range(60)]
    book.put(evs)
    key = store.cursor_key
    want = sorted(evs, key=lambda e: (-e["timestamp"], handles.event_id(key, e["message_id"])))
    for n in (1, 5, 7):
        hits = views.search_sessions(args("search_sessions", {"query": "disk quota exceeded", "n_hits": n}))
        assert [h["id"] for h in hits["data"]["results"]] == [handles.event_id(key, e["message_id"]) for e in want[:n]]
    assert used


def test_search_scope_filters_and_truncation(store, book, views):
    agent_session(book, "claude-code:a", turns=3)
    agent_session(book, "codex:b", turns=1, harness="codex", source="codex")
    key = store.cursor_key
    q = {"query": "nginx", "n_hits": 50}
    everything = views.search_sessions(args("search_sessions", q))["data"]
    assert everything["result_count"] == 4 and everything["truncated"] is False
    one = views.search_sessions(args("search_sessions", {**q, "n_hits": 1}))["data"]
    assert one["result_count"] == 1 and one["truncated"] is True and one["limit"] == 1
    codex = views.search_sessions(args("search_sessions", {**q, "harness": "codex"}))["data"]["results"]
    assert [h["session"]["harness"] for h in codex] == ["codex"]
    assert views.search_sessions(args("search_sessions", {**q, "harness": "codex", "source": "claude"})
                                 )["data"]["results"] == []
    assert views.search_sessions(args("search_sessions", {**q, "harness": "Codex"}))["data"]["results"] == []
    within = views.search_sessions(args("search_sessions", {**q, "within_id": handles.session_id(key, "claude-code:a")}))
    assert {h["session"]["title"] for h in within["data"]["results"]} == {"title of claude-code:a"}
    turn = within["data"]["results"][0]["open"]["turn_id"]
    in_turn = views.search_sessions(args("search_sessions", {**q, "within_id": turn,
                                                             "event_types": list(H.EVENT_TYPES)}))["data"]["results"]
    assert in_turn and {h["turn"]["id"] for h in in_turn} == {turn}
    nothing = views.search_sessions(args("search_sessions", {"query": "no such words anywhere"}))["data"]
    coverage = views.search_sessions(args("search_sessions", {"query": "zzz"}))["data"]["coverage"]
    assert nothing.pop("coverage").keys() == coverage.keys()  # observed_at_unix_ms: each call's own clock
    assert nothing == {"result_count": 0, "limit": 10, "truncated": False, "results": []}


def test_search_japanese(store, book, views):
    book.put([book.event("jp", "user_input", "本番データベースの移行を決定した。理由は性能です。"),
              book.event("jp", "assistant_response", "ありがとうございます。移行計画を作ります。")])
    hits = views.search_sessions(args("search_sessions", {"query": "データベース移行"}))["data"]["results"]
    assert hits and "データベース" in hits[0]["snippet"]["text"]


def test_snippet_work_is_bounded_by_a_count_not_the_query_length():
    """A 4096-character Japanese query over a 300k-character Japanese text: the snippet step locates at
    most ``snippet.UNITS_MAX`` query units, each with one scan to find it and one per match kept (at most
    ``MATCHES_PER_TERM``) — not one scan of the text per CJK bigram (4095 scans held the daemon for
    seconds). Counted on the text's ``find`` calls, so the bound holds whatever the machine's speed."""
    import random

    from storaged import snippet as SN

    class Counting(str):
        scans = 0

        def find(self, *a):  # every scan of the text goes through here
            Counting.scans += 1
            return super().find(*a)

    rng = random.Random(1)
    kanji = [chr(x) for x in range(0x4E00, 0x4E00 + 300)]
    text = "".join(rng.choice(kanji) for _ in range(300_000))
    query = "".join(rng.choice(kanji) for _ in range(4096))
    units = SN._patterns(query)
    assert len(units) == SN.UNITS_MAX   # the query has thousands of bigrams; only the first are located
    found = SN._matches(Counting(SN.normalize(text)), query)
    assert found and {u for _, _, u in found} <= set(range(SN.UNITS_MAX))
    assert Counting.scans <= SN.UNITS_MAX * (SN.MATCHES_PER_TERM + 1)
    out, cut = SN.snippet(text, query, H.SNIPPET_CHARS)
    assert cut and len(out) <= H.SNIPPET_CHARS + 2 and any(piece in out for piece, _ in units)


@pytest.mark.parametrize("raw,code,field", [
    ({"query": "   "}, H.INVALID_REQUEST, "query"),
    ({}, H.INVALID_REQUEST, "query"),
    ({"query": 5}, H.INVALID_REQUEST, "query"),
    ({"query": "x" * 4097}, H.INVALID_REQUEST, "query"),
    ({"query": "x", "event_types": []}, H.INVALID_REQUEST, "event_types"),
    ({"query": "x", "event_types": ["debug_trace"]}, H.UNSUPPORTED_EVENT_TYPE, "event_types"),
    ({"query": "x", "event_types": ["unknown"]}, H.UNSUPPORTED_EVENT_TYPE, "event_types"),
    ({"query": "x", "n_hits": 0}, H.INVALID_REQUEST, "n_hits"),
    ({"query": "x", "n_hits": 51}, H.INVALID_REQUEST, "n_hits"),
    ({"query": "x", "n_hits": 2.5}, H.INVALID_REQUEST, "n_hits"),
    ({"query": "x", "n_hits": True}, H.INVALID_REQUEST, "n_hits"),
    ({"query": "x", "harness": "  "}, H.INVALID_REQUEST, "harness"),
    ({"query": "x", "source": ""}, H.INVALID_REQUEST, "source"),
    ({"query": "x", "within_id": "nonsense"}, H.INVALID_ID, "within_id"),
    ({"query": "x", "within_id": "event:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"}, H.INVALID_REQUEST, "within_id"),
    ({"query": "x", "bogus": 1}, H.INVALID_REQUEST, "bogus"),
])
def test_search_invalid_inputs(raw, code, field):
    with pytest.raises(HistoryError) as e:
        args("search_sessions", raw)
    assert e.value.code == code and e.value.details.get("field") == field
    assert "x" * 20 not in e.value.message   # the value is never echoed


def test_search_within_unknown_and_forged(store, book, views):
    agent_session(book)
    gone = handles.session_id(store.cursor_key, "never-existed")
    with pytest.raises(HistoryError) as e:
        views.search_sessions(args("search_sessions", {"query": "x", "within_id": gone}))
    assert e.value.code == H.NOT_FOUND
    forged = handles.session_id(b"other key" * 4, "claude-code:s1")
    with pytest.raises(HistoryError) as e:
        views.search_sessions(args("search_sessions", {"query": "x", "within_id": forged}))
    assert e.value.code == H.INVALID_ID


# ------------------------------------------------------------------------------------------ open
def test_open_shapes_and_paging(store, book, views):
    agent_session(book, turns=5)
    sid = handles.session_id(store.cursor_key, "claude-code:s1")
    summary = views.open(args("open", {"id": sid}))["data"]
    assert summary["turns"] == [] and summary["next_cursor"] is None and summary["session"]["turn_count"] == 5
    assert summary["traversal"]["first_turn_id"] != summary["traversal"]["last_turn_id"]
    seen = []
    page = views.open(args("open", {"id": sid, "limit": 2}))
    while True:
        data = page["data"]
        seen += [t["ordinal"] for t in data["turns"]]
        assert len(data["turns"]) <= 2
        if data["next_cursor"] is None:
            break
        page = views.open(args("open", {"cursor": data["next_cursor"]}))
        assert page["request"] == {"cursor": data["next_cursor"]}
    assert seen == [1, 2, 3, 4, 5]
    turn = views.open(args("open", {"id": summary["traversal"]["last_turn_id"]}))["data"]
    assert turn["events"] == [] and turn["summary"]["tools_called"] == ["Read"]
    assert turn["summary"]["event_types"] == ["user_input", "tool_call", "tool_response", "assistant_response"]
    assert turn["turn"]["ordinal"] == 5 and turn["traversal"]["next_turn_id"] is None
    ords = []
    page = views.open(args("open", {"id": turn["turn"]["id"], "limit": 3}))
    while True:
        ords += [e["ordinal"] for e in page["data"]["events"]]
        if not page["data"]["next_cursor"]:
            break
        page = views.open(args("open", {"cursor": page["data"]["next_cursor"]}))
    assert ords == [1, 2, 3, 4]
    assert all(len(e["summary"]) <= H.COMPACT_CHARS + 1 for e in page["data"]["events"])


def test_open_cursor_is_stale_after_a_change_but_not_after_an_append(store, book, views):
    evs = agent_session(book, turns=3)
    sid = handles.session_id(store.cursor_key, "claude-code:s1")
    c1 = views.open(args("open", {"id": sid, "limit": 1}))["data"]["next_cursor"]
    agent_session(book, turns=1)       # appended at the end: the cursor goes on and sees the new turn
    ords = []
    page = views.open(args("open", {"cursor": c1}))
    while True:
        ords += [t["ordinal"] for t in page["data"]["turns"]]
        if not page["data"]["next_cursor"]:
            break
        page = views.open(args("open", {"cursor": page["data"]["next_cursor"]}))
    assert ords == [2, 3, 4]
    c2 = views.open(args("open", {"id": sid, "limit": 1}))["data"]["next_cursor"]
    from protocol.validation import validate
    store.delete_message(validate("delete_message", {"message_id": evs[5]["message_id"]}))
    with pytest.raises(HistoryError) as e:
        views.open(args("open", {"cursor": c2}))
    assert e.value.code == H.INVALID_REQUEST and e.value.details.get("reason") == "stale_cursor"
    assert "reopen" in e.value.message


@pytest.mark.parametrize("raw,code", [
    ({}, H.INVALID_REQUEST), ({"id": "  "}, H.INVALID_REQUEST), ({"id": "turn"}, H.INVALID_ID),
    ({"id": "message:abcd1234"}, H.INVALID_ID), ({"id": 5}, H.INVALID_REQUEST), ({"limit": 3}, H.INVALID_REQUEST),
    ({"id": "event:AAAAAAAAAAAA", "cursor": "x"}, H.INVALID_REQUEST), ({"cursor": "x", "limit": 2}, H.INVALID_REQUEST),
    ({"id": "event:AAAAAAAAAAAA", "limit": 2}, H.INVALID_REQUEST), ({"id": "turn:AAAAAAAAAAAA", "limit": 0},
                                                                    H.INVALID_REQUEST),
    ({"id": "turn:AAAAAAAAAAAA", "limit": 101}, H.INVALID_REQUEST), ({"id": "turn:AAAA", "extra": 1}, H.INVALID_REQUEST),
])
def test_open_invalid_inputs(raw, code):
    with pytest.raises(HistoryError) as e:
        args("open", raw)
    assert e.value.code == code


def test_open_not_found_and_bad_cursors(store, book, views):
    evs = agent_session(book)
    key = store.cursor_key
    from protocol.validation import validate
    store.delete_message(validate("delete_message", {"message_id": evs[2]["message_id"]}))
    for gone in (handles.event_id(key, evs[2]["message_id"]), handles.session_id(key, "nope"),
                 handles.turn_id(key, evs[2]["message_id"], "x"), handles.turn_id(key, None, "claude-code:s1")):
        with pytest.raises(HistoryError) as e:
            views.open(args("open", {"id": gone}))
        assert e.value.code == H.NOT_FOUND, gone
    sid = handles.session_id(key, "claude-code:s1")
    good = views.open(args("open", {"id": sid, "limit": 1}))["data"]["next_cursor"]
    listing = views.list_sessions(args("list_sessions", {"start_datetime": "2000-01-01T00:00:00Z",
                                                         "end_datetime": "2100-01-01T00:00:00Z", "limit": 1}))
    for bad in (good[:-3], good + "A", "garbage", listing["data"]["next_cursor"] or "zz"):
        with pytest.raises(HistoryError) as e:
            views.open(args("open", {"cursor": bad}))
        assert e.value.code == H.INVALID_REQUEST


# ----------------------------------------------------------------------------------- list_sessions
def _strings(obj):
    """Every string in a reply, at any depth."""
    if isinstance(obj, dict):
        obj = list(obj.values())
    if isinstance(obj, list):
        for v in obj:
            yield from _strings(v)
    elif isinstance(obj, str):
        yield obj


def test_list_sessions_window_sort_filters_and_paging(store, book, views):
    for i in range(7):
        sid = f"codex:{i}" if i % 2 else f"claude-code:{i}"
        evs = [book.event(sid, "user_input", f"q{i}", ts=T0 + i * 60_000),
               book.event(sid, "assistant_response", f"a{i}", ts=T0 + i * 60_000 + 30_000)]
        if i == 3:
            evs.append(book.event(sid, "tool_call", "{}", ts=T0 + i * 60_000 + 40_000, tool_name="Bash"))
        book.put(evs, [{"session_id": sid, "harness": sid.split(":")[0], "source": "codex" if i % 2 else "claude"}])
    window = {"start_datetime": H.iso_ms(T0 + 60_000 + 30_000), "end_datetime": H.iso_ms(T0 + 5 * 60_000)}
    # updated_at >= start (inclusive) and started_at < end (exclusive): sessions 1..4
    r = views.list_sessions(args("list_sessions", window))
    ids = [x["session"]["memory_session_id"] for x in r["data"]["sessions"]]
    assert ids == ["claude-code:4", "codex:3", "claude-code:2", "codex:1"]
    assert r["data"]["truncated"] is False and r["data"]["next_cursor"] is None
    asc = views.list_sessions(args("list_sessions", {**window, "sort": "asc"}))["data"]["sessions"]
    assert [x["session"]["memory_session_id"] for x in asc] == list(reversed(ids))
    assert [x["session"]["memory_session_id"] for x in views.list_sessions(
        args("list_sessions", {**window, "harness": "codex"}))["data"]["sessions"]] == ["codex:3", "codex:1"]
    assert [x["session"]["memory_session_id"] for x in views.list_sessions(
        args("list_sessions", {**window, "mode": "tool_calling"}))["data"]["sessions"]] == ["codex:3"]
    paged, cursor = [], None
    while True:
        raw = {**window, "limit": 1}
        if cursor:
            raw["cursor"] = cursor
        page = views.list_sessions(args("list_sessions", raw))["data"]
        paged += [(x["rank"], x["session"]["memory_session_id"]) for x in page["sessions"]]
        cursor = page["next_cursor"]
        if not cursor:
            break
        with pytest.raises(HistoryError):   # the cursor is bound to the filters
            views.list_sessions(args("list_sessions", {**window, "limit": 1, "cursor": cursor, "sort": "asc"}))
    assert paged == list(enumerate(ids, 1))
    item = r["data"]["sessions"][0]
    assert set(item) == {"rank", "id", "session", "open"} and item["open"] == {"session_id": item["id"]}
    # metadata only: no transcript text ("q4", "a4") as a word of any string (an opaque id such as
    # "session:...la45KL..." may hold those two letters by chance)
    assert not {"q4", "a4"} & {w for s in _strings(r) for w in s.split()}


@pytest.mark.parametrize("raw", [
    {"start_datetime": "2026-01-01T00:00:00Z"},
    {"start_datetime": "2026-01-01T00:00:00", "end_datetime": "2026-01-02T00:00:00Z"},
    {"start_datetime": "2026-01-02T00:00:00Z", "end_datetime": "2026-01-01T00:00:00Z"},
    {"start_datetime": "2026-01-01T00:00:00Z", "end_datetime": "2026-01-01T00:00:00Z"},
    {"start_datetime": 1767225600000, "end_datetime": "2026-01-02T00:00:00Z"},
    {"start_datetime": "2026-01-01T00:00:00Z", "end_datetime": "2026-01-02T00:00:00Z", "mode": "batch"},
    {"start_datetime": "2026-01-01T00:00:00Z", "end_datetime": "2026-01-02T00:00:00Z", "sort": "newest"},
    {"start_datetime": "2026-01-01T00:00:00Z", "end_datetime": "2026-01-02T00:00:00Z", "source": " "},
    {"start_datetime": "2026-01-01T00:00:00Z", "end_datetime": "2026-01-02T00:00:00Z", "page": 2},
])
def test_list_sessions_invalid(raw):
    with pytest.raises(HistoryError) as e:
        args("list_sessions", raw)
    assert e.value.code == H.INVALID_REQUEST


def test_display_label_rules(store, book, views):
    book.put([book.event("codex:c", "user_input", "x")],
             [{"session_id": "codex:c", "harness": "codex", "source": "codex",
               "first_prompt": "  Fix the flaky build\nsecond line" + "y" * 200}])
    book.put([book.event("codex:long", "user_input", "x")],
             [{"session_id": "codex:long", "harness": "codex", "source": "codex", "first_prompt": "z" * 300}])
    book.put([book.event("claude-code:t", "user_input", "x")],
             [{"session_id": "claude-code:t", "harness": "claude-code", "source": "claude", "summary": "Refactor",
               "first_prompt": "ignored for claude"}])
    book.put([book.event("claude-code:n", "user_input", "x")],
             [{"session_id": "claude-code:n", "harness": "claude-code", "source": "claude"}])
    label = {sid: views.display_label(sid) for sid in ("codex:c", "codex:long", "claude-code:t", "claude-code:n")}
    assert label["codex:c"] == "Fix the flaky build"
    assert label["codex:long"] == "z" * 120 + "…"
    assert label["claude-code:t"] == "Refactor"
    assert label["claude-code:n"].startswith("claude-code chat session, updated ") and "1 turn" in label["claude-code:n"]


# ---------------------------------------------------------------------------------- file_attention
def attention(views, raw, tail, project="/repo/.git", **ctx):
    context = {"cwd": "/repo", "project": project, "tail": tail, **ctx}
    return views.file_attention(args("file_attention", raw, context))


def touch(book, sid, path, root, tail, op="edit", tool="Edit", project="/repo/.git", ts=None):
    return book.event(sid, "tool_call", json.dumps({"file_path": path}), ts=ts, tool_name=tool,
                      files=[{"path": path, "root": root, "tail": tail, "project": project, "op": op}])


def test_file_attention_unifies_worktrees_and_flags_ambiguity(store, book, views):
    book.put([book.event("claude-code:main", "user_input", "edit it"),
              touch(book, "claude-code:main", "/repo/src/app.py", "/repo", "src/app.py"),
              touch(book, "claude-code:main", "/repo/src/app.py", "/repo", "src/app.py", op="read", tool="Read")],
             [{"session_id": "claude-code:main", "harness": "claude-code", "source": "claude", "project": "/repo/.git"}])
    book.put([book.event("claude-code:wt", "user_input", "in the worktree"),
              touch(book, "claude-code:wt", "/wt/feat/src/app.py", "/wt/feat", "src/app.py")],
             [{"session_id": "claude-code:wt", "harness": "claude-code", "source": "claude", "project": "/repo/.git"}])
    book.put([book.event("codex:other", "user_input", "another project"),
              touch(book, "codex:other", "/other/src/app.py", "/other", "src/app.py", project="/other/.git"),
              book.event("codex:other", "tool_call", json.dumps({"file_path": "lib/src/app.py"}), tool_name="Edit",
                         files=[{"path": "lib/src/app.py", "root": None, "tail": None, "project": None, "op": "edit"}])],
             [{"session_id": "codex:other", "harness": "codex", "source": "codex", "project": "/other/.git"}])
    r = attention(views, {"path": "src/app.py"}, "src/app.py")
    d = r["data"]
    assert d["summary"]["total_touches"] == 3 and d["summary"]["distinct_sessions"] == 2
    assert {x["root"] for x in d["roots"]} == {"/repo", "/wt/feat"} and d["summary"]["ambiguous"] is True
    assert d["granularity"] == "sessions" and [s["session"]["touch_count"] for s in d["sessions"]] == [1, 2]
    assert d["sessions"][1]["session"]["tools"] == ["Edit", "Read"]
    for row in d["sessions"]:
        assert set(row["open"]) == {"session_id", "event_id", "turn_id"}
        assert views.open(args("open", {"id": row["open"]["event_id"]}))["data"]["event"]["type"] == "tool_call"
    muts = attention(views, {"path": "src/app.py", "mutations_only": True, "granularity": "events"}, "src/app.py")
    assert [e["event"]["op"] for e in muts["data"]["events"]] == ["edit", "edit"]
    assert all(e["event"]["match_kind"] == "path_tail" for e in muts["data"]["events"])
    everywhere = attention(views, {"path": "src/app.py", "scope": "all"}, "src/app.py")["data"]["summary"]
    assert everywhere["total_touches"] == 5 and everywhere["unknown_root_touches"] == 1
    reads = attention(views, {"path": "src/app.py", "tool": "read"}, "src/app.py")["data"]["summary"]
    assert reads["total_touches"] == 1
    bare = attention(views, {"path": "app.py", "scope": "all"}, "app.py")
    assert bare["data"]["summary"]["ambiguous"] is True and any(w.startswith("ambiguous_tail") for w in bare["warnings"])
    limited = attention(views, {"path": "src/app.py", "granularity": "events", "limit": 1}, "src/app.py")["data"]
    assert limited["result_count"] == 1 and limited["truncated"] is True
    # project scope fails closed without a launch identity
    with pytest.raises(HistoryError) as e:
        attention(views, {"path": "src/app.py"}, "src/app.py", project=None)
    assert e.value.code == H.INVALID_REQUEST


@pytest.mark.parametrize("path", [" src/a.py", "src/a.py ", "file:///repo/a.py", "src/", "src/.", "", "a\nb",
                                  "a\x00b"])
def test_file_attention_invalid_paths(path):
    with pytest.raises(HistoryError) as e:
        args("file_attention", {"path": path})
    assert e.value.code == H.INVALID_REQUEST and e.value.details.get("field") == "path"


def test_file_attention_time_window_precision():
    with pytest.raises(HistoryError):
        args("file_attention", {"path": "a/b.py", "start_datetime": "2026-01-01T00:00:00.1234Z"})
    ok = args("file_attention", {"path": "a/b.py", "start_datetime": "2026-01-01T00:00:00.123Z"})
    assert ok.start == T0 + 123


# ----------------------------------------------------------------------- ingest status and coverage
def test_coverage_and_ingest_status(store, book, views):
    agent_session(book)
    q = args("search_sessions", {"query": "nginx"})
    r = views.search_sessions(q)
    assert r["data"]["coverage"]["state"] == "complete" and r["warnings"] == []
    book.put([], checkpoints=[{"source": "claude", "key": "/x/a.jsonl", "value": {"offset": 9, "bytes": 9,
                                                                                   "events": 8, "redacted": 2}}])
    r = views.search_sessions(q)
    assert r["data"]["coverage"]["state"] == "unknown" and r["warnings"][0].startswith("coverage_unknown")
    hb = {"instance": "i1", "started_at": T0, "interval_ms": 1000, "sources": [
        {"source": "claude", "harness": "claude-code", "discovery_complete": True, "files_total": 2,
         "files_completed": 1, "bytes_total": 100, "bytes_completed": 9}]}
    store.ingest.heartbeat(wire.validate_args("ingest_heartbeat", hb))
    r = views.search_sessions(q)
    assert r["data"]["coverage"]["state"] == "partial" and r["warnings"][0].startswith("coverage_partial")
    status = views.get_ingest_status(args("get_ingest_status", {}), False)["data"]
    conds = {c["condition_type"]: (c["state"], c["reason"]) for c in status["conditions"]}
    assert conds["coverage"] == ("false", "backfill_in_progress") and conds["readiness"] == ("true", "ready")
    assert status["current"]["progress"]["backlog_bytes"] == 91
    src = status["sources"][0]
    assert (src["source"], src["events_ingested"], src["secrets_redacted"]) == ("claude", 8, 2)
    assert "/x/a.jsonl" not in json.dumps(status)    # never a file path
    hb["sources"][0].update(files_completed=2, bytes_completed=100)
    store.ingest.heartbeat(wire.validate_args("ingest_heartbeat", hb))
    assert views.search_sessions(q)["data"]["coverage"]["state"] == "complete"


def test_ingest_state_survives_restart_and_rebuild(tmp_path):
    s = Store.open(str(tmp_path / "d"))
    b = Book(s)
    agent_session(b)
    b.put([], checkpoints=[{"source": "claude", "key": "/a", "value": {"offset": 5, "events": 3}},
                           {"source": "claude", "key": "/b", "value": {"offset": 7, "events": 4}}])
    b.put([], checkpoints=[{"source": "claude", "key": "/a", "value": {"offset": 9, "events": 5}},
                           {"source": "claude", "key": "/b", "value": None}])
    assert s.ingest.of_source("claude") == {"/a": {"offset": 9, "events": 5}}
    assert s.ingest.totals["claude"]["events"] == 5 and s.ingest.totals["claude"]["files"] == 1
    dead = s.health()["dead_bytes"]
    assert dead > 0   # the superseded checkpoint records
    rebuild(s)
    assert s.health()["dead_bytes"] == 0
    s.close()
    for snapshot in (True, False):
        if not snapshot:
            (tmp_path / "d" / "snapshot").unlink()
        s = Store.open(str(tmp_path / "d"))
        assert s.ingest.of_source("claude") == {"/a": {"offset": 9, "events": 5}}
        assert s.session_meta["claude-code:s1"]["title"] == "title of claude-code:s1"
        assert s.health()["dead_bytes"] == 0
        s.close()


def test_release_0_1_data_directory_opens_with_events(tmp_path):
    import shutil

    src = FIXTURES / "store-v1"
    shutil.copytree(src, tmp_path / "d", ignore=shutil.ignore_patterns("expected.json"))
    s = Store.open(str(tmp_path / "d"))
    assert s.snapshot_valid and not s.last_error
    expected = json.loads((src / "expected.json").read_text())
    assert [m.to_dict() for m in s.by_seq.values()] == expected
    assert [m.etype for m in s.by_seq.values()] == [H.ROLE_EVENT_TYPE[m["role"]] for m in expected]
    v = HistoryViews(s)
    hits = v.search_sessions(args("search_sessions", {"query": "postgres migration"}))["data"]["results"]
    assert hits and all(h["session"]["harness"] == "convmem" for h in hits)
    s.close()
