"""Hostile input and denial of service (issue 12, items 4 and 8), each against real processes.

- Frames that msgpack inflates (millions of one-byte empty maps) are refused while they are
  unpacked: a VALIDATION_ERROR, and the daemon's peak memory stays near where it was.
- A peer that pipelines requests and never reads its replies cannot make the daemon queue them
  without bound, and other clients are served meanwhile.
- stdio: every malformed JSON-RPC line gets a JSON-RPC error, nothing altered is stored, no input
  is echoed on stderr, and the session goes on.
"""
from __future__ import annotations

import json
import os
import subprocess
import time
from typing import Any

import msgpack
import pytest
import zmq
from ulid import ULID

from tests.support.daemon_proc import DaemonPool, new_rid
from protocol import history as H
from protocol import limits as L
from protocol import wire
from protocol.errors import ProtocolError

MiB = L.MiB


@pytest.fixture
def pool(tmp_path):
    p = DaemonPool(tmp_path)
    yield p
    p.close_all()


def proc_kib(pid: int, key: str) -> int:
    """A /proc/PID/status memory figure (VmRSS, VmHWM) in KiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


def array32(items: bytes, n: int) -> bytes:
    return b"\xdd" + n.to_bytes(4, "big") + items


def raw_call(d, frame: bytes, timeout_ms: int = 30_000) -> Any:
    with d.client(timeout_ms=timeout_ms, retries=0) as c:
        return c.send_frames([frame])


def assert_validation_error(rep: Any) -> str:
    assert isinstance(rep, dict) and rep.get("status") == "ERROR", rep
    assert rep["error"]["code"] == "VALIDATION_ERROR", rep
    return rep["error"]["message"]


# ------------------------------------------------------------------------------- 4a: inflating frames
@pytest.mark.unit  # in-process, unlike the rest of this module
def test_wire_bounds_unpacking_work():
    """The limits hold in the decoder itself (fast, no daemon): each kind of over-inflating frame
    is a ProtocolError naming the limit, and legitimate shapes at the limits decode."""
    n = L.MAX_REQUEST_BYTES - 16
    inflating = {
        "array of 4M empty maps": array32(b"\x80" * n, n),
        "arrays of arrays of empty maps": array32(array32(b"\x80" * 16000, 16000) * 250, 250),
        "one map header claiming 1M entries": b"\xdf" + (1 << 20).to_bytes(4, "big") + b"\xa1k\x00" * 1000,
        "an ext type": msgpack.packb({"op": msgpack.ExtType(5, b"x" * 100)}),
    }
    for name, frame in inflating.items():
        with pytest.raises(ProtocolError) as exc:
            wire.decode(frame)
        assert "limit" in exc.value.message or "at most" in exc.value.message, name
    # at the limits: the longest array a request may hold, a free-form checkpoint-sized map
    ok = {"a": list(range(L.MAX_REQUEST_ARRAY_LEN)), "m": {f"k{i}": i for i in range(L.MAX_REQUEST_MAP_LEN)}}
    assert wire.decode(msgpack.packb(ok)) == ok


def test_inflating_frames_refused_fast_with_bounded_memory(pool):
    """4 MiB frames of one-byte empty maps (flat, and nested under the per-array limit) are answered
    VALIDATION_ERROR; the daemon's peak RSS stays within 64 MiB of its RSS before (it was 615 MB and
    a 12-s stall), and it serves a normal request afterwards."""
    d = pool.new().start()
    with d.client() as c:
        c.write("s", "before the attack")
    base = proc_kib(d.pid, "VmRSS")
    n = L.MAX_REQUEST_BYTES - 16
    frames = [array32(b"\x80" * n, n),
              array32(array32(b"\x80" * 16000, 16000) * 250, 250)]
    for frame in frames:
        assert len(frame) <= L.MAX_REQUEST_BYTES
        msg = assert_validation_error(raw_call(d, frame))
        assert "at most" in msg
    peak = proc_kib(d.pid, "VmHWM")
    assert peak - base < 64 * 1024, f"daemon peak RSS grew {(peak - base) // 1024} MiB"
    with d.client() as c:
        assert c.call("ping", {})["status"] == "OK"


def _event_message(i: int, ts: int, content: str) -> dict[str, Any]:
    return {"message_id": str(ULID.from_bytes(((ts << 80) | i).to_bytes(16, "big"))), "session_id": f"s{i % 7}",
            "timestamp": ts, "role": "assistant", "content": content,
            "metadata": {"tags": [f"t{j}" for j in range(L.TAGS_MAX)], "importance": 60,
                         "source_message_ids": []},
            "event": {"type": H.TOOL_CALL, "tool_name": "edit",
                      "files": [{"path": f"/p/f{j}.py", "root": "/p", "tail": f"f{j}.py", "op": "edit"}
                                for j in range(8)]}}


def test_legitimate_maximal_requests_still_pass(pool):
    """A 1 MiB content, and an import batch of IMPORT_BATCH_MAX messages (tags, events with files)
    filling most of a frame, are accepted under the new unpacking limits."""
    d = pool.new().start()
    with d.client(timeout_ms=60_000) as c:
        rep = c.call("write_message", {"session_id": "big", "role": "user", "content": "x" * L.CONTENT_MAX_BYTES})
        assert rep["status"] == "OK", rep
        ts = 1_700_000_000_000
        body = "y" * 2500
        msgs = [_event_message(i, ts + i, body) for i in range(L.IMPORT_BATCH_MAX)]
        sessions = [{"session_id": f"s{i}", "harness": "claude", "title": f"t{i}"} for i in range(7)]
        checkpoints = [{"source": "claude", "key": f"/f{i}", "value": {"offset": i, "calls": {"a": "b"}}}
                       for i in range(H.CHECKPOINTS_PER_BATCH_MAX)]
        args = {"messages": msgs, "sessions": sessions, "checkpoints": checkpoints}
        assert len(wire.encode_request("import_messages", args, new_rid())) > 3 * MiB
        rep = c.call("import_messages", args)
        assert rep["status"] == "OK", rep


# ------------------------------------------------------------------------------- 4b: a peer that never reads
def test_peer_that_never_reads_cannot_grow_the_daemon(pool):
    """A DEALER pipelines 60 reads of a ~6 MiB session and never reads a reply (a receive queue of
    one, so its backlog falls on the daemon). Before the fix libzmq queued every reply (~360 MB);
    now the daemon holds at most a few (REPLY_HWM) and drops the rest. Bound: 160 MiB over the
    daemon's RSS before the flood (REPLY_HWM + the reply being encoded + kernel buffers, ~6 MiB
    each, with room for allocator slack). A normal client is served during and after the flood."""
    d = pool.new().start()
    content = "z" * (L.CONTENT_MAX_BYTES - 16)
    with d.client(timeout_ms=30_000) as c:
        for i in range(6):
            c.write("fat", content + str(i))
    base = proc_kib(d.pid, "VmRSS")
    ctx = zmq.Context.instance()
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.setsockopt(zmq.RCVHWM, 1)
    dealer.setsockopt(zmq.RCVBUF, 4096)
    dealer.connect(d.endpoint)
    marker = f"flood-done-{new_rid()}"
    try:
        read = {"session_id": "fat", "view": "history", "limit": 100}
        for _ in range(60):
            dealer.send_multipart([b"", wire.encode_request("read_messages", read, new_rid())])
        # the daemon handles one peer's requests in order: once this write is visible, all reads ran
        dealer.send_multipart([b"", wire.encode_request(
            "write_message", {"session_id": "marker", "role": "user", "content": marker}, new_rid())])
        with d.client(timeout_ms=30_000) as c:
            deadline = time.monotonic() + 90
            while True:
                rep = c.call("read_messages", {"session_id": "marker", "view": "history"})
                if rep.get("history"):
                    break
                assert time.monotonic() < deadline, "the flood was not handled in time"
            # other clients are served while the flooding peer's queue is full
            rep = c.call("read_messages", {"session_id": "fat", "view": "history", "limit": 1})
            assert len(rep.get("history", [])) == 1, rep
        peak = proc_kib(d.pid, "VmHWM")
        assert peak - base < 160 * 1024, f"daemon peak RSS grew {(peak - base) // 1024} MiB"
    finally:
        dealer.close(linger=0)


# ------------------------------------------------------------------------------- 4c: one query's work is bounded
class _WorkCounter:
    """Counts a query's units of work by wrapping the index's own steps (no timing): postings
    scanned, probe steps (each probe walks the smaller of list and candidates), score-table
    entries walked by shut-out checks, and calls of the caller's filter."""

    def __init__(self, monkeypatch, S):
        self.scanned = self.probed = self.checked = self.asked = 0
        scan, probe, shut = S._TermList.scan_into, S._TermList.probe, S.SearchIndex._shut_out

        def scan_into(tl, acc):
            self.scanned += tl.size
            return scan(tl, acc)

        def probe_(tl, cands, scores):
            self.probed += min(tl.size, len(cands))
            return probe(tl, cands, scores)

        def shut_out(acc, bound, limit, ok):
            self.checked += len(acc)
            return shut(acc, bound, limit, ok)

        monkeypatch.setattr(S._TermList, "scan_into", scan_into)
        monkeypatch.setattr(S._TermList, "probe", probe_)
        monkeypatch.setattr(S.SearchIndex, "_shut_out", staticmethod(shut_out))

    def accept(self, pred):
        def counted(doc):
            self.asked += 1
            return pred(doc)
        return counted

    def total(self) -> int:
        return self.scanned + self.probed + self.checked + self.asked


