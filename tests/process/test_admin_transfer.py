"""``convmem export | import | health | rebuild``: the real CLI as a subprocess against real daemon
processes (tests/support/daemon_proc.py, ended by PID), plus the daemon op ``import_messages`` in process.

The round trip: a store with varied messages (multibyte text and session ids, every metadata field,
relations, updated messages, deletions, interleaved sessions) is exported, imported into an EMPTY
store, and the copy must be identical: every message field by field (both stores' export files are
byte-identical), the sessions view, contexts, and search results (ids, order, scores). The health
figures that describe the live data are equal; those that describe the log's history differ by
design and are asserted exactly:

- ``deleted_messages`` and ``update_records``: 0 in the copy (it never saw a delete or an update;
  an updated message arrives whole, with its revision and updated_at).
- ``last_sequence``: the copy's is its message count (one sequence number per imported message);
  the source's also counts its update and delete records.
- ``log_size``: the copy's log holds one record per live message, the source's also its history.

Search scores (not ids or order) may differ until the source is rebuilt: BM25's document
frequencies count the source's deleted and superseded versions until its index is swept.
"""
from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.admin_cli import FakeTty, cli_cmd, cli_env, convmem, out_json, read_jsonl
from tests.support.daemon_proc import DaemonPool
from protocol import errors as E
from protocol import limits as L
from protocol.errors import ProtocolError
from protocol.validation import validate
from storaged.store import Store
from ulid import ULID

pytestmark = pytest.mark.timeout(120)

SESSIONS = ["proj-α/設計", "chat 🙂", "plain", "solo"]
CONTENTS = [
    "alpha beta gamma",                                      # repeated in several sessions: score ties
    "データベースの移行を決めた。理由は性能と運用コスト。",
    "🙂👍 emoji ok, and a ZWJ family 👨‍👩‍👧",
    "quote \" backslash \\ tab \t newline \n NUL \u0000 bell \u0007 sep \u2028 end",
    "e\u0301 combining, ﬁ ligature, Ａ full-width",
    "alpha beta gamma",
    "decision: keep the log append-only; memory is durable",
    "system prompt style text",
]
QUERIES = [
    {"query": "alpha"}, {"query": "beta gamma"}, {"query": "データベース"}, {"query": "決定"},
    {"query": "decision durable"}, {"query": "emoji"}, {"query": "needle"}, {"query": "要約"},
    {"query": "alpha", "filters_json": json.dumps({"tags": ["project"]})},
    {"query": "alpha", "session_id": "plain", "context_size": 2},
    {"query": "alpha gamma", "min_importance": 40, "context_size": 1, "limit": 100},
    {"query": "alpha", "filters_json": json.dumps({"kinds": ["semantic", "episode"], "tiers": ["long", "mid"]})},
]
TIERS = L.MEMORY_TIERS
KINDS = L.MEMORY_KINDS


