"""The read side: read_messages' four views, search_messages and the admin tool's export, as the
contract shapes them.

Nothing here changes stored state: no message, log record or counter. What a read may change is a
cache: the sessions view asks ``store.session_order`` for its ordering, which is rebuilt there after
sessions appeared, went or moved, and a search fills the tokenizer's term caches. Every list is
cut within the response budget; the first item of a page is always served, so paging can never
stall.
"""
from __future__ import annotations

import bisect
import re
from typing import Any

from protocol import limits as L
from protocol import requests as R
from protocol.errors import invalid

from . import cursor
from .model import Message
from .rank import ranked_search
from .store import Store, check_revision

_MESSAGE_OVERHEAD = 420  # the JSON keys and punctuation of a Message object with empty metadata


_CONTROL = re.compile("[\x00-\x1f]")


def text_json_bytes(s: str) -> int:
    """A close upper estimate of ``s`` as a JSON string (UTF-8, escapes) without encoding it twice."""
    n = len(s)
    if s.isascii():
        base = n
    else:
        base = len(s.encode("utf-8", "surrogatepass"))
    extra = s.count('"') + s.count("\\")
    if _CONTROL.search(s) is not None:
        # \b \f \n \r \t take two bytes; every other control character six (\u00XX)
        controls = len(_CONTROL.findall(s))
        short = s.count("\n") + s.count("\r") + s.count("\t") + s.count("\b") + s.count("\f")
        extra += short + 5 * (controls - short)
    return base + 2 + extra


def message_json_bytes(m: Message, content: str) -> int:
    """The JSON size of ``m`` as a reply carries it; ``content``: its text, as the reply's dict holds it
    (the text is read from the log once per message, for both)."""
    n = _MESSAGE_OVERHEAD + text_json_bytes(content) + len(m.session_id.encode("utf-8")) * 2
    if m.summary is not None:
        n += text_json_bytes(m.summary)
    if m.tool_call_id is not None:
        n += text_json_bytes(m.tool_call_id)
    n += sum(text_json_bytes(t) + 1 for t in m.tags)
    n += len(m.relations) * 64 + len(m.source_ids) * 29
    return n


def read_messages(store: Store, a: R.ReadMessages) -> dict[str, Any]:
    return _VIEWS[type(a)](store, a)


# -- history --------------------------------------------------------------------------------------
def history(store: Store, a: R.ReadHistory) -> dict[str, Any]:
    sid = a.session_id
    after = 0
    if a.cursor is not None:
        (after,) = _position(cursor.decode(store.cursor_key, a.cursor, "history", sid), 1)
    session = store.sessions.get(sid)
    seqs = session.seqs if session is not None else []
    i = bisect.bisect_right(seqs, after)
    out: list[dict[str, Any]] = []
    used = 0
    while i < len(seqs) and len(out) < a.limit:
        msg = store.by_seq[seqs[i]]
        d = msg.to_dict()
        size = message_json_bytes(msg, d["content"])
        if out and used + size > L.RESPONSE_BUDGET_BYTES:
            break
        out.append(d)
        used += size
        i += 1
    reply: dict[str, Any] = {"history": out}
    if i < len(seqs):
        reply["nextCursor"] = cursor.encode(store.cursor_key, "history", sid, [seqs[i - 1]])
    return reply


def _position(pos: Any, n: int) -> list[Any]:
    if not isinstance(pos, list) or len(pos) != n:
        raise invalid("cursor is malformed")
    return pos


# -- content --------------------------------------------------------------------------------------
def content(store: Store, a: R.ReadContent) -> dict[str, Any]:
    msg = store.live(a.message_id)
    check_revision(msg, a.expected_revision)
    data = msg.utf8()
    total = len(data)
    off = a.content_offset
    if off > total:
        raise invalid("content_offset must not be beyond the end of the content (total_bytes)")
    if off < total and (data[off] & 0xC0) == 0x80:
        raise invalid("content_offset must be on a UTF-8 code point boundary")
    end = min(off + a.content_limit, total)
    if end < total:
        cut = end
        while cut > off and (data[cut] & 0xC0) == 0x80:
            cut -= 1
        if cut == off:  # the limit is smaller than the next code point: return that whole character
            cut = off + 1
            while cut < total and (data[cut] & 0xC0) == 0x80:
                cut += 1
        end = cut
    return {"content_range": {
        "message_id": msg.message_id,
        "revision": msg.revision,
        "total_bytes": total,
        "content_offset": off,
        "next_content_offset": end,
        "complete": end == total,
        "content": data[off:end].decode("utf-8"),
    }}