@pytest.fixture(scope="module")
def common_words_index():
    """35 words that each occur in 6 of 7 of 24k docs (~720k postings), plus one doc holding them all."""
    import random

    from storaged import search as S

    words = [f"common{chr(97 + i // 26)}{chr(97 + i % 26)}" for i in range(35)]
    rng = random.Random(5)
    idx = S.SearchIndex()
    n = 24_000
    for d in range(n):
        idx.add(d, " ".join(rng.sample(words, 30)) + f" filler{d}", None, ())
    idx.add(n, " ".join(words) + " everything", None, ())
    return idx, words, n


@pytest.mark.unit  # in-process, unlike the rest of this module
def test_many_common_words_query_does_bounded_work(common_words_index, monkeypatch):
    """All 35 common words in one query used to scan ~every posting (3.5M and 2.4 s at 200k
    messages), then a 400k-postings budget still took ~1.6 s (a shut-out check walking the score
    table per list, a full sort to pick candidates). Now every kind of work is bounded by a budget
    that does not grow with the store: postings scanned, probe steps, shut-out checks; and the docs
    returned carry their exact scores. (Which docs: the best by the scanned terms, probed in the
    rest — an approximation only past the budget, as search()'s docstring says.)"""
    from storaged import search as S

    idx, words, n = common_words_index
    work = _WorkCounter(monkeypatch, S)
    query = " ".join(words)
    hits = idx.search(query, 10)
    lists = sorted(idx._query_lists(query), key=lambda tl: -tl.ub)
    assert sum(tl.size for tl in lists) > 600_000  # the query touches ~every posting
    assert work.scanned <= S._SCAN_BUDGET + lists[0].size, work.scanned
    assert work.probed <= S._PROBE_BUDGET, work.probed
    assert work.checked <= 6 * work.scanned, (work.checked, work.scanned)
    assert work.total() <= 300_000, vars(work)
    assert len(hits) == 10
    for h in hits:  # exact scores for the docs returned
        slot = idx._docmap.get(h.doc)
        assert h.score == pytest.approx(sum(tl.value(slot) for tl in lists), rel=1e-9)