# ------------------------------------------------------------------------------------ the worlds
def build_source(c) -> dict:
    """Native writes through the daemon: what a long-lived store looks like."""
    written: list[dict] = []
    for i in range(48):
        sid = SESSIONS[i % len(SESSIONS)]        # interleaved: creation order != session order
        content = CONTENTS[i % len(CONTENTS)] + ("" if i % 3 else f" #{i}")
        md: dict = {}
        if i % 2 == 0:
            md = {"tags": ["project", "決定", f"t{i % 3}"], "memory_tier": TIERS[i % 4],
                  "memory_kind": KINDS[i % 6], "importance": (i * 7) % 101}
        if i % 4 == 0:
            md.update({"tool_call_id": f"call-{i}-ü", "summary": f"要約 {i}: decision summary"})
        if i % 5 == 0 and written:
            md["relations"] = [{"type": L.RELATION_TYPES[i % 4], "message_id": written[-1]["message_id"]},
                               {"type": "related_to", "message_id": written[0]["message_id"]}]
            md["source_message_ids"] = [w["message_id"] for w in written[-3:]]
        role = ("user", "assistant", "system")[i % 3]
        written.append(c.write(sid, content, role=role, metadata=md or None))
    big = c.write("solo", "長い" * 60_000 + " needle", metadata={"tags": ["big"], "summary": "大きい"})
    vanish = [c.write("to-vanish", f"temporary {k}") for k in range(2)]
    ids = [w["message_id"] for w in written]
    # updates: content (rev 2), then metadata (rev 3); metadata only; a no-op
    def upd(mid, **args):
        rep = c.call("update_message", {"message_id": mid, **args})
        assert rep["status"] == "OK", rep
        return rep
    assert upd(ids[3], content="alpha beta gamma, revised")["message"]["revision"] == 2
    assert upd(ids[3], metadata_json=json.dumps({"importance": 99, "summary": "改訂"}))["message"]["revision"] == 3
    assert upd(ids[10], metadata_json=json.dumps({"tags": ["edited"], "memory_tier": "long"}))["changed"] is True
    assert upd(ids[11], content=written[11]["content"])["changed"] is False
    # deletes: a whole session, a relation target (relations to it then point at a deleted id), one more
    for mid in [v["message_id"] for v in vanish] + [ids[4], ids[20]]:
        assert c.call("delete_message", {"message_id": mid}) == {"status": "OK"}
    # "updates": those that changed something (the no-op writes no record)
    return {"updates": 3, "deletes": 4, "writes": len(written) + 1 + len(vanish), "big": big["message_id"],
            "related": ids[5], "updated": ids[3]}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    base = tmp_path_factory.mktemp("xfer")
    home = base / "home"
    home.mkdir()
    pool = DaemonPool(base)
    src = pool.new("src").start()
    dst = pool.new("dst").start()
    scratch = pool.new("scr").start()
    try:
        with src.client() as c:
            facts = build_source(c)
        yield {"base": base, "home": home, "src": src, "dst": dst, "scratch": scratch, "facts": facts}
    finally:
        pool.close_all()


@pytest.fixture(scope="module")
def copied(world):
    """export (src) -> import (empty dst) -> export (dst)."""
    base, home, src, dst = world["base"], world["home"], world["src"], world["dst"]
    with dst.client() as c:
        assert c.health()["active_messages"] == 0
    src_file, dst_file = base / "src.jsonl", base / "dst.jsonl"
    exp = convmem(src.data_dir, home, "export", "-o", str(src_file))
    imp = convmem(dst.data_dir, home, "import", str(src_file))
    exp2 = convmem(dst.data_dir, home, "export", "-o", str(dst_file))
    return {"src_file": src_file, "dst_file": dst_file, "export": exp, "import": imp, "export2": exp2}


def everything(c) -> dict:
    """What a caller can see of a store (minus health)."""
    sessions = c.sessions()
    out = {"sessions": sessions, "history": {s["session_id"]: c.history(s["session_id"]) for s in sessions}}
    out["search"] = [c.call("search_messages", q) for q in QUERIES]
    return out


def strip_scores(reply: dict) -> dict:
    return {"results": [{k: v for k, v in r.items() if k not in ("score", "score_breakdown")}
                        for r in reply["results"]]}


def canonical_context(reply: dict) -> dict:
    """A context reply with its relation entries in a fixed order: the live store lists incoming edges
    in the order they were (re)written (an update moves its edges last), a copy in creation order;
    the contract leaves the order open."""
    def key(e: dict) -> tuple:
        return (e["depth"], e["direction"], e["type"], e.get("message_id") or e["message"]["message_id"])
    return {**reply, "relations": sorted(reply["relations"], key=key)}


