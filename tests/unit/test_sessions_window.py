"""The sessions view's time window (since inclusive, until exclusive) and order, at the store level
(storaged.store.Store + storaged.views, validated as the daemon validates) and once end to end
through a real daemon process.

Semantics under test: a session is in [since, until) if it has a message at or after ``since`` and
started (its first live message) before ``until``; sessions are ordered by (started_at, session_id),
ascending or descending; a cursor is bound to its window and order.
"""
from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from tests.support.daemon_proc import DaemonPool
from tests.support.faultio import delete, read, update, write
from protocol import errors as E
from protocol.errors import ProtocolError
from protocol.validation import validate
from storaged.store import Store
from ulid import ULID

pytestmark = pytest.mark.timeout(60)

T0 = 1_750_000_000_000                      # 2025-06-15T15:06:40Z
T0_Z = "2025-06-15T15:06:40Z"
T0_JST = "2025-06-16T00:06:40+09:00"
_n = 0


def mid(ts: int) -> str:
    """A ULID for a message created at ``ts`` (unique within the test run)."""
    global _n
    _n += 1
    return str(ULID.from_bytes(((ts << 80) | (0xC0FFEE << 40) | _n).to_bytes(16, "big")))


def msg(sid: str, ts: int, content: str = "note", **md) -> dict:
    return {"message_id": mid(ts), "session_id": sid, "timestamp": ts, "role": "user", "content": content,
            "revision": 1, "updated_at": ts, "metadata": md}


def put(store: Store, *messages: dict) -> dict:
    return store.import_messages(validate("import_messages", {"messages": list(messages)}))


def sessions(store: Store, **args) -> dict:
    return read(store, view="sessions", **args)


def sids(page: dict) -> list[str]:
    return [s["session_id"] for s in page["sessions"]]


def all_pages(store: Store, limit: int, between=None, **args) -> list[str]:
    served: list[str] = []
    cur = None
    n = 0
    while True:
        a = dict(args, limit=limit)
        if cur:
            a["cursor"] = cur
        page = sessions(store, **a)
        assert len(page["sessions"]) <= limit
        served += sids(page)
        cur = page.get("nextCursor")
        if not cur:
            return served
        assert len(page["sessions"]) == limit
        n += 1
        if between is not None:
            between(n)


def verr(fn, *a, **kw) -> str:
    with pytest.raises(ProtocolError) as info:
        fn(*a, **kw)
    assert info.value.code == E.VALIDATION_ERROR
    return str(info.value)


@pytest.fixture
def day(store):
    """Sessions around T0 (times in ms relative to T0):
    old [-100000, -50000], a [0, 1000], b [5000], c [10000, 20000], d [5000] (ties with b), late [60000]."""
    put(store,
        msg("old", T0 - 100_000), msg("old", T0 - 50_000),
        msg("a", T0), msg("a", T0 + 1000),
        msg("b", T0 + 5000), msg("d", T0 + 5000),
        msg("c", T0 + 10_000), msg("c", T0 + 20_000),
        msg("late", T0 + 60_000))
    return store


# ------------------------------------------------------------------------------------------ edges
def test_no_window_lists_every_session_by_start_then_id(day):
    page = sessions(day)
    assert sids(page) == ["old", "a", "b", "d", "c", "late"]
    s = {x["session_id"]: x for x in page["sessions"]}
    assert (s["c"]["started_at"], s["c"]["last_message_at"], s["c"]["message_count"]) == (T0 + 10_000, T0 + 20_000, 2)
    assert sids(sessions(day, order="desc")) == ["late", "c", "d", "b", "a", "old"]
    assert sids(sessions(day, order="asc")) == sids(page)