@pytest.mark.unit  # in-process, unlike the rest of this module
def test_many_common_words_query_asks_the_filter_a_bounded_number_of_times(common_words_index, monkeypatch):
    """A filter that rejects every doc (a session with no match, a high min_importance) used to be
    asked about every doc the query reached (~all of them), best-first through a heap. Now it is
    asked at most _ACCEPT_BUDGET times (lowered here below the docs reached; by default it is the
    scan budget, so queries within that stay exact); a filter passing a fair share fills the page."""
    from storaged import search as S

    idx, words, n = common_words_index
    query = " ".join(words)
    monkeypatch.setattr(S, "_ACCEPT_BUDGET", 5_000, raising=False)  # below the 24k docs the query reaches
    work = _WorkCounter(monkeypatch, S)
    assert idx.search(query, 10, accept=work.accept(lambda d: False)) == []
    assert work.asked <= S._ACCEPT_BUDGET, work.asked
    assert work.total() <= 300_000, vars(work)

    work = _WorkCounter(monkeypatch, S)
    hits = idx.search(query, 10, accept=work.accept(lambda d: d % 7 == 3))
    assert len(hits) == 10 and all(h.doc % 7 == 3 for h in hits)
    assert work.asked <= S._ACCEPT_BUDGET and work.total() <= 300_000, vars(work)