# ----------------------------------------------------------------------------------- round trip
def test_export_then_import_into_an_empty_store_is_identical(world, copied):
    src, dst, facts = world["src"], world["dst"], world["facts"]
    with src.client() as c:
        src_health, src_all = c.health(), everything(c)
        src_msgs = c.all_messages()
    n = src_health["active_messages"]
    assert n == facts["writes"] - facts["deletes"]
    assert out_json(copied["export"]) == {"exported": n}
    assert out_json(copied["import"]) == {"imported": n, "existing": 0, "malformed_lines": 0, "first_malformed": [], "invalid_lines": 0, "first_invalid": []}
    assert out_json(copied["export2"]) == {"exported": n}
    for p in (copied["export"], copied["import"], copied["export2"]):
        assert p.stderr == b""                       # not a terminal: no progress, only the summary

    # every message, field by field: the two export files are the same bytes
    lines = read_jsonl(copied["src_file"])
    assert len(lines) == n and {m["message_id"] for m in lines} == {m["message_id"] for m in src_msgs}
    assert copied["src_file"].read_bytes() == copied["dst_file"].read_bytes()
    by_id = {m["message_id"]: m for m in lines}
    assert by_id == {m["message_id"]: m for m in src_msgs}
    assert all(set(m) == {"message_id", "session_id", "timestamp", "role", "content", "revision", "updated_at",
                          "metadata"} for m in lines)
    upd = by_id[facts["updated"]]
    assert upd["revision"] == 3 and upd["updated_at"] > upd["timestamp"]
    assert upd["metadata"]["summary"] == "改訂" and upd["content"] == "alpha beta gamma, revised"
    assert by_id[facts["big"]]["content"].endswith("needle") and len(by_id[facts["big"]]["content"]) > 100_000
    assert any(m["metadata"].get("tool_call_id") for m in lines) and any(m["metadata"]["relations"] for m in lines)
    assert any(r["message_id"] not in by_id for m in lines for r in m["metadata"]["relations"])  # deleted target
    assert "to-vanish" not in {m["session_id"] for m in lines}
    # the file is in creation order (ids rise), each session's history in its own order
    assert [m["message_id"] for m in lines] == sorted(m["message_id"] for m in lines)

    with dst.client() as c:
        dst_health, dst_all = c.health(), everything(c)
        dst_msgs = c.all_messages()
        ctx = [c.call("read_messages", {"view": "context", "message_id": mid, "before": 3, "after": 3,
                                        "relation_depth": 2}) for mid in (facts["related"], facts["updated"])]
    assert {m["message_id"]: m for m in dst_msgs} == by_id
    assert dst_all["sessions"] == src_all["sessions"]
    assert dst_all["history"] == src_all["history"]
    for q, a, b in zip(QUERIES, src_all["search"], dst_all["search"]):
        assert [r["message_id"] for r in a["results"]] == [r["message_id"] for r in b["results"]], q
        assert strip_scores(a) == strip_scores(b), q
    assert sum(len(r["results"]) for r in src_all["search"]) > 40
    assert len({r["score"] for r in src_all["search"][0]["results"]}) < len(src_all["search"][0]["results"])  # ties
    # BM25 statistics count the source's deleted and replaced versions until a sweep or a rebuild
    # (posting lists keep tombstones); after a rebuild the scores are the same to the last digit too
    with src.client() as c:
        assert c.rebuild()["status"] == "OK"
        assert [c.call("search_messages", q) for q in QUERIES] == dst_all["search"]
        ctx_src = [c.call("read_messages", {"view": "context", "message_id": mid, "before": 3, "after": 3,
                                                "relation_depth": 2}) for mid in (facts["related"], facts["updated"])]
        assert [canonical_context(x) for x in ctx] == [canonical_context(x) for x in ctx_src]

    # health: equal where it describes the live data ...
    for key in ("status", "format_version", "active_messages", "session_count", "last_error"):
        assert dst_health[key] == src_health[key], key
    for key in ("body_bytes", "metadata_bytes"):
        assert dst_health["memory_estimate"][key] == src_health["memory_estimate"][key], key
    # ... and different by design where it describes the log's history
    assert src_health["deleted_messages"] == facts["deletes"] and dst_health["deleted_messages"] == 0
    assert src_health["update_records"] == facts["updates"] and dst_health["update_records"] == 0  # a no-op writes nothing
    assert src_health["last_sequence"] == facts["writes"] + facts["updates"] + facts["deletes"]
    assert dst_health["last_sequence"] == n
    assert dst_health["log_size"] < src_health["log_size"]


