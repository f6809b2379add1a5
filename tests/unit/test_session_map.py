"""A start's sessions are made on first use or by the request loop's idle slices (storaged/indexes.py
``SessionMap``, ``SessionKeys``): a lookup makes only the session it asks for, whatever walks them
all makes the rest, the idle steps stop at their deadline, and what changes meanwhile (messages
written to, or every message deleted from, a session not made yet) stands — the result is what a
replay of the same log builds."""
from __future__ import annotations

import time

import pytest

from storaged import handles
from storaged.indexes import LOAD_STEP, Session, SessionKeys, SessionMap
from storaged.store import Store
from tests.support.faultio import delete, write
from tests.support.replayed import replay_copy

pytestmark = pytest.mark.unit

SESSIONS = 2 * LOAD_STEP + 40


def _fields(s: Session) -> tuple:
    return (s.sid, list(s.seqs), list(s.turn_seqs), s.kind_counts, s.summary_seqs, s.min_ts, s.max_ts,
            s.tool_calls, s.web_calls)


def _stored(tmp_path) -> tuple[str, dict[str, list[str]]]:
    d = str(tmp_path / "d")
    store = Store.open(d)
    ids: dict[str, list[str]] = {}
    for i in range(SESSIONS):
        sid = f"s{i}"
        for k in range(1 + i % 3):
            extra = {"summary": f"sum {i}"} if (i + k) % 5 == 0 else {}
            ids.setdefault(sid, []).append(write(store, sid, f"message {k} of {sid}", **extra)["message"]["message_id"])
    assert store.write_snapshot()
    store.close()
    return d, ids


def _replayed(d: str, tmp_path) -> dict[str, tuple]:
    """The sessions a replay of the log builds (the snapshot set aside)."""
    other = replay_copy(d, str(tmp_path / "replayed"))
    store = Store.open(other)
    try:
        assert store.scan_result.records and not store.sessions.pending   # replayed, not loaded
        return {sid: _fields(s) for sid, s in store.sessions.items()}
    finally:
        store.close()


def test_a_lookup_makes_one_session_and_a_walk_makes_them_all(tmp_path):
    d, ids = _stored(tmp_path)
    store = Store.open(d)
    try:
        sessions = store.sessions
        assert isinstance(sessions, SessionMap) and sessions.pending and store.loading_later
        assert dict.__len__(sessions) == 0 and len(sessions) == SESSIONS
        assert "s5" in sessions and "nope" not in sessions and dict.__len__(sessions) == 0   # `in` makes none
        assert sessions["s5"].sid == "s5" and sessions.get("s7").sid == "s7" and dict.__len__(sessions) == 2
        assert sessions.get("nope") is None and sessions.get("nope", 3) == 3
        with pytest.raises(KeyError):
            sessions["nope"]
        assert len(list(sessions.items())) == SESSIONS and not sessions.pending
        assert {sid: _fields(s) for sid, s in sessions.items()} == _replayed(d, tmp_path)
    finally:
        store.close()


def test_idle_steps_stop_at_their_deadline_and_what_changes_meanwhile_stands(tmp_path):
    d, ids = _stored(tmp_path)
    store = Store.open(d)
    try:
        store.load_later_step(time.monotonic() - 1)   # a deadline already past: one slice
        made = dict.__len__(store.sessions)
        assert 0 < made < SESSIONS and store.sessions.pending
        pending = store.sessions.pending_sids()
        grown, emptied = pending[0], pending[1]
        write(store, grown, "a new message of a session not made yet")
        for mid in ids[emptied]:
            delete(store, mid)
        write(store, "brand-new", "a session of its own")
        assert emptied not in store.sessions and len(store.sessions) == SESSIONS
        while store.loading_later:
            store.load_later_step(time.monotonic() + 0.001, lambda: False)
        assert not store.sessions.pending and not store.session_keys.pending and not store.touches.pending
        assert len(store.sessions[grown].seqs) == len(ids[grown]) + 1
        assert emptied not in store.sessions and store.session_keys.get(handles.session_digest(emptied)) is None
        assert store.session_keys.get(handles.session_digest(grown)) == grown
        assert store.session_keys.get(handles.session_digest("brand-new")) == "brand-new"
        got = {sid: _fields(s) for sid, s in store.sessions.items()}
        store.close()
        store = Store.open(d)   # the same as the state a start finds now (the log replayed after the snapshot)
        assert {sid: _fields(s) for sid, s in store.sessions.items()} == got
    finally:
        store.close()