def test_since_is_inclusive_on_the_last_message(day):
    assert sids(sessions(day, since=T0 + 1000)) == ["a", "b", "d", "c", "late"]      # a's last message is exactly at since
    assert sids(sessions(day, since=T0 + 1001)) == ["b", "d", "c", "late"]
    assert sids(sessions(day, since=T0 - 50_000)) == ["old", "a", "b", "d", "c", "late"]
    assert sids(sessions(day, since=T0 - 49_999)) == ["a", "b", "d", "c", "late"]
    # a session that started before since but is still active after it is in the window
    assert sids(sessions(day, since=T0 + 15_000)) == ["c", "late"]
    assert sids(sessions(day, since=T0 + 60_001)) == []


def test_until_is_exclusive_on_the_start(day):
    assert sids(sessions(day, until=T0 + 5000)) == ["old", "a"]                       # b and d start exactly at until
    assert sids(sessions(day, until=T0 + 5001)) == ["old", "a", "b", "d"]
    assert sids(sessions(day, until=T0 - 100_000)) == []
    assert sids(sessions(day, until=T0 + 5000, order="desc")) == ["a", "old"]
    assert sids(sessions(day, until=T0 + 5001, order="desc")) == ["d", "b", "a", "old"]


def test_since_and_until_together(day):
    # "what was I working on between T0+1000 and T0+10000": a (message at T0+1000), b, d; c starts at until
    assert sids(sessions(day, since=T0 + 1000, until=T0 + 10_000)) == ["a", "b", "d"]
    assert sids(sessions(day, since=T0 + 1000, until=T0 + 10_000, order="desc")) == ["d", "b", "a"]
    # an instant: the sessions running across it
    assert sids(sessions(day, since=T0 + 15_000, until=T0 + 15_000)) == ["c"]
    assert sids(sessions(day, since=T0 + 20_001, until=T0 + 60_000)) == []


def test_rfc3339_with_offsets_equals_epoch_ms(day):
    for form in (T0_Z, T0_JST, "2025-06-15T15:06:40.000Z", "2025-06-15T15:06:40+00:00",
                 "2025-06-15T08:06:40-07:00", "2025-06-15t15:06:40z"):
        assert sessions(day, since=form) == sessions(day, since=T0), form
        assert sessions(day, until=form, order="desc") == sessions(day, until=T0, order="desc"), form
    ms = "2025-06-16T00:06:41.000+09:00"   # T0 + 1000 (a's last message), in JST with milliseconds
    assert sids(sessions(day, since=ms)) == sids(sessions(day, since=T0 + 1000)) == ["a", "b", "d", "c", "late"]
    assert sids(sessions(day, since="2025-06-16T00:06:41.001+09:00")) == ["b", "d", "c", "late"]
    assert sids(sessions(day, since=float(T0 + 1000))) == ["a", "b", "d", "c", "late"]   # JSON numbers may be floats


def test_yesterday_is_one_call(store):
    """The motivating use: local-day boundaries in the caller's zone, newest first."""
    jst = timezone(timedelta(hours=9))
    start = datetime(2025, 6, 15, tzinfo=jst)
    ms = lambda dt: int(dt.timestamp() * 1000)  # noqa: E731
    put(store, msg("before-midnight", ms(start) - 60_000),           # ends 23:59 the day before: out
        msg("overnight", ms(start) - 3_600_000), msg("overnight", ms(start) + 60_000),   # runs across midnight: in
        msg("morning", ms(start) + 9 * 3_600_000),
        msg("evening", ms(start) + 23 * 3_600_000),
        msg("next-day", ms(start + timedelta(days=1))))                 # starts exactly at until: out
    page = sessions(store, since="2025-06-15T00:00:00+09:00", until="2025-06-16T00:00:00+09:00", order="desc")
    assert sids(page) == ["evening", "morning", "overnight"]


# ------------------------------------------------------------------------------------- validation
@pytest.mark.parametrize("value", [
    "2025-06-15T15:06:40",            # no offset
    "2025-06-15 15:06:40",            # no offset, space
    "2025-06-15",                     # a date is not a time
    "2025-06-15+09:00",
    "yesterday", "", "2025-13-01T00:00:00Z", "1969-12-31T23:59:59Z",
    -1, 2 ** 48, 1.5, True, [T0], {"ms": T0}, "x" * 100,
])
def test_bad_times_are_validation_errors_naming_the_field(store, value):
    for field in ("since", "until"):
        text = verr(sessions, store, **{field: value})
        assert field in text
        if isinstance(value, str) and len(value) > 3:
            assert value not in text  # the input is never echoed


