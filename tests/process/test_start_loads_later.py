"""A start from a snapshot leaves its sessions, their history ids and the file touches to the request
loop's idle slices (``Store.load_later_step``): a real daemon answers the history tools the same
before a restart, right after it (the first requests make what they need), and once its idle slices
have loaded the rest (the log says so) — and a write to a session not made yet stands."""
from __future__ import annotations

import signal

import pytest

from protocol import limits as L
from tests.process.test_deferred_segment_check import _wait_for
from tests.process.test_history_contract import call, ev, ok, put
from tests.support.daemon_proc import Daemon

pytestmark = pytest.mark.timeout(180)

SESSIONS = 1_300          # a few of the loop's slices (indexes.LOAD_STEP)
T0 = 1_780_000_000_000
LOADED = "the start's sessions, history ids and file touches are loaded"


def _events() -> tuple[list[dict], list[dict]]:
    msgs, metas = [], []
    for i in range(SESSIONS):
        sid = f"claude-code:later-{i}"
        t = T0 + i * 10_000
        msgs.append(ev(sid, "user_input", f"edit module {i}", t))
        msgs.append(ev(sid, "tool_call", '{"file_path": "x"}', t + 1000, tool_name="Edit",
                       files=[{"path": f"/repo/src/mod{i % 40}.py", "root": "/repo", "tail": f"src/mod{i % 40}.py",
                               "project": "/repo/.git", "op": "edit"}]))
        metas.append({"session_id": sid, "harness": "claude-code", "source": "claude", "project": "/repo/.git"})
    return msgs, metas


def _all_sessions(d: Daemon) -> list[dict]:
    rows, cursor = [], None
    while True:
        args = {"start_datetime": "2020-01-01T00:00:00Z", "end_datetime": "2100-01-01T00:00:00Z", "limit": 100}
        if cursor:
            args["cursor"] = cursor
        data = ok(call(d, "list_sessions", args))
        rows += data["sessions"]
        cursor = data.get("next_cursor")
        if not cursor:
            return rows


def _state(d: Daemon, session_id: str) -> tuple:
    opened = ok(call(d, "open", {"id": session_id}))
    touched = ok(call(d, "file_attention", {"path": "/repo/src/mod7.py", "scope": "all"}))
    for data in (opened, touched):
        data.get("coverage", {}).pop("observed_at_unix_ms", None)   # (the time of the answer)
    return opened, touched, _all_sessions(d)


def test_the_history_tools_answer_the_same_before_and_after_the_idle_load(tmp_path):
    d = Daemon(tmp_path / "data")
    with d:
        d.start()
        msgs, metas = _events()
        for at in range(0, len(msgs), L.IMPORT_BATCH_MAX):
            put(d, msgs[at:at + L.IMPORT_BATCH_MAX], metas[at // 2:(at + L.IMPORT_BATCH_MAX) // 2])
        sessions = _all_sessions(d)
        assert len(sessions) == SESSIONS
        late, other = sessions[SESSIONS // 3]["id"], sessions[2 * SESSIONS // 3]["id"]
        before = _state(d, late)
        other_sid = ok(call(d, "open", {"id": other}))["session"]["memory_session_id"]
        assert before[1]["summary"]["total_touches"] == SESSIONS // 40 + (7 < SESSIONS % 40)
        d.terminate(signal.SIGTERM)   # a clean stop: the next start loads the snapshot

        d.start()   # the first requests make what they ask for (the open: one session and the ids)
        assert _state(d, late) == before
        d.terminate(signal.SIGTERM)

        d.start()
        _wait_for(d, LOADED)   # the idle slices made them all before any request
        assert _state(d, late) == before
        # a session not made before the stop gets a new event after the start: it stands
        i = int(other_sid.rsplit("-", 1)[1])
        put(d, [ev(other_sid, "assistant_response", "done", T0 + i * 10_000 + 5000)])
        after = ok(call(d, "open", {"id": other}))
        assert after["session"]["event_count"] == 3 and after["session"]["updated_at"].endswith("5.000Z"), after
        d.terminate(signal.SIGTERM)
