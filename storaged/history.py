"""The history interface's read side: search_sessions, open, list_sessions, file_attention,
get_ingest_status, computed from the same store the memory tools read.

The model: every message is an event of its session; a ``user_input`` event starts a turn and the
events up to the next one belong to it (events before a session's first user input form a turn of
their own, whose user input is null). Turns are therefore not stored but derived from each
session's sorted event sequence and the sorted sequence numbers of its user inputs
(``Session.turn_seqs``): finding an event's turn is a bisection, never a scan of the session.

Every reply is ``{"status": "OK", "request": <canonical request>, "data": ..., "warnings": [...]}``;
the front-end wraps it in the envelope (schema version, tool, elapsed time). Pages are bounded by
their limit and by ``PAGE_BUDGET_BYTES``; an event opens whole. Reads change no stored state: what
is kept between calls is ``HistoryViews``' cache of session orderings, rebuilt when the store's
``sessions_version`` says they moved (and the tokenizer's term caches a search fills).
"""
from __future__ import annotations

import bisect
import json
import os
from typing import Any, Callable

from protocol import history as H
from protocol import requests as R
from protocol.errors import ProtocolError
from protocol.history import HistoryError, iso_ms

from . import cursor, handles
from .model import Message
from .rank import ranked_search
from .snippet import compact, snippet
from .store import Store
from .views import session_neighbours

CONTENT_FIELD = (0,)   # search_sessions matches event text only (a hit's snippet must be able to show the match)
ACTION_PREVIEW_CHARS = 160
_MODEL_LOOKBACK = 64
_TERMINAL_LOOKBACK = 64   # trailing system notes looked past to find a turn's terminal event


def _coverage(store: Store) -> tuple[dict[str, Any], list[str]]:
    state, reason, at = store.ingest.coverage()
    named = {"true": "complete", "false": "partial", "unknown": "unknown"}[state]
    warnings = []
    if named == "partial":
        warnings.append("coverage_partial: historical ingestion is still in progress; a missing result is not "
                        "proof that an event never happened")
    elif named == "unknown":
        warnings.append("coverage_unknown: ingestion progress is unknown (no ingester has reported since the daemon "
                        "started); a missing result is not proof that an event never happened")
    return {"state": named, "reason": reason, "observed_at_unix_ms": at}, warnings


class _EventIdDescending:
    """A hit's last tie-break key (for ``nlargest``, which wants the smallest event id first): the event
    id as agents see it, sorting backwards. The id is an HMAC of the message id, so it is made only when
    two hits tie on score and time and the key is compared at all: ranking asks a key of every
    candidate (~50 a query), and making each id cost ~17% of a search_sessions call."""

    __slots__ = ("key", "message_id", "_eid")

    def __init__(self, key: bytes, message_id: str) -> None:
        self.key, self.message_id, self._eid = key, message_id, None

    @property
    def eid(self) -> str:
        if self._eid is None:
            self._eid = handles.event_id(self.key, self.message_id)
        return self._eid

    def __lt__(self, other: "_EventIdDescending") -> bool:
        return other.eid < self.eid

    def __gt__(self, other: "_EventIdDescending") -> bool:
        return other.eid > self.eid

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _EventIdDescending) and other.eid == self.eid


def _ok(request: dict[str, Any], data: dict[str, Any], warnings: list[str] | None = None) -> dict[str, Any]:
    return {"status": "OK", "request": request, "data": data, "warnings": warnings or []}


def _json_len(obj: Any) -> int:
    return len(json.dumps(obj, ensure_ascii=False, separators=(",", ":")))


