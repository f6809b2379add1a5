"""Fuzzing the daemon's socket: thousands of random and mutated frames, every one answered with a
reply map (mostly VALIDATION_ERROR, never INTERNAL_ERROR, never a hang), no state changed by any of
them except the valid requests the fuzzer knows it sent, and a healthy daemon afterwards."""
from __future__ import annotations

import json
import random
import socket as pysocket
import time
from collections import Counter
from typing import Any, Iterator

import msgpack
import pytest
import zmq

from tests.support.daemon_proc import DaemonPool, new_rid, state_of
from protocol import limits as L
from storaged.server import HARD_FRAME_CAP

SEED = 20261129
CASES = 4000
MARKER = "SECRET-7f3a"  # planted in fuzz strings: an error message must never echo it
REPLY_TIMEOUT_MS = 10_000


@pytest.fixture
def pool(tmp_path):
    p = DaemonPool(tmp_path)
    yield p
    p.close_all()


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def envelope(op: Any, args: Any, rid: Any) -> bytes:
    return pack({"op": op, "args": args, "request_id": rid})


def rand_ulid(rng: random.Random) -> str:
    return rng.choice("01234567") + "".join(rng.choice("0123456789ABCDEFGHJKMNPQRSTVWXYZ") for _ in range(25))


# Values of every msgpack type, most of them wrong wherever they land.
def bad_values(rng: random.Random) -> list[Any]:
    return [
        None, True, False, 0, -1, 1, 7, 2**31, 2**63 - 1, -(2**63), 2**64 - 1, 1.5, float("nan"),
        float("inf"), -0.0, "", "x", MARKER, MARKER * 3000, " " * 300, "\u0000", "日本語" * 200,
        b"", b"bytes " + MARKER.encode(), [], [MARKER], [1, 2, 3], {}, {"k": MARKER}, {"a": {"b": [1]}},
        msgpack.ExtType(5, b"ext"), msgpack.Timestamp(0, 0), rand_ulid(rng),
        rand_ulid(rng).lower(), "Z" * 26, "8" + "0" * 25, "0" * 27, '{"tags": 5}', "[1,2]", "{}",
        '{"importance": 1e400}', '{"tags": ["' + MARKER + '"' + "]" * 3, '"\\ud800"', '{"summary": "\\udfff"}',
        "[" * 100_000, '{"relations": [{"type": "related_to", "message_id": "' + MARKER + '"}]}',
    ]


ARGS_OF = {
    "write_message": ["session_id", "role", "content", "metadata_json"],
    "update_message": ["message_id", "content", "metadata_json", "expected_revision"],
    "read_messages": ["view", "limit", "cursor", "session_id", "message_id", "content_offset", "content_limit",
                      "expected_revision", "before", "after", "relation_depth", "relation_types_json"],
    "search_messages": ["query", "session_id", "filters_json", "min_importance", "context_size", "limit"],
    "delete_message": ["message_id", "session_id"],
    "rebuild_status": ["rebuild_id"],
}