def test_reimport_stores_nothing_twice(world, copied):
    home, dst = world["home"], world["dst"]
    n = len(read_jsonl(copied["src_file"]))
    with dst.client() as c:
        before = c.health()
    again = out_json(convmem(dst.data_dir, home, "import", str(copied["src_file"])))
    assert again == {"imported": 0, "existing": n, "malformed_lines": 0, "first_malformed": [], "invalid_lines": 0, "first_invalid": []}
    with dst.client() as c:
        after = c.health()
    for key in ("log_size", "last_sequence", "active_messages", "session_count", "update_records"):
        assert after[key] == before[key], key
    assert after["io"]["write_calls"] == before["io"]["write_calls"]   # not even an empty append


def test_imported_state_survives_a_restart(world, copied):
    """Revisions, updated_at and metadata come back from the log replay the same as they went in."""
    home, dst, base = world["home"], world["dst"], world["base"]
    dst.kill()
    dst.start()
    again = base / "dst-restarted.jsonl"
    assert out_json(convmem(dst.data_dir, home, "export", "-o", str(again)))["exported"] > 0
    assert again.read_bytes() == copied["src_file"].read_bytes()


def test_export_of_one_session_to_stdout(world, copied):
    home, src = world["home"], world["src"]
    sid = SESSIONS[0]
    p = convmem(src.data_dir, home, "export", "--session", sid)
    assert p.returncode == 0, p.stderr
    lines = [json.loads(x) for x in p.stdout.decode("utf-8").splitlines()]
    with src.client() as c:
        assert lines == c.history(sid)
    assert len(lines) > 5 and {m["session_id"] for m in lines} == {sid}
    assert json.loads(p.stderr) == {"exported": len(lines)}   # data on stdout, the summary beside it
    # a session that does not exist: nothing, still a success
    p = convmem(src.data_dir, home, "export", "--session", "no-such-session")
    assert (p.returncode, p.stdout, json.loads(p.stderr)) == (0, b"", {"exported": 0})


# ----------------------------------------------------------------------------- damaged input files
def msg(i: int, sid: str = "imp", **extra) -> dict:
    ts = 1_700_000_000_000 + i * 1000
    m = {"message_id": str(ULID.from_bytes(((ts << 80) | (0xAB << 60) | i).to_bytes(16, "big"))),
         "session_id": sid, "timestamp": ts, "role": "user", "content": f"imported message {i} 日本語",
         "revision": 1, "updated_at": ts, "metadata": {"tags": ["imp"]}}
    m.update(extra)
    return m


def line(m) -> bytes:
    return (json.dumps(m, ensure_ascii=False) + "\n").encode()


def test_malformed_lines_are_skipped_and_counted(world, tmp_path):
    home, d = world["home"], world["scratch"]
    data = b"".join([
        line(msg(1, "mal")),                                   # 1
        b'{"message_id": "01H", not json\n',                   # 2 invalid JSON
        b"\n",                                                 # 3 blank: not counted
        line(msg(2, "mal")),                                   # 4
        b"\xff\xfe\x00\x81binary garbage\x9f\n",               # 5 not UTF-8
        line(msg(3, "mal"))[:40] + b"\n",                      # 6 cut short
        b'   \t  \n',                                          # 7 whitespace only: not counted
        line(msg(4, "mal")),                                   # 8
        line(msg(5, "mal"))[:30],                              # 9 truncated last line, no newline
    ])
    f = tmp_path / "damaged.jsonl"
    f.write_bytes(data)
    p = convmem(d.data_dir, home, "import", str(f))
    assert p.stderr == b""
    assert out_json(p) == {"imported": 3, "existing": 0, "malformed_lines": 4, "first_malformed": [2, 5, 6, 9], "invalid_lines": 0, "first_invalid": []}
    with d.client() as c:
        assert [m["content"] for m in c.history("mal")] == [f"imported message {i} 日本語" for i in (1, 2, 4)]
    # the same through stdin
    p = convmem(d.data_dir, home, "import", "-", stdin=data)
    assert out_json(p) == {"imported": 0, "existing": 3, "malformed_lines": 4, "first_malformed": [2, 5, 6, 9], "invalid_lines": 0, "first_invalid": []}