# -- context --------------------------------------------------------------------------------------
def context(store: Store, a: R.ReadContext) -> dict[str, Any]:
    msg = store.live(a.message_id)
    session = store.sessions[msg.session_id]
    idx = bisect.bisect_left(session.seqs, msg.seq)
    before_seqs = session.seqs[max(0, idx - a.before):idx]
    after_seqs = session.seqs[idx + 1: idx + 1 + a.after]
    budget = _Budget()
    truncated = False
    reply_msg = msg.to_dict()
    budget.take(message_json_bytes(msg, reply_msg["content"]))
    chrono: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
    for side, seqs in (("before", before_seqs), ("after", after_seqs)):
        for seq in seqs:
            m = store.by_seq[seq]
            d = m.to_dict()
            if not budget.take(message_json_bytes(m, d["content"])):
                truncated = True
                break
            chrono[side].append(d)
    relations: list[dict[str, Any]] = []
    if not truncated:
        truncated = _traverse(store, msg, a.relation_depth, frozenset(a.relation_types), budget, relations)
    return {
        "message": reply_msg,
        "chronological_context": chrono,
        "relations": relations,
        "session": {"session_id": msg.session_id, "message_count": len(session.seqs)},
        "truncated": truncated,
    }


class _Budget:
    """Counts message-equivalents (at most 50) and bytes (at most the response budget)."""

    def __init__(self) -> None:
        self.count = 0
        self.bytes = 0

    def take(self, size: int) -> bool:
        if self.count + 1 > L.CONTEXT_MESSAGE_CAP or self.bytes + size > L.RESPONSE_BUDGET_BYTES:
            return False
        self.count += 1
        self.bytes += size
        return True


def _edges(store: Store, node: Message, types: frozenset[str]):
    for rtype, target in node.relations:
        if rtype in types:
            yield rtype, target, "outgoing"
    for rtype, source in store.relations.incoming_of(node.message_id):
        if rtype in types:
            yield rtype, source, "incoming"


def _traverse(store: Store, root: Message, depth_max: int, types: frozenset[str], budget: _Budget,
              out: list[dict[str, Any]]) -> bool:
    """Breadth-first over relations in both directions; each message appears once. True if cut short."""
    seen = {root.message_id}
    frontier = [root]
    for depth in range(1, depth_max + 1):
        nxt: list[Message] = []
        for node in frontier:
            for rtype, other_id, direction in list(_edges(store, node, types)):
                if other_id in seen:
                    continue
                other = store.by_id.get(other_id)
                entry: dict[str, Any] = {"type": rtype, "direction": direction, "depth": depth}
                if other is None:
                    size = 120
                else:
                    other_dict = other.to_dict()
                    size = message_json_bytes(other, other_dict["content"]) + 60
                if not budget.take(size):
                    return True
                seen.add(other_id)
                if other is None:
                    entry["message_id"] = other_id
                    entry["status"] = "deleted"
                else:
                    entry["message"] = other_dict
                    nxt.append(other)
                out.append(entry)
        frontier = nxt
    return False


# -- sessions -------------------------------------------------------------------------------------
def session_summary(store: Store, sid: str) -> dict[str, Any]:
    s = store.sessions[sid]
    last = store.by_seq[s.seqs[-1]]
    rep = store.by_seq[s.summary_seqs[-1]].summary if s.summary_seqs else last.content
    return {
        "session_id": sid,
        "message_count": len(s.seqs),
        "kind_counts": dict(zip(L.MEMORY_KINDS, s.kind_counts)),
        "representative_summary": rep,
        "started_at": s.min_ts,
        "last_message_at": s.max_ts,
    }