class Fuzzer:
    def __init__(self, rng: random.Random, existing_id: str) -> None:
        self.rng = rng
        self.existing_id = existing_id
        # Valid requests (as (op, args)) to mutate. Mutations cannot reach rebuild_index.
        self.templates: list[tuple[str, dict[str, Any]]] = [
            ("write_message", {"session_id": "fz", "role": "user", "content": "hello fuzz",
                               "metadata_json": json.dumps({"tags": ["a"], "importance": 5, "relations": [
                                   {"type": "related_to", "message_id": existing_id}]})}),
            ("update_message", {"message_id": rand_ulid(rng), "content": "nope", "expected_revision": 1}),
            ("delete_message", {"message_id": rand_ulid(rng), "session_id": "fz"}),
            ("read_messages", {"view": "history", "session_id": "base0", "limit": 5}),
            ("read_messages", {"view": "sessions", "limit": 3}),
            ("read_messages", {"view": "content", "message_id": existing_id, "content_offset": 0,
                               "content_limit": 3}),
            ("read_messages", {"view": "context", "message_id": existing_id, "before": 2, "after": 2,
                               "relation_depth": 2, "relation_types_json": '["related_to"]'}),
            ("search_messages", {"query": "base message", "filters_json": '{"kinds":["conversation"],"tags":["t1"]}',
                                 "min_importance": 3, "context_size": 1, "limit": 5}),
            ("get_system_health", {}),
            ("ping", {}),
            ("rebuild_status", {"rebuild_id": rand_ulid(rng)}),
        ]
        # The write template's request id is sent once before the baseline, so a mutated copy that
        # still validates is answered as a repeat; a mutation of the id itself may apply a new write,
        # which the test learns from the reply.
        self.template_rids = [new_rid() for _ in self.templates]

    def valid_frames(self) -> list[bytes]:
        return [envelope(op, args, rid) for (op, args), rid in zip(self.templates, self.template_rids)]

    # -- generators: each yields (kind, frames) --
    def random_bytes(self) -> tuple[str, list[bytes]]:
        n = self.rng.choice([0, 1, 2, 5, 17, 100, 1000, 5000])
        return "random", [self.rng.randbytes(n)]

    def truncated(self) -> tuple[str, list[bytes]]:
        frame = self.rng.choice(self.valid_frames())
        return "truncated", [frame[: self.rng.randrange(0, len(frame))]]

    def mutated(self) -> tuple[str, list[bytes]]:
        frame = bytearray(self.rng.choice(self.valid_frames()))
        for _ in range(self.rng.choice([1, 1, 2, 3, 8])):
            i = self.rng.randrange(len(frame))
            op = self.rng.random()
            if op < 0.6:
                frame[i] = self.rng.randrange(256)
            elif op < 0.8:
                del frame[i]
            else:
                frame[i:i] = self.rng.randbytes(self.rng.choice([1, 4, 9]))
        return "mutated", [bytes(frame)]

    def envelope_types(self) -> tuple[str, list[bytes]]:
        vals = bad_values(self.rng)
        op, args = self.rng.choice(self.templates)
        rid = new_rid()
        which = self.rng.randrange(6)
        if which == 0:
            frame = envelope(self.rng.choice(vals + ["WRITE_MESSAGE", "write_message ", "nope"]), args, rid)
        elif which == 1:
            frame = envelope(op, self.rng.choice([v for v in vals if v is not None and v != {}]), rid)
        elif which == 2:
            frame = envelope(op, args, self.rng.choice(vals))
        elif which == 3:
            obj = {"op": op, "args": args, "request_id": rid, self.rng.choice(["extra", MARKER, "Op"]): 1}
            frame = pack(obj)
        elif which == 4:
            obj = {"op": op, "args": args, "request_id": rid}
            del obj[self.rng.choice(list(obj))]
            frame = pack(obj)
        else:
            frame = pack(self.rng.choice([[op, args, rid], op, 5, None, MARKER, b"\x00", 1.0]))
        return "envelope", [frame]

    def argument_types(self) -> tuple[str, list[bytes]]:
        vals = bad_values(self.rng)
        op = self.rng.choice(list(ARGS_OF))
        base = dict(next(a for o, a in self.templates if o == op))
        name = self.rng.choice(ARGS_OF[op] + ["unknown_" + MARKER, "", "metadata"])
        if self.rng.random() < 0.1 and name in base:
            del base[name]
        else:
            base[name] = self.rng.choice(vals)
        return "argument", [envelope(op, base, new_rid())]

    def huge_lengths(self) -> tuple[str, list[bytes]]:
        heads = [b"\xdd\xff\xff\xff\xff", b"\xdf\xff\xff\xff\xff", b"\xdb\xff\xff\xff\xff", b"\xc6\xff\xff\xff\xff",
                 b"\xc9\xff\xff\xff\xff\x05", b"\xdc\xff\xff", b"\xde\xff\xff", b"\xda\xff\xff"]
        head = self.rng.choice(heads)
        prefix = self.rng.choice([b"", b"\x83\xa2op\xadwrite_message\xa4args",
                                  b"\x83\xa2op\xadwrite_message\xaarequest_id" + pack(new_rid()) + b"\xa4args\x84"
                                  b"\xaasession_id"])
        return "huge-length", [prefix + head + self.rng.randbytes(self.rng.choice([0, 3, 50]))]

    def deep(self) -> tuple[str, list[bytes]]:
        n = self.rng.choice([L.MAX_NESTING_DEPTH, L.MAX_NESTING_DEPTH + 1, 50, 600, 1100, 5000, 100_000])
        kind = self.rng.randrange(3)
        if kind == 0:
            body = b"\x91" * n + b"\xc0"
            frame = b"\x83\xa2op\xa4ping\xaarequest_id" + pack(new_rid()) + b"\xa4args" + body
        elif kind == 1:
            frame = b"\x81\xa1a" * n + b"\xc0"
        else:
            inner = b"\x81\xa1a" * n + b"\xc0"
            frame = (b"\x83\xa2op\xadwrite_message\xaarequest_id" + pack(new_rid()) + b"\xa4args\x84"
                     b"\xaasession_id\xa2fz\xa4role\xa4user\xa7content\xa3deep\xadmetadata_json" + inner)
        return "deep", [frame]

    def multi_frame(self) -> tuple[str, list[bytes]]:
        valid = self.rng.choice(self.valid_frames())
        frames = self.rng.choice([[valid, valid], [valid, b""], [b"", b""], [valid, b"x", valid],
                                  [b"", valid], [self.rng.randbytes(10)] * 4])
        return "multi-frame", frames

    def cases(self, n: int) -> Iterator[tuple[str, list[bytes]]]:
        gens = [(self.random_bytes, 3), (self.truncated, 3), (self.mutated, 6), (self.envelope_types, 3),
                (self.argument_types, 6), (self.huge_lengths, 1), (self.deep, 1), (self.multi_frame, 1)]
        funcs = [g for g, w in gens for _ in range(w)]
        for _ in range(n):
            yield self.rng.choice(funcs)()