@pytest.mark.parametrize("bad,field", [
    (msg(9, metadata={"importance": 500, "tags": ["robot"]}), "metadata.importance"),
    (msg(9, content=5), "content"),            # not even a string (the client's batching must not trip on it)
    ({k: v for k, v in msg(9).items() if k != "role"}, "role"),  # a field missing
])
def test_invalid_message_objects_are_skipped_and_named_by_line_and_field(world, tmp_path, bad, field):
    """One invalid line no longer aborts the import (its batch used to be refused whole): the others
    are imported, the line is counted and named on stderr with the field, its content never echoed."""
    home, d = world["home"], world["scratch"]
    f = tmp_path / "invalid.jsonl"
    sid = f"inv-{field}"
    k = 300 + 10 * ["metadata.importance", "content", "role"].index(field)  # fresh message ids per case
    f.write_bytes(line(msg(k + 7, sid)) + line(msg(k + 8, sid)) + line(bad | {"session_id": sid})
                  + line(msg(k + 10, sid)))
    p = convmem(d.data_dir, home, "import", str(f))
    err = p.stderr.decode()
    assert out_json(p) == {"imported": 3, "existing": 0, "malformed_lines": 0, "first_malformed": [],
                           "invalid_lines": 1, "first_invalid": [3]}
    assert err.count("\n") == 1 and err.startswith("convmem: skipped line 3: message.") and field in err, err
    assert E.VALIDATION_ERROR not in err and "Traceback" not in err
    assert "robot" not in err and "500" not in err  # no value is echoed
    with d.client() as c:
        assert [m["content"] for m in c.history(sid)] == [f"imported message {k + i} 日本語" for i in (7, 8, 10)]


def test_many_invalid_lines_are_all_counted_the_first_ten_named(world, tmp_path):
    home, d = world["home"], world["scratch"]
    f = tmp_path / "many-invalid.jsonl"
    f.write_bytes(b"".join(line(msg(200 + i, "inv-many", role="robot" if i % 2 else "user")) for i in range(30))
                  + line({"session": {"session_id": 5}}))
    p = convmem(d.data_dir, home, "import", str(f))
    r = out_json(p)
    assert (r["imported"], r["invalid_lines"]) == (15, 16)
    assert r["first_invalid"] == [2, 4, 6, 8, 10, 12, 14, 16, 18, 20]
    err = p.stderr.decode().splitlines()
    assert len(err) == 11 and err[-1] == "convmem: skipped 6 more invalid lines", err
    assert all("message.role" in e for e in err[:10]) and "robot" not in p.stderr.decode()


def test_batches_are_bounded_by_encoded_size(world, tmp_path):
    """1200 messages each with a 4 KiB summary: 1000 of them would not fit one 4 MiB request."""
    home, d = world["home"], world["scratch"]
    f = tmp_path / "summaries.jsonl"
    with open(f, "wb") as out:
        for i in range(1200):
            out.write(line(msg(10_000 + i, "sum", metadata={"summary": "s" * 4000 + f"{i:05d}" + "x" * 91,
                                                            "tags": ["t" * 128] * 32})))
    assert out_json(convmem(d.data_dir, home, "import", str(f))) == {
        "imported": 1200, "existing": 0, "malformed_lines": 0, "first_malformed": [], "invalid_lines": 0, "first_invalid": []}
    with d.client() as c:
        assert len(c.history("sum")) == 1200


# -------------------------------------------------------------------------- import_messages op


@pytest.mark.unit  # in-process, unlike the rest of this module
def test_import_op_is_idempotent_and_one_append_per_batch(store, tmp_path):
    batch = [msg(i, "op", revision=1 + i % 3, updated_at=1_700_000_000_000 + i * 1000 + 5) for i in range(50)]
    writes = store.io.counters.write_calls
    flushes = store.io.counters.flush_calls
    assert store.import_messages(validate("import_messages", {"messages": batch + batch[:5]})) == {
        "status": "OK", "imported": 50, "existing": 5}                 # duplicates inside one batch too
    assert store.io.counters.write_calls - writes == 1
    assert store.io.counters.flush_calls - flushes == 1
    size = store.log_size()
    assert store.import_messages(validate("import_messages", {"messages": batch})) == {
        "status": "OK", "imported": 0, "existing": 50}
    assert store.log_size() == size
    got = {mid: m.to_dict() for mid, m in store.by_id.items()}
    want = {m["message_id"]: validate_roundtrip(m) for m in batch}
    assert got == want
    store.close()
    reopened = Store.open(str(tmp_path / "data"))
    try:
        assert {mid: m.to_dict() for mid, m in reopened.by_id.items()} == want
        assert reopened.health()["update_records"] == 0 and reopened.health()["last_sequence"] == 50
    finally:
        reopened.close()