def test_text_without_offset_says_so(store):
    assert "offset" in verr(sessions, store, since="2025-06-15T15:06:40")


def test_since_after_until_is_refused(day):
    assert "since" in verr(sessions, day, since=T0 + 1, until=T0)
    assert "since" in verr(sessions, day, since=T0_JST, until="2025-06-15T15:06:39.999Z")
    sessions(day, since=T0, until=T0)  # an instant is a valid window


def test_order_must_be_asc_or_desc(store):
    assert "order" in verr(sessions, store, order="newest")
    assert "order" in verr(sessions, store, order="DESC")


@pytest.mark.parametrize("view,extra", [
    ("history", {"session_id": "a"}), ("context", {"message_id": "01ARZ3NDEKTSV4RRFFQ69G5FAV"}),
    ("content", {"message_id": "01ARZ3NDEKTSV4RRFFQ69G5FAV"})])
@pytest.mark.parametrize("param,value", [("since", T0), ("until", T0_Z), ("order", "desc")])
def test_window_parameters_belong_to_the_sessions_view_only(day, view, extra, param, value):
    text = verr(read, day, view=view, **extra, **{param: value})
    assert param in text and view in text


# ----------------------------------------------------------------------------------------- paging
def many(store: Store, n: int = 40, seed: int = 3) -> None:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        start = T0 + rng.randrange(0, 100) * 1000   # many ties on started_at
        out.append(msg(f"s{i:02d}", start))
        for _ in range(rng.randrange(0, 3)):
            out.append(msg(f"s{i:02d}", start + rng.randrange(1, 50) * 1000))
    put(store, *out)


WINDOWS = [{}, {"since": T0 + 30_000}, {"until": T0 + 70_000}, {"since": T0 + 20_000, "until": T0 + 60_000}]


@pytest.mark.parametrize("order", ["asc", "desc"])
@pytest.mark.parametrize("window", WINDOWS)
def test_paging_matches_one_page(store, order, window):
    many(store)
    whole = sids(sessions(store, limit=1000, order=order, **window))
    assert whole  # every window holds something
    for limit in (1, 2, 3):
        assert all_pages(store, limit, order=order, **window) == whole


@pytest.mark.parametrize("order", ["asc", "desc"])
@pytest.mark.parametrize("window", WINDOWS)
def test_paging_under_concurrent_writes_never_skips_or_repeats(store, order, window):
    """Between pages: new messages in served and unserved sessions (native writes, now-stamped),
    updates, deletes of later messages, new sessions (both "now" and back-dated imports). Every
    session that is in the window before and after is served exactly once; none twice; nothing that
    was never in the window is served."""
    many(store)
    rng = random.Random(hash((order, str(window))) & 0xFFFF)
    for limit in (1, 2, 3):
        before = set(sids(sessions(store, limit=1000, order=order, **window)))
        written: list[str] = []
        ever = set(before)  # every session that was in the window at some moment of the paging

        def churn(n: int) -> None:
            if n > 12:
                return  # new sessions keep arriving at the end of an ascending list: let the paging finish
            live = sorted(store.sessions)
            sid = rng.choice(live)
            m = write(store, session_id=sid, content=f"more {n}")["message"]     # timestamp now: moves "last"
            written.append(m["message_id"])
            write(store, session_id=f"new-{limit}-{n}", content="fresh")       # a new session, started now
            put(store, msg(f"dated-{limit}-{n}", T0 + rng.randrange(0, 100) * 1000))  # a back-dated new one
            if written and rng.random() < 0.5:
                update(store, rng.choice(written), content=f"edited {n}")
            if len(written) > 2 and rng.random() < 0.3:
                delete(store, written.pop(0))   # never a session's first message (those are imported)
            ever.update(sids(sessions(store, limit=1000, order=order, **window)))

        served = all_pages(store, limit, between=churn, order=order, **window)
        after = set(sids(sessions(store, limit=1000, order=order, **window)))
        assert len(served) == len(set(served)), f"repeated: {sorted(s for s in served if served.count(s) > 1)}"
        missing = (before & after) - set(served)
        assert not missing, f"skipped {sorted(missing)} (limit {limit})"
        assert set(served) <= ever