def sessions(store: Store, a: R.ReadSessions) -> dict[str, Any]:
    """Sessions by (started_at, session_id), ascending or descending, optionally only those active in
    [since, until): a session is in the window if it has a message at or after ``since`` and started
    before ``until``. started_at and last_message_at are the earliest and latest timestamps of the
    session's live messages, whatever order they were stored in. The cursor is bound to the window and
    order it was issued for, and a session whose start moved while the pages were read is never
    served twice (``storaged/sessionorder.py``)."""
    journal = store.session_order
    order = journal.order(store.sessions)
    since, until, desc = a.since, a.until, a.order == "desc"
    scope = f"{since}|{until}|{a.order}"
    moved: dict[str, int] = {}
    nonce, clock = journal.nonce, journal.clock
    bound: tuple[int, str] | None = None
    if a.cursor is not None:
        pos = cursor.decode(store.cursor_key, a.cursor, "sessions", scope)
        started, sid, nonce, clock = _position(pos, 4)
        if not (isinstance(started, int) and isinstance(sid, str) and isinstance(nonce, str)
                and isinstance(clock, int)):
            raise invalid("cursor is malformed")
        bound = (started, sid)
        moved = journal.keys_then(nonce, clock) or {}
        i = bisect.bisect_left(order, bound) - 1 if desc else bisect.bisect_right(order, bound)
    else:
        i = len(order) - 1 if desc else 0
    step = -1 if desc else 1
    if until is not None and not desc:
        stop = bisect.bisect_left(order, (until, ""))  # sessions starting at/after until are out
    else:
        stop = len(order)
    if until is not None and desc:
        i = min(i, bisect.bisect_left(order, (until, "")) - 1)
    out: list[dict[str, Any]] = []
    used = 0
    last_key: tuple[int, str] | None = None
    more = False
    while 0 <= i < stop:
        key = order[i]
        s = store.sessions[key[1]]
        if since is not None and s.max_ts < since:
            i += step
            continue
        then = moved.get(key[1])
        if then is not None and bound is not None and ((then, key[1]) >= bound if desc else (then, key[1]) <= bound):
            i += step  # it moved here from the pages already served
            continue
        if len(out) >= a.limit:
            more = True
            break
        item = session_summary(store, key[1])
        size = 300 + text_json_bytes(item["representative_summary"]) + 2 * len(key[1].encode("utf-8"))
        if out and used + size > L.RESPONSE_BUDGET_BYTES:
            more = True
            break
        out.append(item)
        used += size
        last_key = key
        i += step
    reply: dict[str, Any] = {"sessions": out}
    if more and last_key is not None:
        reply["nextCursor"] = cursor.encode(store.cursor_key, "sessions", scope, [*last_key, nonce, clock])
    return reply


_VIEWS = {R.ReadHistory: history, R.ReadContent: content, R.ReadContext: context, R.ReadSessions: sessions}


# -- search ---------------------------------------------------------------------------------------
def _neighbours(store: Store, msg: Message, n: int) -> dict[str, list[dict[str, Any]]]:
    seqs = store.sessions[msg.session_id].seqs
    idx = bisect.bisect_left(seqs, msg.seq)
    return {
        "before": [store.by_seq[s].to_dict() for s in seqs[max(0, idx - n):idx]],
        "after": [store.by_seq[s].to_dict() for s in seqs[idx + 1: idx + 1 + n]],
    }


def session_neighbours(store: Store):
    """neighbours(seq, r) for storaged/rank.py: up to r live messages before and after in the
    message's session, nearest first (a bisect in Session.seqs, never a walk of the session)."""
    table, sessions = store.table, store.sessions

    def neighbours(seq: int, r: int) -> tuple[list[int], list[int]]:
        if not table.alive(seq):
            return [], []
        seqs = sessions[table.session_id(seq)].seqs
        i = bisect.bisect_left(seqs, seq)
        return seqs[max(0, i - r):i][::-1], seqs[i + 1:i + 1 + r]

    return neighbours


def _search_text(m: Message) -> str:
    content = m.content
    return content if m.summary is None else content + "\n" + m.summary