def validate_roundtrip(m: dict) -> dict:
    out = dict(m)
    out["metadata"] = {"tags": m["metadata"]["tags"], "memory_tier": "short", "memory_kind": "conversation",
                       "importance": 50, "relations": [], "source_message_ids": []}
    return out


@pytest.mark.unit  # in-process, unlike the rest of this module
@pytest.mark.parametrize("mutate,field", [
    (lambda m: m.update(role="robot"), "messages[1].role"),
    (lambda m: m.update(message_id="not-a-ulid"), "messages[1].message_id"),
    (lambda m: m.pop("timestamp"), "messages[1].timestamp"),
    (lambda m: m.update(timestamp=-1), "messages[1].timestamp"),
    (lambda m: m.update(updated_at=m["timestamp"] - 1), "messages[1].updated_at"),
    (lambda m: m.update(revision=0), "messages[1].revision"),
    (lambda m: m.update(content=""), "messages[1].content"),
    (lambda m: m.update(session_id="s" * 257), "messages[1].session_id"),
    (lambda m: m.update(colour="crimson-value"), "messages[1]"),
    (lambda m: m.update(metadata={"importance": 101}), "messages[1].metadata.importance"),
    (lambda m: m.update(metadata={"memory_kind": "dream"}), "messages[1].metadata.memory_kind"),
    (lambda m: m.update(metadata={"relations": [{"type": "likes", "message_id": m["message_id"]}]}),
     "messages[1].metadata.relations"),
    (lambda m: m.update(metadata={"source_message_ids": ["x"]}), "messages[1].metadata.source_message_ids"),
    (lambda m: m.update(metadata={"tags": [""]}), "messages[1].metadata.tags"),
    (lambda m: m.update(metadata={"secret_field": 1}), "messages[1].metadata"),
    (lambda m: m.update(metadata=[]), "messages[1].metadata"),
])
def test_import_validation_names_the_field(store, mutate, field):
    bad = msg(2)
    mutate(bad)
    with pytest.raises(ProtocolError) as info:
        store.import_messages(validate("import_messages", {"messages": [msg(1), bad]}))
    assert info.value.code == E.VALIDATION_ERROR
    assert field in str(info.value), str(info.value)
    assert "crimson" not in str(info.value) and "secret" not in str(info.value).replace("secret_field", "")
    assert store.by_id == {}


@pytest.mark.unit  # in-process, unlike the rest of this module
def test_import_batch_limits(store):
    for messages in ([], [msg(i) for i in range(L.IMPORT_BATCH_MAX + 1)], "x", None):
        with pytest.raises(ProtocolError) as info:
            validate("import_messages", {"messages": messages})
        assert info.value.code == E.VALIDATION_ERROR and "messages" in str(info.value)
    assert len(validate("import_messages", {"messages": [msg(i) for i in range(L.IMPORT_BATCH_MAX)]}).messages) \
        == L.IMPORT_BATCH_MAX
    for item in ([msg(2)], "text", 42, None):
        with pytest.raises(ProtocolError) as info:
            validate("import_messages", {"messages": [msg(1), item]})
        assert "messages[1]" in str(info.value)


