"""The read side: history paging and cursors, byte-range content, context and relations, sessions,
search filters, and the response budget."""
from __future__ import annotations

import base64
import json
import random

import pytest
from ulid import ULID

from tests.support.faultio import delete, live_state, read, search, update, write
from protocol import errors as E
from protocol import limits as L
from protocol.errors import ProtocolError
from storaged import compaction
from storaged.store import Store

pytestmark = pytest.mark.timeout(90)


def err(fn, *a, **kw) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        fn(*a, **kw)
    return info.value


def json_size(obj) -> int:
    return len(json.dumps(obj, ensure_ascii=False).encode("utf-8"))


def ids(items):
    return [m["message_id"] for m in items]


# ---------------------------------------------------------------------------------------- history
def page_through(store, sid, limit, between=lambda page_no, served: None):
    served, cur, n = [], None, 0
    while True:
        args = {"session_id": sid, "limit": limit}
        if cur:
            args["cursor"] = cur
        page = read(store, **args)
        assert len(page["history"]) <= limit
        served += ids(page["history"])
        cur = page.get("nextCursor")
        if not cur:
            return served
        assert len(page["history"]) == limit  # a page cut short only by the budget, not here
        n += 1
        between(n, served)


def test_history_order_and_limit(store):
    written = [write(store, "s", f"m{i}")["message"] for i in range(12)]
    write(store, "other", "not mine")
    assert read(store, session_id="s", limit=1000) == {"history": written}
    assert page_through(store, "s", 5) == ids(written)
    assert page_through(store, "s", 1) == ids(written)
    assert page_through(store, "s", 12) == ids(written)
    assert read(store, session_id="nobody") == {"history": []}


@pytest.mark.parametrize("seed", range(5))
def test_history_mutations_between_pages_never_skip_or_repeat(store, seed):
    rng = random.Random(seed)
    written = [write(store, "s", f"m{i}")["message"]["message_id"] for i in range(40)]
    deleted_unserved: set[str] = set()

    def between(page_no, served):
        live_unserved = [m for m in written if m not in served and m not in deleted_unserved and m in store.by_id]
        if live_unserved and rng.random() < 0.7:
            victim = rng.choice(live_unserved)
            delete(store, victim)
            deleted_unserved.add(victim)
        if served and rng.random() < 0.7:
            delete(store, rng.choice(served))  # deleting what was already served shifts nothing
        if rng.random() < 0.6:
            written.append(write(store, "s", f"new{page_no}")["message"]["message_id"])
        if rng.random() < 0.5:
            write(store, "elsewhere", "x")
        if rng.random() < 0.3:
            update(store, rng.choice([m for m in written if m in store.by_id]), content=f"edited{page_no}")

    served = page_through(store, "s", rng.randint(2, 6), between)
    assert len(served) == len(set(served))
    assert served == [m for m in written if m not in deleted_unserved]


def test_cursor_survives_restart_and_rebuild(store):
    written = [write(store, "s", f"m{i}")["message"]["message_id"] for i in range(10)]
    delete(store, written[0])
    first = read(store, session_id="s", limit=3)
    assert ids(first["history"]) == written[1:4]
    cur = first["nextCursor"]
    compaction.rebuild(store)
    assert ids(read(store, session_id="s", limit=3, cursor=cur)["history"]) == written[4:7]
    store.close()
    store = Store.open(store.dir)
    assert ids(read(store, session_id="s", limit=3, cursor=cur)["history"]) == written[4:7]
    store.close()


def test_bad_cursors_are_validation_errors(store, tmp_path):
    for i in range(5):
        write(store, "s", f"m{i}")
        write(store, f"t{i}", "x")
    good = read(store, session_id="s", limit=2)["nextCursor"]
    sess_cur = read(store, view="sessions", limit=2)["nextCursor"]
    other = Store.open(str(tmp_path / "other"))
    for i in range(5):
        write(other, "s", f"m{i}")
    foreign = read(other, session_id="s", limit=2)["nextCursor"]
    other.close()

    def flip(tok, i):
        alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
        c = tok[i]
        return tok[:i] + alphabet[(alphabet.index(c) + 1) % len(alphabet)] + tok[i + 1:]

    def raw(tok):
        return base64.urlsafe_b64decode(tok + "=" * (-len(tok) % 4))

    # every edit that changes the decoded bytes (the last character also carries unused padding bits)
    edits = [flip(good, i) for i in range(len(good)) if raw(flip(good, i)) != raw(good)]
    assert len(edits) >= len(good) - 1
    bad = edits + [good[:-1], good[:-4], good + "A", "!!!!", "A", foreign,
                                                        sess_cur, "x" * 200]
    for tok in bad:
        e = err(read, store, session_id="s", cursor=tok)
        assert e.code == E.VALIDATION_ERROR and "cursor" in e.message and tok not in e.message
    e = err(read, store, session_id="t1", cursor=good)  # another session's cursor
    assert e.code == E.VALIDATION_ERROR and "session" in e.message
    e = err(read, store, view="sessions", cursor=good)
    assert e.code == E.VALIDATION_ERROR
    assert ids(read(store, session_id="s", cursor=good)["history"])  # the real one still works