@pytest.mark.unit  # in-process, unlike the rest of this module
def test_ordinary_query_on_the_same_index_is_exact(common_words_index):
    """Under the budgets nothing is approximate: a query of rare terms plus one common word
    returns exactly the brute-force ranking."""
    idx, words, n = common_words_index
    query = f"filler17 filler4242 everything {words[3]}"
    lists = idx._query_lists(query)
    brute = {}
    for slot in range(len(idx._slot_doc)):
        v = sum(tl.value(slot) for tl in lists)
        if v:
            brute[idx._slot_doc[slot]] = v
    want = sorted(brute, key=lambda d: (-brute[d], -d))[:10]
    got = idx.search(query, 10)
    assert [h.doc for h in got] == want
    assert [h.score for h in got] == pytest.approx([brute[d] for d in want], rel=1e-12)


# ------------------------------------------------------------------------------- 4c: health is not O(sessions)
@pytest.mark.unit  # in-process, unlike the rest of this module
def test_health_does_not_walk_every_session_per_call(store, monkeypatch):
    """get_system_health used to sum Session.size_bytes over every session on each call (tens of ms
    per call at 100k sessions, on the request loop). With 3000 sessions, 30 health calls with
    writes between them walk the sessions a few times at most (once a second), not 31 (a spy counts the walks; behaviour is real)."""
    from tests.support.faultio import write
    from protocol.validation import validate
    from storaged import indexes

    now = int(time.time() * 1000)
    for b in range(3):   # 3000 sessions of one message, in three imports (one fsync each, not 3000)
        store.import_messages(validate("import_messages", {"messages": [
            {"message_id": str(ULID()), "session_id": f"s{i}", "timestamp": now, "role": "user",
             "content": f"message {i}"} for i in range(b * 1000, (b + 1) * 1000)]}))
    calls = [0]
    real = indexes.Session.size_bytes

    def counting(self):
        calls[0] += 1
        return real(self)

    monkeypatch.setattr(indexes.Session, "size_bytes", counting)
    first = store.health()["memory_estimate"]["history_index_bytes"]
    assert first > 3000 * 100
    for i in range(30):
        write(store, f"s{i}", "one more")
        assert store.health()["memory_estimate"]["history_index_bytes"] >= first
    assert calls[0] <= 3 * 3000, f"{calls[0] // 3000} walks over every session for 31 health calls"


# ------------------------------------------------------------------------------- 8: stdio JSON-RPC lines
from tests.support.mcp_fixtures import daemon, data_dir, frontend_cmd, frontend_env, home, procs  # noqa: E402,F401