def test_cursor_is_bound_to_window_and_order(day):
    many(day)
    first = sessions(day, limit=2, since=T0 + 1000, until=T0 + 80_000)
    cur = first["nextCursor"]
    # the same window in another notation is the same window
    same = sessions(day, limit=2, cursor=cur, since="2025-06-16T00:06:41+09:00", until=T0 + 80_000)
    assert same == sessions(day, limit=2, cursor=cur, since=T0 + 1000, until=T0 + 80_000)
    for other in ({"since": T0 + 1000, "until": T0 + 80_001}, {"since": T0, "until": T0 + 80_000},
                  {"until": T0 + 80_000}, {"since": T0 + 1000},
                  {"since": T0 + 1000, "until": T0 + 80_000, "order": "desc"}, {}):
        assert "cursor" in verr(sessions, day, limit=2, cursor=cur, **other), other
    desc = sessions(day, limit=2, order="desc")["nextCursor"]
    assert "cursor" in verr(sessions, day, limit=2, cursor=desc)
    assert "cursor" in verr(sessions, day, limit=2, cursor=desc, order="asc")
    sessions(day, limit=2, cursor=desc, order="desc")
    hist = read(day, view="history", session_id="c", limit=1)["nextCursor"]
    assert "cursor" in verr(sessions, day, cursor=hist)


def test_desc_cursor_continues_below_until(day):
    many(day)
    full = sids(sessions(day, limit=1000, order="desc", until=T0 + 50_000))
    assert all_pages(day, 1, order="desc", until=T0 + 50_000) == full
    starts = {s["session_id"]: s["started_at"] for s in sessions(day, limit=1000)["sessions"]}
    assert all(starts[s] < T0 + 50_000 for s in full)
    assert full == sorted(full, key=lambda s: (starts[s], s), reverse=True)


# ----------------------------------------------------------------------------------- end to end
@pytest.mark.process  # starts a process, unlike the rest of this module
def test_window_through_the_daemon(tmp_path):
    """The same call a front-end makes: read_messages over the daemon's socket, RFC 3339 + desc."""
    pool = DaemonPool(Path(tmp_path))
    try:
        d = pool.new("w").start()
        with d.client() as c:
            batch = [msg("a", T0), msg("a", T0 + 1000), msg("b", T0 + 5000), msg("c", T0 + 10_000),
                     msg("old", T0 - 100_000)]
            assert c.call("import_messages", {"messages": batch}) == {"status": "OK", "imported": 5, "existing": 0}
            args = {"view": "sessions", "since": T0_JST, "until": "2025-06-15T15:06:50Z", "order": "desc", "limit": 1}
            got, cur = [], None
            while True:
                rep = c.call("read_messages", {**args, **({"cursor": cur} if cur else {})})
                assert rep.get("status") != "ERROR", rep
                got += [s["session_id"] for s in rep["sessions"]]
                cur = rep.get("nextCursor")
                if not cur:
                    break
            assert got == ["b", "a"]   # c starts exactly at until (T0 + 10 s), old ended before since
            rep = c.call("read_messages", {"view": "sessions", "since": "2025-06-15T15:06:40"})
            assert rep["status"] == "ERROR" and rep["error"]["code"] == E.VALIDATION_ERROR
            assert "since" in rep["error"]["message"]
            rep = c.call("read_messages", {"view": "sessions", "cursor": cur or "x", "order": "sideways"})
            assert rep["error"]["code"] == E.VALIDATION_ERROR
            rep = c.call("read_messages", {"view": "history", "session_id": "a", "order": "desc"})
            assert rep["error"]["code"] == E.VALIDATION_ERROR
    finally:
        pool.close_all()