@pytest.fixture(scope="module")
def big_store(tmp_path_factory):
    """Ten messages of ~1 MiB each in one session, mixing ASCII and multibyte text."""
    s = Store.open(str(tmp_path_factory.mktemp("big")))
    unit = "needle 日本語 " * 8
    for i in range(10):
        if i % 2:
            body = (unit * (L.MiB // 10)).encode()[: L.MiB - 64].decode("utf-8", "ignore")
        else:
            body = "x" * (L.MiB - 64)
        write(s, "big", body + f" #{i}")
    yield s
    s.close()


def test_history_budget_cuts_the_page(big_store):
    pages, cur = [], None
    while True:
        args = {"session_id": "big", "limit": 100}
        if cur:
            args["cursor"] = cur
        page = read(big_store, **args)
        assert json_size(page) <= L.RESPONSE_BUDGET_BYTES
        pages.append(ids(page["history"]))
        cur = page.get("nextCursor")
        if not cur:
            break
    assert len(pages) >= 2 and all(pages)
    assert len(pages[0]) < 10
    assert sum(pages, []) == ids(read(big_store, session_id="big", limit=1)["history"]) + sum(pages, [])[1:]
    assert len(sum(pages, [])) == 10 == len(set(sum(pages, [])))


def test_history_budget_counts_json_escapes(store):
    # control characters become six bytes each in JSON (\u0001): the budget must count that
    for i in range(3):
        write(store, "esc", "\x01" * (700 * 1024) + f"{i}")
    cur, got = None, []
    while True:
        page = read(store, session_id="esc", **({"cursor": cur} if cur else {}))
        assert json_size(page) <= L.RESPONSE_BUDGET_BYTES
        got += ids(page["history"])
        cur = page.get("nextCursor")
        if not cur:
            break
    assert len(got) == 3


def test_first_item_is_always_served(store):
    m = write(store, "q", '"' * L.MiB)["message"]  # 2 MiB as JSON: alone over nothing, still served
    write(store, "q", "second")
    page = read(store, session_id="q", limit=5)
    assert ids(page["history"])[0] == m["message_id"]


# ---------------------------------------------------------------------------------------- content
TEXT = "aé日😀" * 50 + "tail"   # 1-, 2-, 3- and 4-byte characters


def content(store, mid, **kw):
    return read(store, view="content", message_id=mid, **kw)["content_range"]


def test_content_whole_and_ends(store):
    m = write(store, content=TEXT)["message"]
    data = TEXT.encode()
    r = content(store, m["message_id"], content_limit=65536)
    assert r == {"message_id": m["message_id"], "revision": 1, "total_bytes": len(data), "content_offset": 0,
                 "next_content_offset": len(data), "complete": True, "content": TEXT}
    end = content(store, m["message_id"], content_offset=len(data))
    assert end["content"] == "" and end["complete"] is True and end["next_content_offset"] == len(data)
    e = err(content, store, m["message_id"], content_offset=len(data) + 1)
    assert e.code == E.VALIDATION_ERROR and "content_offset" in e.message


def test_content_mid_codepoint_offsets_are_refused(store):
    m = write(store, content=TEXT)["message"]
    data = TEXT.encode()
    for off in range(len(data)):
        if (data[off] & 0xC0) == 0x80:
            e = err(content, store, m["message_id"], content_offset=off)
            assert e.code == E.VALIDATION_ERROR and "content_offset" in e.message
        else:
            assert content(store, m["message_id"], content_offset=off, content_limit=4)["content"]


@pytest.mark.parametrize("limit", [1, 2, 3, 4, 5, 6, 7, 9, 10, 13, 64, 4096, 65536])
def test_content_iteration_reassembles_exactly(store, limit):
    m = write(store, content=TEXT)["message"]
    data = TEXT.encode()
    off, parts, rev = 0, [], None
    for _ in range(len(data) + 2):
        args = {"content_offset": off, "content_limit": limit}
        if rev is not None:
            args["expected_revision"] = rev
        r = content(store, m["message_id"], **args)
        rev = r["revision"]
        chunk = r["content"].encode()
        assert r["content_offset"] == off and r["next_content_offset"] == off + len(chunk)
        assert r["total_bytes"] == len(data)
        if len(chunk) > limit:  # only when the limit is smaller than one code point
            assert len(r["content"]) == 1 and len(chunk) <= limit + 3
        elif not r["complete"]:
            # cut back to the last boundary within the limit: the next character would not fit
            nxt = data[off + len(chunk):].decode()[0].encode()
            assert len(chunk) + len(nxt) > limit
        parts.append(r["content"])
        off = r["next_content_offset"]
        if r["complete"]:
            break
    assert "".join(parts) == TEXT and off == len(data)


def test_content_limit_smaller_than_a_character(store):
    m = write(store, content="😀日é")["message"]
    r = content(store, m["message_id"], content_limit=1)
    assert r["content"] == "😀" and r["next_content_offset"] == 4 and not r["complete"]
    r = content(store, m["message_id"], content_offset=4, content_limit=2)
    assert r["content"] == "日" and r["next_content_offset"] == 7
    r = content(store, m["message_id"], content_offset=7, content_limit=1)
    assert r["content"] == "é" and r["complete"]
    r = content(store, m["message_id"], content_limit=5)
    assert r["content"] == "😀"  # cut back to the boundary, not 5 bytes
    r = content(store, m["message_id"], content_limit=7)
    assert r["content"] == "😀日"


def test_content_revision_conflict_not_found_and_no_io(store):
    m = write(store, content="v1 " * 100)["message"]
    update(store, m["message_id"], content="v2 " * 100)
    assert err(content, store, m["message_id"], expected_revision=1).code == E.CONFLICT
    assert content(store, m["message_id"], expected_revision=2)["content"].startswith("v2")
    health = store.health()
    for off in range(0, 300, 7):
        content(store, m["message_id"], content_offset=off, content_limit=5)
    assert store.health() == health
    assert err(content, store, str(ULID())).code == E.NOT_FOUND
    delete(store, m["message_id"])
    assert err(content, store, m["message_id"]).code == E.NOT_FOUND


def test_content_one_mib_in_max_chunks(store):
    body = ("日本語のテキスト😀" * 40000)
    body = body.encode()[: L.MiB].decode("utf-8", "ignore")
    m = write(store, content=body)["message"]
    off, parts = 0, []
    while True:
        r = content(store, m["message_id"], content_offset=off, content_limit=65536)
        assert len(r["content"].encode()) <= 65536
        parts.append(r["content"])
        off = r["next_content_offset"]
        if r["complete"]:
            break
    assert "".join(parts) == body
    assert -(-len(body.encode()) // 65536) <= len(parts) <= len(body.encode()) // (65536 - 3) + 1


# ---------------------------------------------------------------------------------------- context
def ctx(store, mid, **kw):
    return read(store, view="context", message_id=mid, **kw)


def test_context_chronological_neighbours(store):
    s = [write(store, "s", f"m{i}")["message"] for i in range(15)]
    write(store, "other", "o")
    for before in range(0, 11):
        for after in (0, 1, 10):
            r = ctx(store, s[7]["message_id"], before=before, after=after, relation_depth=0)
            assert r["message"] == s[7]
            assert r["chronological_context"]["before"] == s[max(0, 7 - before):7]
            assert r["chronological_context"]["after"] == s[8:8 + after]
            assert r["session"] == {"session_id": "s", "message_count": 15}
            assert r["relations"] == [] and r["truncated"] is False
    r = ctx(store, s[0]["message_id"])  # defaults 1 / 1 at the start of the session
    assert r["chronological_context"] == {"before": [], "after": [s[1]]}
    delete(store, s[1]["message_id"])
    r = ctx(store, s[0]["message_id"], after=2)
    assert r["chronological_context"]["after"] == [s[2], s[3]]
    assert r["session"]["message_count"] == 14


@pytest.fixture
def graph(store):
    """A <-derived_from- B <-depends_on- C <-related_to- D ; E -supersedes-> A ; B and F relate both ways."""
    def rel(t, m):
        return {"type": t, "message_id": m["message_id"]}
    A = write(store, "g", "A")["message"]
    B = write(store, "g", "B", relations=[rel("derived_from", A)])["message"]
    C = write(store, "h", "C", relations=[rel("depends_on", B)])["message"]
    D = write(store, "h", "D", relations=[rel("related_to", C)])["message"]
    E_ = write(store, "g", "E", relations=[rel("supersedes", A)])["message"]
    F = write(store, "g", "F", relations=[rel("related_to", B)])["message"]
    B = update(store, B["message_id"], relations=[rel("derived_from", A), rel("related_to", F)])["message"]
    return dict(A=A, B=B, C=C, D=D, E=E_, F=F)


def shape(relations):
    return sorted((r["type"], r["direction"], r["depth"], r.get("message", {}).get("content") or r["message_id"])
                  for r in relations)


def test_context_relation_depths_and_directions(store, graph):
    B = graph["B"]["message_id"]
    assert ctx(store, B, relation_depth=0)["relations"] == []
    assert shape(ctx(store, B, relation_depth=1)["relations"]) == sorted([
        ("derived_from", "outgoing", 1, "A"), ("depends_on", "incoming", 1, "C"), ("related_to", "outgoing", 1, "F")])
    r = ctx(store, B, relation_depth=2)
    assert shape(r["relations"]) == sorted([
        ("derived_from", "outgoing", 1, "A"), ("depends_on", "incoming", 1, "C"), ("related_to", "outgoing", 1, "F"),
        ("supersedes", "incoming", 2, "E"), ("related_to", "incoming", 2, "D")])
    # F relates to B too (incoming), but F is already shown: each message appears once
    assert len({x["message"]["message_id"] for x in r["relations"]}) == len(r["relations"])
    for x in r["relations"]:
        assert x["message"] == store.by_id[x["message"]["message_id"]].to_dict()
    assert r["truncated"] is False


def test_context_relation_type_filter(store, graph):
    B = graph["B"]["message_id"]
    r = ctx(store, B, relation_depth=2, relation_types_json='["depends_on"]')
    assert shape(r["relations"]) == [("depends_on", "incoming", 1, "C")]
    r = ctx(store, B, relation_depth=2, relation_types_json='["derived_from","supersedes"]')
    assert shape(r["relations"]) == sorted([("derived_from", "outgoing", 1, "A"), ("supersedes", "incoming", 2, "E")])
    assert ctx(store, B, relation_depth=2, relation_types_json="[]")["relations"] == []


def test_context_deleted_relation_target(store, graph):
    A, B = graph["A"]["message_id"], graph["B"]["message_id"]
    delete(store, A)
    r = ctx(store, B, relation_depth=2)
    deleted = [x for x in r["relations"] if "status" in x]
    assert deleted == [{"type": "derived_from", "direction": "outgoing", "depth": 1, "message_id": A,
                        "status": "deleted"}]
    # E's edge to A was from E's side: with A gone E is no longer reachable through A
    assert "E" not in [x.get("message", {}).get("content") for x in r["relations"]]
    # the deleted A is not itself traversed further, and after a restart the same shape comes back
    store.close()
    store2 = Store.open(store.dir)
    assert ctx(store2, B, relation_depth=2)["relations"] == r["relations"]
    store2.close()


@pytest.mark.parametrize("k,truncated", [(48, False), (49, False), (50, True), (80, True)])
def test_context_fifty_message_cap(store, k, truncated):
    root = write(store, "hub", "root")["message"]
    for i in range(k):
        write(store, "spokes", f"s{i}", relations=[{"type": "related_to", "message_id": root["message_id"]}])
    r = ctx(store, root["message_id"], before=0, after=0)
    assert len(r["relations"]) == min(k, L.CONTEXT_MESSAGE_CAP - 1)
    assert r["truncated"] is truncated


def test_context_cap_counts_neighbours(store):
    s = [write(store, "s", f"m{i}")["message"] for i in range(21)]
    for i in range(40):
        write(store, "spokes", f"r{i}", relations=[{"type": "depends_on", "message_id": s[10]["message_id"]}])
    r = ctx(store, s[10]["message_id"], before=10, after=10)
    assert len(r["chronological_context"]["before"]) == 10 and len(r["chronological_context"]["after"]) == 10
    assert len(r["relations"]) == 50 - 21 and r["truncated"] is True


def test_context_budget(big_store):
    hist = []
    cur = None
    while True:
        page = read(big_store, session_id="big", **({"cursor": cur} if cur else {}))
        hist += ids(page["history"])
        cur = page.get("nextCursor")
        if not cur:
            break
    last = hist[-1]
    r = ctx(big_store, last, before=10, after=0)
    assert r["truncated"] is True
    assert json_size(r) <= L.RESPONSE_BUDGET_BYTES
    assert 0 < len(r["chronological_context"]["before"]) < 9


# ---------------------------------------------------------------------------------------- sessions
def sessions_all(store, limit=100):
    out, cur = [], None
    while True:
        page = read(store, view="sessions", limit=limit, **({"cursor": cur} if cur else {}))
        out += page["sessions"]
        cur = page.get("nextCursor")
        if not cur:
            return out


def test_sessions_order_counts_and_summary(store):
    t = [1_700_000_000_000]
    store.clock._wall_ms = lambda: t[0]
    write(store, "zeta", "z1")                       # same started_at as alpha: ordered by id
    write(store, "alpha", "a1", memory_kind="semantic")
    t[0] += 1000
    write(store, "mid", "m1", summary="first summary")
    long_content = "long content 日本 " * 2000
    write(store, "alpha", long_content, memory_kind="semantic")
    t[0] += 1000
    write(store, "mid", "m2", summary="latest summary", memory_kind="summary")
    write(store, "mid", "m3")
    got = sessions_all(store)
    assert [s["session_id"] for s in got] == ["alpha", "zeta", "mid"]
    alpha, zeta, mid = got
    assert alpha["message_count"] == 2 and alpha["started_at"] == 1_700_000_000_000
    assert alpha["last_message_at"] == 1_700_000_001_000
    assert alpha["kind_counts"] == {"conversation": 0, "episode": 0, "semantic": 2, "procedure": 0, "preference": 0,
                                    "summary": 0}
    assert alpha["representative_summary"] == long_content  # no summary: the latest content, untruncated
    assert zeta["representative_summary"] == "z1"
    assert mid["representative_summary"] == "latest summary"
    assert mid["kind_counts"]["summary"] == 1 and mid["kind_counts"]["conversation"] == 2
    assert set(alpha) == {"session_id", "message_count", "kind_counts", "representative_summary", "started_at",
                          "last_message_at"}


def test_sessions_follow_deletes_and_updates(store):
    a1 = write(store, "a", "a1", summary="s1")["message"]
    a2 = write(store, "a", "a2", summary="s2")["message"]
    write(store, "b", "b1")
    assert sessions_all(store)[0]["representative_summary"] == "s2"
    delete(store, a2["message_id"])
    assert sessions_all(store)[0]["representative_summary"] == "s1"
    update(store, a1["message_id"], summary="")
    assert sessions_all(store)[0]["representative_summary"] == "a1"
    delete(store, a1["message_id"])
    assert [s["session_id"] for s in sessions_all(store)] == ["b"]


@pytest.mark.parametrize("seed", range(3))
def test_sessions_paging_is_stable(store, seed):
    rng = random.Random(seed)
    tick = iter(range(1_700_000_000_000, 1_800_000_000_000, 7))
    store.clock._wall_ms = lambda: next(tick)  # a new session always starts after those already served
    names = [f"sess{i:02d}" for i in range(15)]
    first_msg = {}
    for n in names:
        first_msg[n] = write(store, n, "x")["message"]["message_id"]
    served, cur, deleted_unserved, created = [], None, set(), []
    while True:
        page = read(store, view="sessions", limit=rng.randint(1, 4), **({"cursor": cur} if cur else {}))
        served += [s["session_id"] for s in page["sessions"]]
        cur = page.get("nextCursor")
        if not cur:
            break
        unserved = [n for n in names if n not in served and n not in deleted_unserved]
        if unserved and rng.random() < 0.5:
            victim = rng.choice(unserved)
            delete(store, first_msg[victim])
            deleted_unserved.add(victim)
        if rng.random() < 0.5:
            n = f"new{len(created)}"
            first_msg[n] = write(store, n, "y")["message"]["message_id"]
            created.append(n)
            names.append(n)
        if served and rng.random() < 0.5:
            write(store, rng.choice(served), "more")  # later messages do not move a session
    assert len(served) == len(set(served))
    assert served == [n for n in names if n not in deleted_unserved]


def test_sessions_limit(store):
    for i in range(5):
        write(store, f"s{i}", "x")
    page = read(store, view="sessions", limit=2)
    assert len(page["sessions"]) == 2 and page["nextCursor"]
    assert "nextCursor" not in read(store, view="sessions", limit=5)
    assert read(store, view="sessions", limit=1000)["sessions"] == sessions_all(store, limit=1)


# ---------------------------------------------------------------------------------------- search
def test_search_filters_and_no_state_change(store):
    a = write(store, "s1", "database migration plan", memory_kind="semantic", memory_tier="long", tags=["project"],
              importance=90)["message"]
    b = write(store, "s1", "database backup policy", memory_kind="procedure", memory_tier="mid",
              tags=["project", "ops"], importance=40)["message"]
    c = write(store, "s2", "database choice", memory_kind="semantic", memory_tier="short", importance=70)["message"]
    health = store.health()

    def found(**kw):
        return {r["message_id"] for r in search(store, query="database", **kw)["results"]}

    assert found() == {a["message_id"], b["message_id"], c["message_id"]}
    assert found(session_id="s2") == {c["message_id"]}
    assert found(min_importance=70) == {a["message_id"], c["message_id"]}
    assert found(filters_json='{"kinds":["semantic","procedure"],"tiers":["mid","short"]}') == {
        b["message_id"], c["message_id"]}
    assert found(filters_json='{"tags":["project","ops"]}') == {b["message_id"]}
    assert found(filters_json='{"tags":["project"]}') == {a["message_id"], b["message_id"]}
    # an empty list restricts nothing, for kinds and tiers as for tags
    everything = {a["message_id"], b["message_id"], c["message_id"]}
    assert found(filters_json='{"kinds":[],"tiers":[],"tags":[]}') == everything
    assert len(search(store, query="database", limit=1)["results"]) == 1
    r = search(store, query="database", context_size=1, session_id="s1")["results"]
    for item in r:
        assert "context_preview" in item and {"score", "score_breakdown", "matched_fields", "relation_count"} <= set(item)
    assert all("context_preview" not in x for x in search(store, query="database")["results"])
    # search changes nothing, not even a counter (its index may build lazy caches: memory aside)
    assert {k: v for k, v in store.health().items() if k != "memory_estimate"} == \
        {k: v for k, v in health.items() if k != "memory_estimate"}
    update(store, a["message_id"], content="nothing relevant")
    # its own text no longer matches: it can only come back through its session neighbour b, and says so
    hit = {r["message_id"]: r for r in search(store, query="database")["results"]}[a["message_id"]]
    assert hit["matched_fields"] == ["context"] and hit["score_breakdown"]["content"] == 0
    delete(store, b["message_id"])
    assert found() == {c["message_id"]}


def test_search_budget(big_store):
    r = search(big_store, query="needle", limit=100)
    assert 0 < len(r["results"]) and json_size(r) <= L.RESPONSE_BUDGET_BYTES


def test_reads_change_nothing(store, graph):
    before_state, before_health = live_state(store), store.health()
    for m in list(store.by_id):
        ctx(store, m, relation_depth=2, before=10, after=10)
        content(store, m, content_limit=1)
    sessions_all(store, limit=1)
    read(store, session_id="g", limit=1)
    assert live_state(store) == before_state and store.health() == before_health


def test_many_equal_hits_come_by_importance_then_newest(store, monkeypatch):
    # a pool of 60 messages of the same text (a session each: no neighbour adds to one) is ordered by
    # importance in C first (MessageTable.importances, SearchIndex._tied_first); the page is still
    # score, then importance, then the newer message
    from storaged.search import SearchIndex
    used = []
    real = SearchIndex._tied_first
    monkeypatch.setattr(SearchIndex, "_tied_first", staticmethod(lambda *a: used.append(1) or real(*a)))
    ids = [write(store, f"s{i}", "disk quota exceeded on the build host", importance=(i * 7) % 5 * 10)["message"]
           for i in range(60)]
    want = [m["message_id"] for m in sorted(ids, key=lambda m: -m["metadata"]["importance"] * 10**6 - ids.index(m))]
    for limit in (1, 5, 9):
        got = [r["message_id"] for r in search(store, query="disk quota exceeded", limit=limit)["results"]]
        assert got == want[:limit], limit
    assert used