# ------------------------------------------------------------------------ health, rebuild, progress
def test_health_is_a_readable_summary(world, copied):
    home, src = world["home"], world["src"]
    with src.client() as c:
        h = c.health()
    p = convmem(src.data_dir, home, "health")
    assert p.returncode == 0 and p.stderr == b""
    text = p.stdout.decode()
    assert text.splitlines()[0].split() == ["status", "OK"]
    assert f"{h['active_messages']:,} live in {h['session_count']:,} sessions" in text
    assert f"({h['deleted_messages']:,} deleted, {h['update_records']:,} update records" in text
    assert f"last sequence {h['last_sequence']:,}" in text
    for label in ("log", "snapshot", "memory estimate", "io since start", "recovery"):
        assert re.search(rf"^{label}\s", text, re.M), label
    assert re.search(r"\d (KiB|MiB)\b", text) and "{" not in text   # sizes in units that fit, no raw maps


def test_rebuild_prints_its_figures(world, copied):
    home, d = world["home"], world["scratch"]
    with d.client() as c:
        for i in range(5):
            m = c.write("rb", f"to rebuild {i}")
            c.call("update_message", {"message_id": m["message_id"], "content": f"rebuilt {i}"})
        c.call("delete_message", {"message_id": m["message_id"]})
        before = c.health()
    figures = out_json(convmem(d.data_dir, home, "rebuild"))
    assert figures["status"] == "OK"
    assert figures["messages_indexed"] == before["active_messages"]
    assert figures["records_removed"] >= 6 and figures["bytes_before"] == before["log_size"]
    assert figures["bytes_after"] < figures["bytes_before"]
    with d.client() as c:
        after = c.health()
    assert after["update_records"] == 0 and after["log_size"] == figures["bytes_after"]


def test_no_daemon_is_exit_1_with_a_clear_message(tmp_path):
    home = tmp_path / "h"
    home.mkdir()
    p = convmem(tmp_path / "nodaemon", home, "health", request_timeout_s=0.2)
    assert p.returncode == 1 and p.stdout == b""
    assert b"BUSY" in p.stderr and b"unavailable" in p.stderr