def check_reply(rep: Any, kind: str, counts: Counter) -> None:
    assert isinstance(rep, dict), (kind, rep)
    if rep.get("status") == "ERROR":
        err = rep["error"]
        assert isinstance(err, dict) and isinstance(err.get("message"), str) and err["message"], rep
        assert err["code"] != "INTERNAL_ERROR", (kind, rep)
        assert MARKER not in err["message"], (kind, rep)
        counts[err["code"]] += 1
    else:
        assert rep.get("status") in ("OK", "NOT_FOUND", None), (kind, rep)
        counts["answered"] += 1


@pytest.mark.timeout(240)
def test_fuzz_frames_every_one_answered(pool):
    rng = random.Random(SEED)
    d = pool.new().start()
    t_start = time.monotonic()
    with d.client(timeout_ms=REPLY_TIMEOUT_MS, retries=0) as c:
        base = [c.write(f"base{i % 3}", f"base message {i}", metadata={"tags": [f"t{i % 2}"]}) for i in range(30)]
        fz = Fuzzer(rng, base[0]["message_id"])
        for frame in fz.valid_frames():  # apply the templates once: mutated copies are then repeats
            assert isinstance(c.send_frames([frame]), dict)
        baseline = state_of(c.all_messages())
        h0 = c.health()

        expected = dict(baseline)   # + whatever a fuzz frame that happened to be valid wrote
        counts: Counter = Counter()
        kinds: Counter = Counter()
        for kind, frames in fz.cases(CASES):
            kinds[kind] += 1
            rep = c.send_frames(frames)
            assert rep is not None, f"no reply to a {kind} frame (daemon alive: {d.alive()})"
            check_reply(rep, kind, counts)
            if rep.get("status") == "OK" and isinstance(rep.get("message"), dict):
                expected[rep["message"]["message_id"]] = rep["message"]
            assert rep != {"status": "OK"}, (kind, frames[0][:200])  # a fuzz frame deleted something

        # Frames just over the request limit: a clear VALIDATION_ERROR.
        over = L.MAX_REQUEST_BYTES + 1
        big_write = envelope("write_message", {"session_id": "fz", "role": "user", "content": "y" * over}, new_rid())
        for frame in (rng.randbytes(over), big_write, b"\xc6" + over.to_bytes(4, "big") + b"\0" * over,
                      rng.randbytes(HARD_FRAME_CAP)):
            rep = c.send_frames([frame])
            assert rep["status"] == "ERROR" and rep["error"]["code"] == "VALIDATION_ERROR", rep
            assert str(L.MAX_REQUEST_BYTES) in rep["error"]["message"]
            counts["VALIDATION_ERROR"] += 1
        # A valid write of exactly 1 MiB content still goes through after all this.
        big = c.write("fz-big", "z" * L.CONTENT_MAX_BYTES)
        expected[big["message_id"]] = big

        # Above the hard cap libzmq drops the connection: no reply; reconnect and carry on.
        rep = c.send_frames([b"\0" * (HARD_FRAME_CAP + 1)], timeout_ms=2000)
        assert rep is None
        assert d.alive()
        assert c.call("ping", retries=3, timeout_ms=5000)["pid"] == d.pid

    elapsed = time.monotonic() - t_start
    print(f"\nfuzz: {sum(kinds.values())} frames in {elapsed:.1f} s; kinds {dict(kinds)}; replies {dict(counts)}")
    assert counts["VALIDATION_ERROR"] > CASES // 2
    assert "INTERNAL_ERROR" not in counts

    # Still healthy, and no fuzz frame changed state beyond the valid writes it was told about.
    with d.client() as c:
        assert c.call("ping")["pid"] == d.pid
        m = c.write("after", "after the fuzz")
        assert c.history("after") == [m]
        expected[m["message_id"]] = m
        h = c.health()
        assert h["status"] == "OK" and h["last_error"] == "", h
        after = state_of(c.all_messages())
        assert after == expected
        assert h["active_messages"] == len(expected)
        assert h["deleted_messages"] == h0["deleted_messages"] == 0
    assert d.alive()
    assert "INTERNAL" not in d.stderr() and "Traceback" not in d.stderr()
    assert d.terminate() == 0
    # Thousands of bad requests leave no trace in the log (no per-request lines) and none on stdout.
    assert len(d.stderr().splitlines()) < 12, d.stderr()[-3000:]
    assert MARKER not in d.stderr()
    assert d.stdout() == ""