def test_a_history_id_lookup_finishes_the_digests_first(tmp_path):
    d, _ = _stored(tmp_path)
    store = Store.open(d)
    try:
        assert store.session_keys.pending and dict.__len__(store.session_keys) == 0
        digest = handles.session_digest(f"s{SESSIONS - 1}")
        assert store.session_keys.get(digest) == f"s{SESSIONS - 1}" and not store.session_keys.pending
        assert dict.__len__(store.session_keys) == SESSIONS
    finally:
        store.close()


def test_health_during_the_load_makes_a_sample_and_estimates_from_it(tmp_path):
    from storaged.indexes import HEALTH_SAMPLE

    d, _ = _stored(tmp_path)
    exact_store = Store.open(d)
    exact_store.sessions.load_step(None)
    exact = exact_store.health()["memory_estimate"]["history_index_bytes"]
    exact_store.close()
    store = Store.open(d)
    try:
        store.sessions["s1"]
        health = store.health()
        assert health["session_count"] == SESSIONS and dict.__len__(store.sessions) <= HEALTH_SAMPLE + 1
        got = health["memory_estimate"]["history_index_bytes"]
        assert 0.5 * exact < got < 2 * exact, (got, exact)
        store.sessions.load_step(None)   # once all are made, the figure is the exact one (not the estimate kept)
        assert store.health()["memory_estimate"]["history_index_bytes"] == exact
    finally:
        store.close()


def test_the_map_s_other_methods():
    made = []

    def make(sid: str, g: int) -> Session:
        made.append(sid)
        s = Session(sid)
        s.min_ts = g
        return s

    m = SessionMap({"a": 0, "b": 1, "c": 2}, make)
    assert m.pop("a").min_ts == 0 and "a" not in m and len(m) == 2
    del m["b"]                      # a pending one goes without being made
    assert made == ["a"] and len(m) == 1
    m["d"] = Session("d")
    assert m.setdefault("d", None).sid == "d" and sorted(m) == ["c", "d"] and made == ["a", "c"]
    assert m == {"c": m["c"], "d": m["d"]} and m.copy() == dict(m)
    other = SessionMap({"x": 5, "y": 6}, make)
    assert list(reversed(other)) == ["y", "x"] or list(reversed(other)) == ["x", "y"]
    assert not other.pending and (other != {}) and (SessionMap({"z": 1}, make) | {}).keys() == {"z"}
    merged = SessionMap({"p": 1}, make)
    merged |= {"q": Session("q")}
    assert sorted(merged) == ["p", "q"] and not merged.pending
    assert m.pop("zz", 5) == 5
    keys = SessionKeys()
    keys.later(["x", "y"], lambda sid: sid == "x")
    assert keys.pending and keys.get(handles.session_digest("y")) is None and not keys.pending
    assert keys.get(handles.session_digest("x")) == "x"


def test_a_loop_never_idle_still_makes_them(tmp_path, monkeypatch):
    """The request loop makes what a start left in its idle moments; one that has none (a load that
    never lets it idle) makes it in a slice after a batch once LATER_STARVED_S passed without an idle
    step — and never in the slice right after an idle step."""
    from storaged import server as server_mod
    from storaged.server import Server

    d, _ = _stored(tmp_path)
    store = Store.open(d)
    store.index_step(None)   # (the index's queue comes first after a batch)
    server = Server(store, "inproc://convmem-later-starved")
    try:
        clock = [1000.0]

        def tick() -> float:   # each look at the clock is 3 ms later (a slice of 5 ms: a few steps)
            clock[0] += 0.003
            return clock[0]

        monkeypatch.setattr(server_mod.time, "monotonic", tick)
        server._later_at = clock[0]
        server._busy_work()                          # an idle step just ran: nothing made after a batch
        assert dict.__len__(store.sessions) == 0
        clock[0] += server_mod.LATER_STARVED_S + 0.01
        server._busy_work()                          # starved: one slice, a few steps
        made = dict.__len__(store.sessions)
        assert 0 < made < SESSIONS
        server._busy_work()                          # and not again until starved again
        assert dict.__len__(store.sessions) == made
        write(store, "s-busy", "a write queues its own message for the index, every batch")
        before = dict.__len__(store.sessions)
        clock[0] += server_mod.LATER_STARVED_S + 0.01
        server._busy_work()                          # the index step first, the starved slice after it
        assert not store.unindexed and dict.__len__(store.sessions) > before
        while store.loading_later:
            clock[0] += server_mod.LATER_STARVED_S + 0.01
            server._busy_work()
        assert len(store.sessions) == SESSIONS + 1 and not store.session_keys.pending
    finally:
        server.close()
        store.close()
