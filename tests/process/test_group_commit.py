"""Group commit: requests that arrive together share one fdatasync, and none of their replies leaves
before it — so every acknowledged write survives a SIGKILL, and concurrent writers cost fewer syncs."""
from __future__ import annotations

import zmq

import pytest

from tests.support.daemon_proc import Daemon, new_rid
from protocol import wire

pytestmark = pytest.mark.timeout(90)

SOCKETS = 16


def _burst(ctx: zmq.Context, endpoint: str, round_: int) -> list[dict]:
    """One write on each of SOCKETS connected REQ sockets, all sent before any reply is read."""
    socks = []
    for _ in range(SOCKETS):
        s = ctx.socket(zmq.REQ)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(endpoint)
        socks.append(s)
    try:
        for i, s in enumerate(socks):
            s.send(wire.encode_request("write_message", {"session_id": "burst", "role": "user",
                                                         "content": f"round {round_} writer {i}"}, new_rid()))
        replies = []
        for s in socks:
            assert s.poll(20000), "no reply"
            replies.append(wire.decode(s.recv(), max_bytes=1 << 30))
        return replies
    finally:
        for s in socks:
            s.close(linger=0)


def test_bursts_share_syncs_and_survive_sigkill(tmp_path):
    ctx = zmq.Context()
    with Daemon(tmp_path / "data") as d:
        d.start()
        acked = set()
        grouped = False
        with d.client() as c:
            for round_ in range(6):
                before = c.health()["io"]["flush_calls"]
                replies = _burst(ctx, d.endpoint, round_)
                assert all(r["status"] == "OK" for r in replies), replies
                acked |= {r["message"]["message_id"] for r in replies}
                syncs = c.health()["io"]["flush_calls"] - before
                grouped = grouped or syncs < SOCKETS
        assert grouped, "no burst was committed with fewer fdatasyncs than writes"
        d.kill()
        d.start()
        with d.client() as c:
            assert {m["message_id"] for m in c.history("burst")} == acked
            assert c.health()["active_messages"] == len(acked)
    ctx.term()