def test_mcp_schema_describes_the_window():
    from jsonschema import Draft202012Validator

    from mcpfront.tools import INPUT_SCHEMAS
    schema = INPUT_SCHEMAS["read_messages"]
    Draft202012Validator.check_schema(schema)
    v = Draft202012Validator(schema)
    for ok in ({"view": "sessions", "since": T0, "until": T0_JST, "order": "desc"},
               {"view": "sessions", "since": T0_Z}):
        assert not list(v.iter_errors(ok)), ok
    for bad in ({"view": "sessions", "since": -1}, {"view": "sessions", "order": "newest"},
                {"view": "sessions", "until": 1.5}, {"view": "sessions", "since": "x" * 100}):
        assert list(v.iter_errors(bad)), bad
    assert schema["properties"]["order"]["enum"] == ["asc", "desc"]


def test_window_with_messages_imported_out_of_time_order(store):
    put(store, msg("x", T0 + 10_000), msg("x", T0))     # created in this order, the newer one first
    assert sids(sessions(store, since=T0 + 5000)) == ["x"]
    [x] = sessions(store)["sessions"]
    assert (x["started_at"], x["last_message_at"]) == (T0, T0 + 10_000)   # earliest and latest, not first and last
    assert sids(sessions(store, until=T0 + 1)) == ["x"]                     # it started before T0 + 1


def test_started_at_follows_the_earliest_live_message(store):
    first, second = msg("x", T0), msg("x", T0 + 5000)
    put(store, first, second, msg("y", T0 + 1000))
    assert sids(sessions(store)) == ["x", "y"]
    delete(store, first["message_id"])
    [y, x] = sessions(store)["sessions"]                # x now starts after y
    assert (x["session_id"], x["started_at"], x["last_message_at"]) == ("x", T0 + 5000, T0 + 5000)
    put(store, msg("x", T0 - 1000))                     # an older message imported later moves it first again
    assert sids(sessions(store)) == ["x", "y"]
    assert sessions(store)["sessions"][0]["started_at"] == T0 - 1000


def _page_all(store: Store, between=None, **args) -> list[str]:
    """Every session id the view serves, page by page, calling ``between(page_number)`` between pages."""
    seen, cursor, n = [], None, 0
    while True:
        page = sessions(store, limit=2, **args, **({"cursor": cursor} if cursor else {}))
        seen += sids(page)
        cursor = page.get("nextCursor")
        if cursor is None:
            return seen
        n += 1
        if between is not None:
            between(n)


@pytest.mark.parametrize("order", ["asc", "desc"])
def test_pages_never_repeat_a_session_whose_start_moves_while_paging(store, order):
    # ten sessions s0..s9 starting a second apart, each with a second, later message
    firsts = {}
    for k in range(10):
        firsts[k] = msg(f"s{k}", T0 + k * 1000)
        put(store, firsts[k], msg(f"s{k}", T0 + 100_000 + k))

    def churn(n: int) -> None:
        # between pages: delete the first message of a session already served (its start moves to the end
        # of the order, into the pages still ahead), and import an older message into a session still
        # ahead of the cursor in descending order (its start moves back across the served pages)
        served = n * 2 - 1 if order == "asc" else 10 - n * 2
        if 0 <= served < 10 and firsts.get(served):
            delete(store, firsts.pop(served)["message_id"])
        if order == "desc" and n == 1:
            put(store, msg("s9", T0 - 50_000))

    seen = _page_all(store, churn, order=order)
    assert len(seen) == len(set(seen)), seen             # no session twice
    unchanged = {f"s{k}" for k in range(10)} - {"s9"}
    assert len(set(seen) & unchanged) >= 5               # and the pages still go on past the moves
