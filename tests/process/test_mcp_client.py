"""daemonclient.transport on its own: argument encoding limits, replies it cannot read, the real daemon."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import zmq

from tests.support.mcp_fixtures import Daemon, anyio_backend, daemon, data_dir  # noqa: F401  (fixtures)

from daemonclient.replies import is_unavailable
from daemonclient.transport import DaemonClient, encode_or_error
from protocol import limits as L

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


@pytest.mark.unit  # in-process, unlike the rest of this module
@pytest.mark.parametrize("value, words", [
    (2 ** 64, "64"),
    (-(2 ** 63) - 1, "64"),
    ("a\ud800b", "Unicode"),
])
def test_unencodable_arguments_are_validation_errors(value: object, words: str) -> None:
    out = encode_or_error("read_messages", {"limit": value}, "01ARZ3NDEKTSV4RRFFQ69G5FAV", frozenset({"limit"}))
    assert isinstance(out, dict) and out["error"]["code"] == "VALIDATION_ERROR"
    assert out["error"]["message"].startswith("limit: ") and words in out["error"]["message"]
    assert str(value) not in out["error"]["message"]
    # a name that is not a known parameter is not echoed
    out = encode_or_error("read_messages", {"x-secret": value}, "01ARZ3NDEKTSV4RRFFQ69G5FAV", frozenset({"limit"}))
    assert isinstance(out, dict) and "x-secret" not in out["error"]["message"]


@pytest.mark.unit  # in-process, unlike the rest of this module
def test_oversized_request_is_refused_before_sending() -> None:
    out = encode_or_error("write_message", {"content": "x" * (L.MAX_REQUEST_BYTES + 1)}, "01ARZ3NDEKTSV4RRFFQ69G5FAV")
    assert isinstance(out, dict) and out["error"]["code"] == "VALIDATION_ERROR"
    assert str(L.MAX_REQUEST_BYTES) in out["error"]["message"]


async def test_real_daemon_round_trip(daemon: Daemon) -> None:
    client = DaemonClient(daemon.endpoint, timeout=2)
    try:
        assert await client.ping()
        r = await client.request("write_message", {"session_id": "c", "role": "user", "content": "hi"})
        assert r["status"] == "OK"
        again = await client.request("write_message", {"session_id": "c", "role": "user", "content": "hi"},
                                     request_id=None)
        assert again["message"]["message_id"] != r["message"]["message_id"]
        rid = "01ARZ3NDEKTSV4RRFFQ69G5FAV"
        first = await client.request("write_message", {"session_id": "c", "role": "user", "content": "once"}, rid)
        repeat = await client.request("write_message", {"session_id": "c", "role": "user", "content": "once"}, rid)
        assert first == repeat  # the daemon answers a repeated request id with the first result
    finally:
        client.close()


async def test_no_daemon_is_busy_fast(tmp_path_factory: pytest.TempPathFactory) -> None:
    d = tmp_path_factory.mktemp("n")
    client = DaemonClient(f"ipc://{d}/none.sock", timeout=0.2, attempts=2)
    try:
        t0 = time.monotonic()
        assert not await client.ping()
        assert time.monotonic() - t0 < 0.1  # no socket file: no need to wait at all
        r = await client.request("get_system_health", {})
        assert is_unavailable(r) and r["error"]["retryable"] is True
        assert time.monotonic() - t0 < 5
    finally:
        client.close()


async def test_unreadable_reply_is_internal_error(tmp_path_factory: pytest.TempPathFactory) -> None:
    """A peer that answers garbage (not msgpack, or not a map) yields INTERNAL_ERROR, not an exception."""
    endpoint = f"ipc://{tmp_path_factory.mktemp('g')}/garbage.sock"
    ctx = zmq.Context()
    rep = ctx.socket(zmq.REP)
    rep.bind(endpoint)
    stop = threading.Event()

    def serve() -> None:
        answers = [b"\xc1\xc1 not msgpack", b"\x93\x01\x02\x03"]  # bad bytes; a list instead of a map
        i = 0
        while not stop.is_set():
            if rep.poll(50):
                rep.recv()
                rep.send(answers[i % 2])
                i += 1
    t = threading.Thread(target=serve, daemon=True)
    t.start()
    client = DaemonClient(endpoint, timeout=2)
    try:
        for _ in range(2):
            r = await client.request("get_system_health", {})
            assert r["status"] == "ERROR" and r["error"]["code"] == "INTERNAL_ERROR"
            assert "\\xc1" not in r["error"]["message"]
    finally:
        client.close()
        stop.set()
        t.join(5)
        rep.close(0)
        ctx.term()


@pytest.mark.unit  # in-process, unlike the rest of this module
def test_fixtures_dir_is_short(data_dir: Path) -> None:
    assert len(f"ipc://{data_dir}/run/storaged.sock") <= 107