SECRET = "SECRET-b71e"  # planted in every malformed line: stderr must never echo it


def _read_reply(proc: subprocess.Popen, deadline: float) -> dict[str, Any]:
    import select

    fd = proc.stdout.fileno()
    buf = b""
    while not buf.endswith(b"\n"):
        left = deadline - time.monotonic()
        assert left > 0, "no reply in time"
        if select.select([fd], [], [], left)[0]:
            chunk = os.read(fd, 65536)
            assert chunk, "the front-end closed its stdout"
            buf += chunk
    assert buf.count(b"\n") == 1, buf[:400]
    return json.loads(buf)


def _tool_call(rid: int, name: str, arguments: dict[str, Any]) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": rid, "method": "tools/call",
                       "params": {"name": name, "arguments": arguments}}).encode() + b"\n"


def test_stdio_malformed_lines_each_get_a_jsonrpc_error(daemon, data_dir, home, procs):
    """A real ``convmem-mcp`` stdio process fed raw lines: a lone surrogate escape, invalid UTF-8
    (inside an otherwise valid write_message call), text that is no JSON, JSON that is no JSON-RPC
    message and an over-long line are each answered with a JSON-RPC error (-32700 id null, or
    -32600 with the id); nothing of them is stored; stderr never echoes them; a normal tools/call
    works afterwards."""
    proc = procs.start(frontend_cmd(data_dir, "--no-spawn", "--log-level", "DEBUG"), frontend_env(home),
                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60

    def send(line: bytes) -> dict[str, Any]:
        proc.stdin.write(line)
        proc.stdin.flush()
        return _read_reply(proc, deadline)

    init = send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                            "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                                       "clientInfo": {"name": "raw", "version": "0"}}}).encode() + b"\n")
    assert init["result"]["serverInfo"]["name"] == "convmem"
    proc.stdin.write(b'{"jsonrpc": "2.0", "method": "notifications/initialized"}\n')
    write = {"session_id": "hostile", "role": "user"}
    surrogate = _tool_call(2, "write_message", {**write, "content": "x"}).replace(b'"x"', b'"' + SECRET.encode()
                                                                                  + b' \\ud800"')
    assert b"\\ud800" in surrogate
    bad_utf8 = _tool_call(3, "write_message", {**write, "content": "x"}).replace(b'"x"', b'"' + SECRET.encode()
                                                                                 + b' \xff\xfe\xc3"')
    cases = [
        (surrogate, -32700, None),
        (bad_utf8, -32700, None),
        (f"not json {SECRET}\n".encode(), -32700, None),
        (b'{"jsonrpc": "2.0", "id": 1' + SECRET.encode() + b"\n", -32700, None),
        (json.dumps({"id": 7, "params": SECRET}).encode() + b"\n", -32600, 7),
        (json.dumps([1, SECRET]).encode() + b"\n", -32600, None),
        (b"x" * (33 * MiB) + SECRET.encode() + b"\n", -32700, None),
    ]
    for line, code, rid in cases:
        rep = send(line)
        assert rep.get("jsonrpc") == "2.0" and "result" not in rep, rep
        assert rep["error"]["code"] == code and rep["id"] == rid, (line[:80], rep)
        assert SECRET not in json.dumps(rep)
    ok = send(_tool_call(9, "write_message", {**write, "content": "a clean message"}))
    assert ok["result"]["isError"] is False, ok
    hist = send(_tool_call(10, "read_messages", {"session_id": "hostile", "view": "history"}))
    stored = hist["result"]["structuredContent"]["history"]
    assert [m["content"] for m in stored] == ["a clean message"]
    proc.stdin.close()
    assert proc.wait(15) == 0
    err = proc.stderr.read().decode("utf-8", "replace")
    assert SECRET not in err
    assert "malformed JSON-RPC line" in err