def search_messages(store: Store, a: R.SearchMessages) -> dict[str, Any]:
    by_seq = store.by_seq
    sid = a.session_id
    kinds = a.kinds
    tiers = a.tiers
    tags = a.tags
    min_imp = a.min_importance

    def accept(doc: int) -> bool:
        m = by_seq.get(doc)
        if m is None or (sid is not None and m.session_id != sid) or m.importance < min_imp:
            return False
        if kinds is not None and m.kind not in kinds:
            return False
        if tiers is not None and m.tier not in tiers:
            return False
        return not tags or all(t in m.tags for t in tags)

    importance = store.table.importance

    def tiebreak(doc: int) -> tuple[int, int]:
        return importance(doc), doc
    tiebreak.first = store.table.importances  # its first item for many docs at once (SearchIndex._tied_first)
    hits = ranked_search(store.search, a.query, a.limit, accept, tiebreak,
                         neighbours=session_neighbours(store), text_of=lambda d: _search_text(by_seq[d]))
    results: list[dict[str, Any]] = []
    used = 0
    for hit in hits:
        msg = by_seq[hit.doc]
        item = msg.to_dict()
        # the contract's three fields are the message's own score; "context" is what its session
        # neighbours added (storaged/rank.py).  matched_fields names exactly the parts that scored:
        # a message found only through its neighbours has matched_fields == ["context"].
        breakdown = {"content": round(hit.content, 6), "summary": round(hit.summary, 6), "tags": round(hit.tags, 6),
                     "context": round(hit.context, 6)}
        item["score"] = round(hit.score, 6)
        item["score_breakdown"] = breakdown
        item["matched_fields"] = [f for f in L.SEARCH_SCORE_PARTS if breakdown[f] > 0]
        item["relation_count"] = len(msg.relations) + len(store.relations.incoming_of(msg.message_id))
        size = message_json_bytes(msg, item["content"]) + 200
        if a.context_size > 0:
            preview = _neighbours(store, msg, a.context_size)
            item["context_preview"] = preview
            size += sum(message_json_bytes(store.by_id[d["message_id"]], d["content"])
                        for side in ("before", "after") for d in preview[side])
        if results and used + size > L.RESPONSE_BUDGET_BYTES:
            break
        results.append(item)
        used += size
    return {"results": results}


# -- export (the admin tool's full read) --------------------------------------------------------------
def export_messages(store: Store, a: R.ExportMessages) -> dict[str, Any]:
    """Messages after ``after_seq`` in creation order with every field; a session's metadata travels
    just before its first message, so a file written page by page can be imported line by line."""
    by_seq = store.by_seq
    out: list[dict[str, Any]] = []
    sessions: list[dict[str, Any]] = []
    used = 0
    if a.session_id is not None:
        s = store.sessions.get(a.session_id)
        seqs = s.seqs[bisect.bisect_right(s.seqs, a.after_seq):] if s is not None else []
        candidates = iter(seqs)
    else:
        candidates = iter(range(a.after_seq + 1, store.last_seq + 1))  # seqs rise; deleted ones are gaps
    last = a.after_seq
    for seq in candidates:
        m = by_seq.get(seq)
        last = seq
        if m is None:
            continue
        item = m.to_dict()
        event = m.event_fields()
        if event is not None:
            item["event"] = event
        size = message_json_bytes(m, item["content"]) + 200
        if out and used + size > L.RESPONSE_BUDGET_BYTES:
            last = out[-1]["_seq"]
            break
        if store.sessions[m.session_id].seqs[0] == seq:
            meta = store.session_meta.get(m.session_id)
            if meta:
                sessions.append({"session_id": m.session_id, **meta})
        item["_seq"] = seq
        out.append(item)
        used += size
        if len(out) >= a.limit:
            break
    more = bool(out) and (last < store.last_seq if a.session_id is None
                          else last < store.sessions[a.session_id].seqs[-1])
    for item in out:
        item.pop("_seq")
    return {"status": "OK", "messages": out, "sessions": sessions, "next_after": last if more else None}