@pytest.mark.timeout(120)
def test_malformed_envelopes_and_transport_garbage(pool):
    """Below the msgpack layer: DEALER messages without the REQ delimiter, garbage on the raw ipc
    socket, clients vanishing mid-request. The daemon keeps serving everyone else."""
    rng = random.Random(SEED + 1)
    d = pool.new().start()
    ctx = zmq.Context.instance()
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(d.endpoint)
    try:
        with d.client(timeout_ms=3000, retries=0) as c:
            for i in range(300):
                k = rng.randrange(5)
                if k == 0:    # no delimiter: dropped
                    dealer.send_multipart([rng.randbytes(rng.randrange(1, 40))])
                elif k == 4:  # several frames, no delimiter, and the peer is gone before it is read
                    # (with a REP socket, libzmq 4.3.5 then lost the next client's reply)
                    short = ctx.socket(zmq.DEALER)
                    short.connect(d.endpoint)
                    short.send_multipart([rng.randbytes(3), rng.randbytes(rng.randrange(1, 9))])
                    short.close(linger=200)
                elif k == 1:  # delimiter + garbage: answered with an error
                    dealer.send_multipart([b"", rng.randbytes(rng.randrange(0, 40))])
                elif k == 2:  # garbage routing frames before the delimiter
                    dealer.send_multipart([rng.randbytes(5), b"", envelope("ping", {}, new_rid())])
                else:         # a REQ that sends and vanishes before the reply
                    gone = ctx.socket(zmq.REQ)
                    gone.setsockopt(zmq.LINGER, 0)
                    gone.connect(d.endpoint)
                    gone.send(envelope("write_message", {"session_id": "gone", "role": "user",
                                                         "content": f"gone {i}"}, new_rid()))
                    gone.close(0)
                if i % 25 == 0:  # raw bytes on the unix socket itself (not ZMTP at all)
                    raw = pysocket.socket(pysocket.AF_UNIX, pysocket.SOCK_STREAM)
                    raw.settimeout(2)
                    raw.connect(d.endpoint[len("ipc://"):])
                    try:
                        raw.sendall(rng.randbytes(rng.choice([1, 10, 64, 4096])))
                    except OSError:
                        pass
                    raw.close()
                assert c.call("ping")["pid"] == d.pid, i
            # Drain whatever the dealer got back: every reply is a well-formed map.
            replies = 0
            while dealer.poll(500):
                frames = dealer.recv_multipart()
                assert frames[-2] == b"" if len(frames) >= 2 else False, frames
                rep = msgpack.unpackb(frames[-1], raw=False)
                assert isinstance(rep, dict) and rep.get("error", {}).get("code") != "INTERNAL_ERROR", rep
                replies += 1
            assert replies > 0
            h = c.health()
            assert h["status"] == "OK"
            # Only the vanished REQs' writes (if the daemon got them) can have changed anything.
            gone = c.history("gone")
            assert h["active_messages"] == len(gone)
            assert len({m["content"] for m in gone}) == len(gone)
    finally:
        dealer.close(0)
    assert d.alive() and d.terminate() == 0
    assert "Traceback" not in d.stderr()