class HistoryViews:
    """The five tools over one store. Holds only caches derived from the store."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._order_version = -1
        self._by_start: list[tuple[int, str]] = []     # (started_at, session id), ascending
        self._by_update: list[tuple[int, str]] = []    # (updated_at, session id), ascending

    @property
    def key(self) -> bytes:
        return self.store.cursor_key

    # ================================================================ shared pieces
    def _orders(self) -> None:
        if self._order_version != self.store.sessions_version:
            sessions = self.store.sessions
            self._by_start = sorted((s.min_ts, sid) for sid, s in sessions.items())
            self._by_update = sorted((s.max_ts, sid) for sid, s in sessions.items())
            self._order_version = self.store.sessions_version

    def meta(self, sid: str) -> dict[str, Any]:
        return self.store.session_meta.get(sid) or {}

    # harness, source and mode: the metadata's hot fields, read without unpacking it (a listing's filter
    # asks them of every session)
    def harness(self, sid: str) -> str:
        return self.store.session_meta.field(sid, "harness") or H.HARNESS_CONVMEM

    def source(self, sid: str) -> str:
        return self.store.session_meta.field(sid, "source") or H.SOURCE_MEMORY

    def mode(self, sid: str) -> str:
        explicit = self.store.session_meta.field(sid, "mode")
        if explicit:
            return explicit
        s = self.store.sessions[sid]
        if not s.tool_calls:
            return "chat"
        return "web_search" if s.web_calls == s.tool_calls else "tool_calling"

    def turn_count(self, sid: str) -> int:
        s = self.store.sessions[sid]
        return len(s.turn_seqs) + (1 if self._has_preamble(s) else 0)

    @staticmethod
    def _has_preamble(s) -> bool:
        return bool(s.seqs) and (not s.turn_seqs or s.seqs[0] < s.turn_seqs[0])

    def title(self, sid: str) -> str | None:
        """An explicit title; a session written through the memory tools is named by its session_id."""
        title = self.meta(sid).get("title")
        if title is None and self.harness(sid) == H.HARNESS_CONVMEM:
            return sid
        return title

    def display_label(self, sid: str) -> str:
        """An explicit title or name; else the first Codex user message (first line, 120 characters);
        else the summary/slug a transcript carried; else a descriptor made of metadata only."""
        meta = self.meta(sid)
        title = self.title(sid)
        if title:
            return title
        prompt = meta.get("first_prompt")
        if prompt and self.harness(sid) == H.HARNESS_CODEX:
            line = prompt.strip().split("\n", 1)[0].strip()
            if line:
                return line if len(line) <= H.LABEL_PREVIEW_CHARS else line[:H.LABEL_PREVIEW_CHARS] + "…"
        for key in ("summary", "slug"):
            if meta.get(key):
                text, _ = compact(meta[key], H.LABEL_PREVIEW_CHARS)
                return text
        s = self.store.sessions[sid]
        n = self.turn_count(sid)
        return (f"{self.harness(sid)} {self.mode(sid)} session, updated {iso_ms(s.max_ts)[:16].replace('T', ' ')} "
                f"UTC, {n} turn{'s' if n != 1 else ''}")

    def session_ref(self, sid: str, full: bool = False) -> dict[str, Any]:
        s = self.store.sessions[sid]
        meta = self.meta(sid)
        out: dict[str, Any] = {
            "id": handles.session_id(self.key, sid),
            "title": self.title(sid),
            "display_label": self.display_label(sid),
            "source": self.source(sid),
            "harness": self.harness(sid),
            "started_at": iso_ms(s.min_ts),
            "updated_at": iso_ms(s.max_ts),
            "completed": self._session_completed(s),
        }
        if full:
            out.update({
                "turn_count": self.turn_count(sid),
                "event_count": len(s.seqs),
                "mode": self.mode(sid),
                "session_slug": meta.get("slug"),
                "session_summary": meta.get("summary"),
                "memory_session_id": sid,  # the session_id of the memory tools (read_messages history)
            })
        return out

    def _session_completed(self, s) -> bool:
        """Whether the session's latest turn reached a terminal event."""
        _index, start, end = self._turn_at(s, len(s.turn_seqs) - 1)
        return self._turn_facts(s, start, end)["completed"]

    # ---------------------------------------------------------------- turns
    def _place(self, m: Message) -> tuple[Any, int, int, int, int, dict[str, Any]]:
        """Where an event stands: (its session, turn index, the turn's start and end in session.seqs,
        its own index there, the turn's terminal facts)."""
        s = self.store.sessions[m.session_id]
        index, start, end = self.turn_of(m)
        return s, index, start, end, bisect.bisect_left(s.seqs, m.seq), self._turn_facts(s, start, end)

    def turn_of(self, msg: Message) -> tuple[int, int, int]:
        """(turn index 0-based, first index in session.seqs, end index) of the turn holding ``msg``."""
        s = self.store.sessions[msg.session_id]
        return self._turn_at(s, bisect.bisect_right(s.turn_seqs, msg.seq) - 1)

    def _turn_at(self, s, t: int) -> tuple[int, int, int]:
        """Turn whose start is turn_seqs[t] (t == -1: the preamble) as (index, start, end)."""
        pre = 1 if self._has_preamble(s) else 0
        start = 0 if t < 0 else bisect.bisect_left(s.seqs, s.turn_seqs[t])
        end = bisect.bisect_left(s.seqs, s.turn_seqs[t + 1]) if t + 1 < len(s.turn_seqs) else len(s.seqs)
        return t + pre, start, end

    def _turn_by_index(self, s, index: int) -> tuple[int, int, int] | None:
        pre = 1 if self._has_preamble(s) else 0
        t = index - pre
        if index < 0 or t >= len(s.turn_seqs):
            return None
        return self._turn_at(s, t)

    def turn_id(self, s, start: int) -> str:
        table, first = self.store.table, s.seqs[start]
        anchor = table.message_id(first) if table.etype_of(first) == H.USER_INPUT else None
        return handles.turn_id(self.key, anchor, s.sid)

    def _turn_facts(self, s, start: int, end: int) -> dict[str, Any]:
        """Whether the turn ended, at which event, and its final response. The terminal event is the
        last assistant response, unless the turn ended at an interrupt; system notes after it (a
        compaction marker) do not reopen the turn; anything else after it (a tool call) means the
        agent went on, so the turn is not known to be complete."""
        table = self.store.table  # the event types from the table: only a system note is read
        terminal = final = None
        i = end - 1
        while i >= start and end - i <= _TERMINAL_LOOKBACK:
            etype = table.etype_of(s.seqs[i])
            if etype == H.ASSISTANT_RESPONSE:
                terminal = final = i
            elif etype == H.SYSTEM:
                if not table.get(s.seqs[i]).content.startswith(H.INTERRUPT_MARKERS):
                    i -= 1
                    continue
                terminal = i
            break
        return {"completed": terminal is not None, "terminal": terminal, "final": final,
                "terminal_event_id": handles.event_id(self.key, table.message_id(s.seqs[terminal]))
                if terminal is not None else None}

    def _turn_summary(self, s, index: int, start: int, end: int, with_ids: bool = True) -> dict[str, Any]:
        by_seq = self.store.by_seq
        events = [by_seq[q] for q in s.seqs[start:end]]
        facts = self._turn_facts(s, start, end)
        first = events[0]
        tools: dict[str, None] = {}
        types: dict[str, None] = {}
        for e in events:
            types[e.etype] = None
            if e.tool is not None and e.etype == H.TOOL_CALL:
                tools[e.tool] = None
        user = self._compact_ref(first) if first.etype == H.USER_INPUT else None
        final = self._compact_ref(events[facts["final"] - start]) if facts["final"] is not None else None
        tid = self.turn_id(s, start)
        out = {
            "id": tid,
            "ordinal": index + 1,
            "completed": facts["completed"],
            "terminal_event_id": facts["terminal_event_id"],
            "event_count": end - start,
            "started_at": iso_ms(min(e.timestamp for e in events)),
            "updated_at": iso_ms(max(e.timestamp for e in events)),
            "user_input": user,
            "final_response": final,
            "tools_called": list(tools),
            "event_types": list(types),
        }
        if with_ids:
            out["open"] = {"turn_id": tid, "terminal_event_id": facts["terminal_event_id"]}
        return out

    def _compact_ref(self, m: Message) -> dict[str, Any]:
        text, cut = self.event_summary_text(m)
        return {"event_id": handles.event_id(self.key, m.message_id), "text": text, "truncated": cut}

    @staticmethod
    def event_summary_text(m: Message) -> tuple[str, bool]:
        if m.etype == H.TOOL_CALL and m.tool:
            text, cut = compact(m.content, H.COMPACT_CHARS - len(m.tool) - 1)
            return f"{m.tool} {text}", cut
        return compact(m.content, H.COMPACT_CHARS)

    def _model_of(self, m: Message) -> str | None:
        return m.ext[2] if m.ext is not None else None

    def _originating_model(self, s, idx: int, start: int) -> str | None:
        by_seq = self.store.by_seq
        for j in range(idx, max(start, idx - _MODEL_LOOKBACK) - 1, -1):
            model = self._model_of(by_seq[s.seqs[j]])
            if model:
                return model
        return None

    # ---------------------------------------------------------------- resolving ids
    def _session_of(self, token: str, field: str) -> str:
        digest = handles.decode(self.key, "session", token, field)
        sid = self.store.session_keys.get(digest)
        if sid is None or sid not in self.store.sessions:
            raise HistoryError(H.NOT_FOUND, "session not found (it has no live events)", {"kind": "session",
                                                                                       "field": field})
        return sid

    def _turn_of(self, token: str, field: str) -> tuple[str, int, int, int]:
        """(session id, turn index, start, end) of a turn id."""
        ref = handles.decode(self.key, "turn", token, field)
        store = self.store
        if ref[0] == "preamble":
            sid = store.session_keys.get(ref[1])
            s = store.sessions.get(sid) if sid is not None else None
            if s is None or not self._has_preamble(s):
                raise HistoryError(H.NOT_FOUND, "turn not found", {"kind": "turn", "field": field})
            index, start, end = self._turn_at(s, -1)
            return sid, index, start, end
        msg = store.by_id.get(ref[1])
        if msg is None or msg.etype != H.USER_INPUT:
            raise HistoryError(H.NOT_FOUND, "turn not found", {"kind": "turn", "field": field})
        s = store.sessions[msg.session_id]
        index, start, end = self.turn_of(msg)
        return s.sid, index, start, end

    def _event_of(self, token: str, field: str) -> Message:
        mid = handles.decode(self.key, "event", token, field)
        msg = self.store.by_id.get(mid)
        if msg is None:
            raise HistoryError(H.NOT_FOUND, "event not found", {"kind": "event", "field": field})
        return msg

    # ================================================================ search_sessions
    def search_sessions(self, a: R.SearchSessions) -> dict[str, Any]:
        req = a.echo
        store = self.store
        by_seq = store.by_seq
        types = frozenset(req["event_types"])
        harness, source = req["harness"], req["source"]
        sid_only: str | None = None
        lo = hi = None
        if a.within is not None:
            kind, token = a.within
            if kind == "session":
                sid_only = self._session_of(token, "within_id")
            else:
                sid_only, _index, start, end = self._turn_of(token, "within_id")
                s = store.sessions[sid_only]
                lo, hi = s.seqs[start], s.seqs[end - 1]
        meta_ok: dict[str, bool] = {}

        def session_ok(sid: str) -> bool:
            ok = meta_ok.get(sid)
            if ok is None:
                ok = meta_ok[sid] = ((harness is None or self.harness(sid) == harness)
                                     and (source is None or self.source(sid) == source))
            return ok

        table = store.table  # a candidate's fields read from its row, no Message built

        def accept(doc: int) -> bool:
            if table.etype_of(doc) not in types:
                return False
            sid = table.session_id(doc)
            if sid_only is not None and (sid != sid_only or (lo is not None and not lo <= doc <= hi)):
                return False
            return session_ok(sid)

        n = req["n_hits"]
        key = self.key

        def tiebreak(doc: int) -> tuple:   # newer first, then the smaller event id (as agents see it)
            return table.timestamp(doc), _EventIdDescending(key, table.message_id(doc))
        tiebreak.first = lambda docs: table.column("ts", docs)  # for many docs at once (SearchIndex._tied_first)

        # the same conversation-aware ranking as search_messages (storaged/rank.py): an event's score
        # takes in its neighbours' in the session's order; only events that match themselves are hits
        # the usual search (no scope, no harness or source): the event-type filter asked in C
        accept_docs = store.etype_filter(types) if sid_only is None and harness is None and source is None else None
        hits = ranked_search(store.search, req["query"], n + 1, accept, tiebreak, CONTENT_FIELD,
                             neighbours=session_neighbours(store), text_of=lambda d: by_seq[d].content, own_match=True,
                             accept_docs=accept_docs)
        truncated = len(hits) > n
        hits = hits[:n]   # already in the interface's order: score, then time, then event id
        top = hits[0].score if hits else 1.0
        results = []
        for rank, hit in enumerate(hits, 1):
            m = by_seq[hit.doc]
            s, index, start, end, idx, facts = self._place(m)
            eid = handles.event_id(self.key, m.message_id)
            tid = self.turn_id(s, start)
            text, cut = snippet(m.content, req["query"], H.SNIPPET_CHARS)
            event = {"id": eid, "type": m.etype, "timestamp": iso_ms(m.timestamp), "ordinal": idx - start + 1,
                     "terminal": idx == facts["terminal"]}
            if m.tool is not None:
                event["tool_name"] = m.tool
            session = self.session_ref(m.session_id)
            # a hit is a pointer: one name for the session (its title, else its display label)
            session["title"] = session.pop("display_label") if session["title"] is None else session["title"]
            session.pop("display_label", None)
            results.append({
                "rank": rank,
                # BM25 is unbounded; the interface wants 0..1, comparable within a response: share of the best
                "score": round(hit.score / top, 4),
                "id": eid,
                "event": event,
                "turn": {"id": tid, "ordinal": index + 1, "completed": facts["completed"], "event_count": end - start},
                "session": session,
                "snippet": {"text": text, "truncated": cut},
                "open": {"event_id": eid, "turn_id": tid, "session_id": handles.session_id(self.key, m.session_id)},
            })
        coverage, warnings = _coverage(store)
        data = {"result_count": len(results), "limit": n, "truncated": truncated, "results": results,
                "coverage": coverage}
        return _ok(req, data, warnings)

    # ================================================================ open
    def open(self, a: R.Open) -> dict[str, Any]:
        req = a.echo
        if a.cursor is not None:
            target, limit, after, epoch, served = self._open_cursor(a.cursor)
            kind, token = target.split(":", 1)
        else:
            kind, token = a.target
            target, limit, after, epoch, served = req["id"], a.limit, None, None, 0
        if kind == "event":
            data = self._open_event(self._event_of(token, "id"))
        elif kind == "turn":
            data = self._open_turn(token, limit, after, epoch, served, target)
        else:
            data = self._open_session(token, limit, after, epoch, served, target)
        coverage, warnings = _coverage(self.store)
        data["coverage"] = coverage
        return _ok(req, data, warnings)

    def _open_cursor(self, token: str) -> tuple[str, int, int, int, int]:
        try:
            pos = cursor.decode(self.key, token, "open", "")
            target, limit, after, epoch, served = pos
            if not (isinstance(target, str) and isinstance(limit, int) and isinstance(after, int)
                    and isinstance(epoch, int) and isinstance(served, int)):
                raise ValueError
        except (ProtocolError, ValueError, TypeError):
            raise HistoryError(H.INVALID_REQUEST, "cursor is not a next_cursor this store issued for open "
                                                  "(edited, truncated or from another tool); reopen the id "
                                                  "with a limit to start again", {"field": "cursor"}) from None
        return target, limit, after, epoch, served

    def _stale(self) -> HistoryError:
        return HistoryError(H.INVALID_REQUEST, "the session changed since this cursor was issued (events were "
                                               "deleted, updated or inserted before the end); reopen the id with "
                                               "a limit to page it again", {"field": "cursor", "reason": "stale_cursor"})

    def _page_cursor(self, target: str, limit: int, last_seq: int, epoch: int, served: int) -> str:
        return cursor.encode(self.key, "open", "", [target, limit, last_seq, epoch, served])

    def _open_event(self, m: Message) -> dict[str, Any]:
        store = self.store
        s, index, start, end, idx, facts = self._place(m)
        sid_handle = handles.session_id(self.key, s.sid)
        tid = self.turn_id(s, start)
        prev_turn = self._turn_by_index(s, index - 1)
        next_turn = self._turn_by_index(s, index + 1)
        by_seq = store.by_seq
        return {
            "kind": "event",
            "event": {
                "id": handles.event_id(self.key, m.message_id),
                "session_id": sid_handle,
                "turn_id": tid,
                "ordinal": idx - start + 1,
                "type": m.etype,
                "timestamp": iso_ms(m.timestamp),
                "terminal": idx == facts["terminal"],
                "model": self._model_of(m),
                "originating_model": self._originating_model(s, idx, start),
                "tool_name": m.tool,
                "tool_call_id": m.tool_call_id,
                "message_id": m.message_id,
                "role": m.role,
                "content_bytes": m.utf8_length(),
            },
            "content": self._content(m),
            "session": {"id": sid_handle, "title": self.title(s.sid),
                        "display_label": self.display_label(s.sid), "source": self.source(s.sid),
                        "harness": self.harness(s.sid)},
            "turn": {"id": tid, "ordinal": index + 1, "completed": facts["completed"]},
            "traversal": {
                "session_id": sid_handle,
                "turn_id": tid,
                # adjacent events within the turn (null at its ends); the turn ids cross to the next turn
                "previous_event_id": handles.event_id(self.key, by_seq[s.seqs[idx - 1]].message_id)
                if idx > start else None,
                "next_event_id": handles.event_id(self.key, by_seq[s.seqs[idx + 1]].message_id)
                if idx + 1 < end else None,
                "previous_turn_id": self.turn_id(s, prev_turn[1]) if prev_turn else None,
                "next_turn_id": self.turn_id(s, next_turn[1]) if next_turn else None,
            },
        }

    @staticmethod
    def _content(m: Message) -> dict[str, Any]:
        content = m.content  # one read of the log
        if m.etype == H.TOOL_CALL:
            try:
                arguments = json.loads(content)
            except ValueError:
                arguments = None
            name = m.tool or "tool"
            text = f"{name}({content})" if arguments is not None else f"{name}: {content}"
            return {"format": "tool_call", "tool_name": m.tool, "arguments": arguments, "text": text,
                    "truncated": False}
        if m.etype == H.TOOL_RESPONSE:
            is_error, exit_code = (m.ext[0], m.ext[1]) if m.ext is not None else (None, None)
            return {"format": "tool_response", "tool_name": m.tool, "is_error": is_error, "exit_code": exit_code,
                    "text": content, "truncated": False}
        if m.etype == H.REASONING:
            return {"format": "reasoning", "encrypted": content == H.ENCRYPTED_REASONING, "text": content,
                    "truncated": False}
        return {"format": "text", "text": content, "truncated": False}

    def _event_summary(self, s, idx: int, start: int, terminal: int | None) -> dict[str, Any]:
        m = self.store.by_seq[s.seqs[idx]]
        text, cut = self.event_summary_text(m)
        return {"id": handles.event_id(self.key, m.message_id), "ordinal": idx - start + 1, "type": m.etype,
                "timestamp": iso_ms(m.timestamp), "terminal": idx == terminal, "tool_name": m.tool,
                "model": self._model_of(m), "summary": text, "truncated": cut}

    def _open_turn(self, token: str, limit: int | None, after: int | None, epoch: int | None, served: int,
                   target: str) -> dict[str, Any]:
        sid, index, start, end = self._turn_of(token, "id" if after is None else "cursor")
        s = self.store.sessions[sid]
        if epoch is not None and epoch != s.epoch:
            raise self._stale()
        summary = self._turn_summary(s, index, start, end, with_ids=False)
        terminal = self._turn_facts(s, start, end)["terminal"]
        sid_handle = handles.session_id(self.key, sid)
        prev_turn = self._turn_by_index(s, index - 1)
        next_turn = self._turn_by_index(s, index + 1)
        by_seq = self.store.by_seq
        events: list[dict[str, Any]] = []
        next_cursor = None
        if limit is not None:
            i = start if after is None else bisect.bisect_right(s.seqs, after, start, end)
            used = 0
            while i < end and len(events) < limit:
                item = self._event_summary(s, i, start, terminal)
                size = _json_len(item)
                if events and used + size > H.PAGE_BUDGET_BYTES:
                    break
                events.append(item)
                used += size
                i += 1
            if i < end:
                next_cursor = self._page_cursor(target, limit, s.seqs[i - 1], s.epoch, served + len(events))
        return {
            "kind": "turn",
            "turn": {"id": summary["id"], "session_id": sid_handle, "ordinal": index + 1,
                     "completed": summary["completed"], "terminal_event_id": summary["terminal_event_id"],
                     "event_count": end - start, "started_at": summary["started_at"],
                     "updated_at": summary["updated_at"]},
            "session": {"id": sid_handle, "title": self.title(sid), "display_label": self.display_label(sid),
                        "source": self.source(sid), "harness": self.harness(sid)},
            "summary": {"user_input": summary["user_input"], "final_response": summary["final_response"],
                        "tools_called": summary["tools_called"], "event_types": summary["event_types"]},
            "events": events,
            "next_cursor": next_cursor,
            "traversal": {
                "session_id": sid_handle,
                "previous_turn_id": self.turn_id(s, prev_turn[1]) if prev_turn else None,
                "next_turn_id": self.turn_id(s, next_turn[1]) if next_turn else None,
                "first_event_id": handles.event_id(self.key, by_seq[s.seqs[start]].message_id),
                "last_event_id": handles.event_id(self.key, by_seq[s.seqs[end - 1]].message_id),
            },
        }

    def _open_session(self, token: str, limit: int | None, after: int | None, epoch: int | None, served: int,
                      target: str) -> dict[str, Any]:
        sid = self._session_of(token, "id" if after is None else "cursor")
        s = self.store.sessions[sid]
        if epoch is not None and epoch != s.epoch:
            raise self._stale()
        meta = self.meta(sid)
        session = self.session_ref(sid, full=True)
        session.update({"cwd": meta.get("cwd"), "branch": meta.get("branch"),
                        "parent_session_id": handles.session_id(self.key, meta["parent_session_id"])
                        if meta.get("parent_session_id") in self.store.sessions else None})
        n_turns = self.turn_count(sid)
        turns: list[dict[str, Any]] = []
        next_cursor = None
        if limit is not None:
            pre = 1 if self._has_preamble(s) else 0
            t = -pre if after is None else bisect.bisect_right(s.turn_seqs, after)  # turn_seqs index of next turn
            used = 0
            last_start_seq = None
            while t < len(s.turn_seqs) and len(turns) < limit:
                index, start, end = self._turn_at(s, t)
                item = self._turn_summary(s, index, start, end)
                size = _json_len(item)
                if turns and used + size > H.PAGE_BUDGET_BYTES:
                    break
                turns.append(item)
                used += size
                last_start_seq = s.seqs[start]
                t += 1
            if t < len(s.turn_seqs) and last_start_seq is not None:
                next_cursor = self._page_cursor(target, limit, last_start_seq, s.epoch, served + len(turns))
        self._orders()
        pos = bisect.bisect_left(self._by_start, (s.min_ts, sid))
        prev_sid = self._by_start[pos - 1][1] if pos > 0 else None
        next_sid = self._by_start[pos + 1][1] if pos + 1 < len(self._by_start) else None
        first = self._turn_by_index(s, 0)
        last = self._turn_by_index(s, n_turns - 1)
        return {
            "kind": "session",
            "session": session,
            "turns": turns,
            "next_cursor": next_cursor,
            "traversal": {
                "previous_session_id": handles.session_id(self.key, prev_sid) if prev_sid else None,
                "next_session_id": handles.session_id(self.key, next_sid) if next_sid else None,
                "first_turn_id": self.turn_id(s, first[1]) if first else None,
                "last_turn_id": self.turn_id(s, last[1]) if last else None,
            },
        }

    # ================================================================ list_sessions
    def list_sessions(self, a: R.ListSessions) -> dict[str, Any]:
        req = a.echo
        start_ms, end_ms = a.start, a.end
        desc = req["sort"] == "desc"
        # the window as instants: "09:00+09:00" and "00:00Z" are the same listing
        scope = json.dumps([start_ms, end_ms, req["mode"], req["harness"], req["source"], req["sort"]])
        self._orders()
        order = self._by_update
        sessions = self.store.sessions
        served = 0
        if req["cursor"] is not None:
            try:
                updated, sid, served = cursor.decode(self.key, req["cursor"], "list_sessions", scope)
                if not (isinstance(updated, int) and isinstance(sid, str) and isinstance(served, int)):
                    raise ValueError
            except (ProtocolError, ValueError, TypeError):
                raise HistoryError(H.INVALID_REQUEST, "cursor is not a next_cursor of this listing (it was issued "
                                                      "for other filters or sort, or edited); list again without "
                                                      "cursor", {"field": "cursor"}) from None
            i = bisect.bisect_left(order, (updated, sid)) - 1 if desc else bisect.bisect_right(order, (updated, sid))
        else:
            i = len(order) - 1 if desc else bisect.bisect_left(order, (start_ms, ""))
        lowest = bisect.bisect_left(order, (start_ms, ""))  # updated_at >= start from here on
        step = -1 if desc else 1
        out: list[dict[str, Any]] = []
        used = 0
        more = False
        last_key = None
        while lowest <= i < len(order):
            key = order[i]
            sid = key[1]
            s = sessions.get(sid)
            i += step
            if s is None or s.min_ts >= end_ms:
                continue
            if (req["mode"] is not None and self.mode(sid) != req["mode"]) or \
                    (req["harness"] is not None and self.harness(sid) != req["harness"]) or \
                    (req["source"] is not None and self.source(sid) != req["source"]):
                continue
            if len(out) >= req["limit"]:
                more = True
                break
            ref = self.session_ref(sid, full=True)
            item = {"rank": served + len(out) + 1, "id": ref["id"], "session": ref,
                    "open": {"session_id": ref["id"]}}
            size = _json_len(item)
            if out and used + size > H.PAGE_BUDGET_BYTES:
                more = True
                break
            out.append(item)
            used += size
            last_key = key
        next_cursor = None
        if more and last_key is not None:
            next_cursor = cursor.encode(self.key, "list_sessions", scope, [last_key[0], last_key[1], served + len(out)])
        coverage, warnings = _coverage(self.store)
        data = {"result_count": len(out), "limit": req["limit"], "truncated": more, "sessions": out,
                "next_cursor": next_cursor, "coverage": coverage}
        return _ok(req, data, warnings)

    # ================================================================ file_attention
    def file_attention(self, a: R.FileAttention) -> dict[str, Any]:
        req = a.echo
        launch = a.launch
        store = self.store
        tail = launch.tail or req["path"]
        absolute = bool(launch.tail_is_absolute) or (launch.tail is None and os.path.isabs(req["path"]))
        if not absolute:
            tail = os.path.normpath(tail)
            if tail.startswith("../") or tail == "..":
                raise HistoryError(H.INVALID_REQUEST, "path resolves outside the launch project; pass an absolute "
                                                      "path", {"field": "path"})
        project = launch.project
        if req["scope"] == "project" and not project:
            raise HistoryError(H.INVALID_REQUEST, "scope 'project' needs the launch directory's project identity "
                                                  "(a git repository or the launch directory), which could not be "
                                                  "established (over HTTP the client must declare its roots); pass "
                                                  "scope 'all'", {"field": "scope"})
        if req["scope"] == "project" and (absolute or (launch.path_project not in (None, project))):
            # the file lies in another project (or in none): its tail means a different file here
            return self._attention_reply(req, tail, absolute, launch, [], False, [
                "path_outside_launch_project: the path is not in the project this client was launched in, so "
                "no touch of it is in scope; pass scope 'all' to see every project's touches of it"])
        name = tail.rsplit("/", 1)[-1]
        tool = req["tool"].casefold() if req["tool"] is not None else None
        start, end = a.start, a.end
        touches: list[tuple[Message, tuple, str]] = []
        scanned = 0
        truncated_scan = False
        for seq in reversed(store.touches.candidates(name)):
            scanned += 1
            if scanned > H.ATTENTION_SCAN_MAX:
                truncated_scan = True
                break
            m = store.by_seq.get(seq)
            if m is None or m.ext is None:
                continue
            if start is not None and m.timestamp < start or end is not None and m.timestamp >= end:
                continue
            if tool is not None and (m.tool or "").casefold() != tool:
                continue
            sid = m.session_id
            if req["harness"] is not None and self.harness(sid) != req["harness"]:
                continue
            if req["source"] is not None and self.source(sid) != req["source"]:
                continue
            for f in m.ext[3]:
                path, root, ftail, fproject, op = f
                if req["mutations_only"] and op == "read":
                    continue
                if absolute:
                    if path != tail:
                        continue
                    kind = "exact_path"
                elif root is not None:
                    if ftail != tail:
                        continue
                    kind = "path_tail"
                else:
                    if not (path == tail or path.endswith("/" + tail)):
                        continue
                    kind = "path_suffix"
                if req["scope"] == "project":
                    owner = fproject if root is not None else self.meta(sid).get("project")
                    if owner != project:
                        continue
                touches.append((m, f, kind))
                break
        return self._attention_reply(req, tail, absolute, launch, touches, truncated_scan)

    def _attention_reply(self, req: dict[str, Any], tail: str, absolute: bool, launch: R.Launch,
                         touches: list[tuple[Message, tuple, str]], truncated_scan: bool,
                         extra_warnings: list[str] = ()) -> dict[str, Any]:
        key = self.key
        touches.sort(key=lambda t: (-t[0].timestamp, t[0].message_id))
        roots: dict[str, list[Any]] = {}
        unknown = 0
        sessions_seen: set[str] = set()
        for m, f, _kind in touches:
            sessions_seen.add(m.session_id)
            if f[1] is None:
                unknown += 1
            else:
                r = roots.setdefault(f[1], [0, set()])
                r[0] += 1
                r[1].add(m.session_id)
        bare = "/" not in tail
        distinct_roots = len(roots) + (1 if unknown else 0)
        summary = {
            "total_touches": len(touches),
            "distinct_sessions": len(sessions_seen),
            "distinct_roots": distinct_roots,
            "distinct_known_roots": len(roots),
            "unknown_root_touches": unknown,
            "first_touch": iso_ms(touches[-1][0].timestamp) if touches else None,
            "last_touch": iso_ms(touches[0][0].timestamp) if touches else None,
            "ambiguous": bare or distinct_roots > 1,
            "scan_truncated": truncated_scan,
        }
        limit = req["limit"]
        data: dict[str, Any] = {
            "path": req["path"],
            "tail": tail,
            "tail_is_absolute": absolute,
            "stripped_root": launch.stripped_root,
            "scope": req["scope"],
            "granularity": req["granularity"],
            "summary": summary,
            "roots": [{"root": r, "touch_count": v[0], "session_count": len(v[1])}
                      for r, v in sorted(roots.items(), key=lambda kv: (-kv[1][0], kv[0]))],
        }
        rows: list[dict[str, Any]] = []
        if req["granularity"] == "events":
            for m, f, kind in touches[:limit]:
                s = self.store.sessions[m.session_id]
                index, start, _end = self.turn_of(m)
                eid = handles.event_id(key, m.message_id)
                sid_handle = handles.session_id(key, m.session_id)
                tid = self.turn_id(s, start)
                preview, _ = compact(m.content, ACTION_PREVIEW_CHARS)
                rows.append({"rank": len(rows) + 1, "id": eid, "event": {
                    "id": eid, "session_id": sid_handle, "harness": self.harness(m.session_id),
                    "source": self.source(m.session_id), "timestamp": iso_ms(m.timestamp), "tool_name": m.tool,
                    "op": f[4], "phase": "request", "turn": index + 1, "match_kind": kind, "worktree_root": f[1],
                    "path": f[0], "action_preview": preview},
                    "open": {"event_id": eid, "session_id": sid_handle, "turn_id": tid}})
            total_rows = len(touches)
            data["events"] = rows
        else:
            groups: dict[str, dict[str, Any]] = {}
            for m, f, _kind in touches:
                g = groups.get(m.session_id)
                if g is None:
                    g = groups[m.session_id] = {"latest": m, "first": m, "count": 0, "tools": {}, "ops": {},
                                                "roots": {}}
                g["count"] += 1
                g["first"] = m
                if m.tool:
                    g["tools"][m.tool] = None
                g["ops"][f[4]] = None
                g["roots"][f[1]] = None
            for sid, g in list(groups.items())[:limit]:
                latest = g["latest"]
                s = self.store.sessions[sid]
                _index, start, _end = self.turn_of(latest)
                sid_handle = handles.session_id(key, sid)
                rows.append({"rank": len(rows) + 1, "id": sid_handle, "session": {
                    "harness": self.harness(sid), "source": self.source(sid), "title": self.title(sid),
                    "display_label": self.display_label(sid), "touch_count": g["count"],
                    "tools": sorted(g["tools"]), "ops": sorted(g["ops"]),
                    "first_touch": iso_ms(g["first"].timestamp), "last_touch": iso_ms(latest.timestamp),
                    "worktree_roots": [r for r in g["roots"] if r is not None]},
                    "open": {"session_id": sid_handle, "event_id": handles.event_id(key, latest.message_id),
                             "turn_id": self.turn_id(s, start)}})
            total_rows = len(groups)
            data["sessions"] = rows
        data["result_count"] = len(rows)
        data["limit"] = limit
        data["truncated"] = total_rows > len(rows) or truncated_scan
        coverage, warnings = _coverage(self.store)
        warnings.extend(extra_warnings)
        data["coverage"] = coverage
        if bare:
            warnings.append("ambiguous_tail: a bare file name matches that name in every directory; pass a "
                            "project-relative path (e.g. src/app/main.py) to narrow it")
        if unknown:
            warnings.append(f"unknown_roots: {unknown} touch(es) have no provable worktree root (matched by path "
                            "suffix); they can make an otherwise single root ambiguous")
        return _ok(req, data, warnings)

    # ================================================================ get_ingest_status
    def get_ingest_status(self, a: R.GetIngestStatus, rebuilding: bool) -> dict[str, Any]:
        store = self.store
        data = store.ingest.status(store.last_error, rebuilding)
        return _ok(a.echo, data)


def handlers(views: HistoryViews, rebuilding: Callable[[], bool]) -> dict[str, Callable[[Any], dict]]:
    return {
        "search_sessions": views.search_sessions,
        "open": views.open,
        "list_sessions": views.list_sessions,
        "file_attention": views.file_attention,
        "get_ingest_status": lambda a: views.get_ingest_status(a, rebuilding()),
    }