def run_on_pty(cmd: list[str], env: dict[str, str], cwd: Path, timeout: float = 120.0) -> tuple[int, bytes, str]:
    """Run with stderr on a pseudo-terminal (stdout a pipe); returns (rc, stdout, what the terminal saw)."""
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen(cmd, env=env, cwd=str(cwd), stdout=subprocess.PIPE, stderr=slave,
                                stdin=subprocess.DEVNULL)
    finally:
        os.close(slave)
    seen = b""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            try:
                chunk = os.read(master, 65536)
            except OSError:   # EIO: the child closed the terminal
                break
            if not chunk:
                break
            seen += chunk
        out = proc.stdout.read()
        rc = proc.wait(max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        os.close(master)
    return rc, out, seen.decode("utf-8", "replace")


def test_progress_on_a_terminal_and_silence_elsewhere(world, tmp_path):
    home, d = world["home"], world["scratch"]
    f = tmp_path / "many.jsonl"
    with open(f, "wb") as out:
        for i in range(6000):
            out.write(line(msg(100_000 + i, f"prog-{i % 7}")))
    # (not a terminal: every other test here checks that stderr stays empty)
    # a terminal: a progress line with count and rate, ended by the final one
    rc, out, tty = run_on_pty(cli_cmd(d.data_dir, "import", str(f)), cli_env(home), home)
    assert rc == 0, tty
    assert json.loads(out) == {"imported": 6000, "existing": 0, "malformed_lines": 0, "first_malformed": [], "invalid_lines": 0, "first_invalid": []}
    assert re.search(r"imported: 6,000 \([\d,]+/s\)", tty), tty
    assert tty.endswith("\n") and "\r" in tty
    rc, out, tty = run_on_pty(cli_cmd(d.data_dir, "export", "-o", str(tmp_path / "out.jsonl")), cli_env(home), home)
    with d.client() as c:
        total = c.health()["active_messages"]
    assert rc == 0 and json.loads(out) == {"exported": total}
    assert re.search(rf"exported: {total:,} / {total:,} \([\d,]+/s\)", tty), tty


@pytest.mark.unit  # in-process, unlike the rest of this module
def test_progress_line_has_rate_and_eta():
    from admin.progress import Progress, format_seconds

    class Pipe(FakeTty):
        def isatty(self):
            return False

    p = Progress("imported", total=1000, stream=FakeTty(), interval=0)
    p.start = time.monotonic() - 2.0
    p.advance(250)
    assert re.search(r"^\rimported: 250 / 1,000 \(1\d\d/s, ETA \d+s\)", p.stream.text), p.stream.text
    p.advance(750)
    p.done()
    assert "ETA" not in p.stream.text.rsplit("\r", 1)[-1] and p.stream.text.endswith("\n")
    q = Progress("imported", total=10, stream=Pipe(), interval=0)
    q.advance(5)
    q.done()
    assert q.stream.text == "" and q.count == 5
    assert [format_seconds(s) for s in (5, 65, 3725)] == ["5s", "1m05s", "1h02m"]


# ----------------------------------------------------------------------------- agent history too
def test_export_import_keeps_events_and_session_metadata(tmp_path):
    """Agent history survives a round trip whole: event types, tool names, error flags, exit codes,
    models, file touches, and each session's metadata (the line before its first message)."""
    pool = DaemonPool(tmp_path)
    try:
        src, dst = pool.new("hsrc").start(), pool.new("hdst").start()
        home = tmp_path / "home"
        home.mkdir()
        t = 1_767_225_600_000
        sid = "claude-code:abc"

        def m(n: int, etype: str, content: str, role: str, **event) -> dict:
            return {"message_id": str(ULID.from_bytes((((t + n) << 80) | n).to_bytes(16, "big"))),
                    "session_id": sid, "timestamp": t + n, "role": role, "content": content,
                    "event": {"type": etype, **event}}

        events = [m(1, "user_input", "run the tests", "user"),
                  m(2, "tool_call", '{"command":"pytest"}', "assistant", tool_name="Bash", model="claude-x"),
                  m(3, "tool_response", "1 failed", "user", tool_name="Bash", is_error=True, exit_code=1),
                  m(4, "tool_call", '{"file_path":"/r/a.py"}', "assistant", tool_name="Edit",
                    files=[{"path": "/r/a.py", "root": "/r", "tail": "a.py", "project": "/r/.git", "op": "edit"}]),
                  m(5, "reasoning", "[encrypted reasoning omitted]", "assistant"),
                  m(6, "assistant_response", "fixed", "assistant")]
        meta = {"session_id": sid, "harness": "claude-code", "source": "claude", "title": "Fix tests", "cwd": "/r",
                "project": "/r/.git", "branch": "main"}
        with src.client() as c:
            assert c.call("import_messages", {"messages": events, "sessions": [meta]})["status"] == "OK"
            c.write("plain", "a memory written directly")
        a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
        out_json(convmem(src.data_dir, home, "export", "-o", str(a)))
        lines = read_jsonl(a)
        # a message whose role says its event type (and that carries no tool facts) needs no event object
        kinds = [x["event"]["type"] if "event" in x else {"user": "user_input", "assistant": "assistant_response"}[
            x["role"]] for x in lines[1:7]]
        assert lines[0] == {"session": meta} and "event" not in lines[1] and kinds == [
            "user_input", "tool_call", "tool_response", "tool_call", "reasoning", "assistant_response"]
        assert lines[3]["event"] == {"type": "tool_response", "tool_name": "Bash", "is_error": True, "exit_code": 1,
                                     "model": None, "files": []}
        assert "event" not in lines[-1] and "session" not in lines[-1]   # a plain memory stays plain
        r = out_json(convmem(dst.data_dir, home, "import", str(a)))
        assert r["imported"] == 7
        out_json(convmem(dst.data_dir, home, "export", "-o", str(b)))
        assert a.read_bytes() == b.read_bytes()
        with dst.client() as c:
            hit = c.call("search_sessions", {"query": "failed", "event_types": ["tool_response"]})["data"]["results"][0]
            assert hit["session"]["title"] == "Fix tests" and hit["event"]["tool_name"] == "Bash"
            opened = c.call("open", {"id": hit["open"]["event_id"]})["data"]
            assert opened["content"]["exit_code"] == 1 and opened["content"]["is_error"] is True
    finally:
        pool.close_all()
