"""A tcp:// daemon speaks only CURVE: the front-end and the admin tool connect with its public key,
and without it they get the contract's BUSY "unavailable" answer, never a hang."""
from __future__ import annotations

import os

import pytest
import zmq
from mcp import Client

from mcp_fixtures import Daemon, anyio_backend, call, free_port, stdio_params  # noqa: F401  (fixture)

from mcpfront.client import DaemonClient, is_unavailable

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]


@pytest.fixture
def curve_daemon(tmp_path):
    public, secret = zmq.curve_keypair()
    (tmp_path / "server.key").write_bytes(secret + b"\n")
    (tmp_path / "server.pub").write_bytes(public + b"\n")
    os.chmod(tmp_path / "server.key", 0o600)
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    d = Daemon(tmp_path / "data", endpoint=endpoint,
               extra_args=["--curve-secret-key-file", str(tmp_path / "server.key")], curve_server_public=public)
    d.start()
    try:
        yield d, public, tmp_path / "server.pub"
    finally:
        d.close()


async def test_client_with_and_without_the_server_key(curve_daemon) -> None:
    d, public, _ = curve_daemon
    good = DaemonClient(d.endpoint, timeout=2.0, curve_server_key=public)
    try:
        assert await good.ping(timeout=2.0)
        r = await good.request("write_message", {"session_id": "s", "role": "user", "content": "over CURVE"})
        assert r["status"] == "OK"
    finally:
        good.close()
    for key in (None, zmq.curve_keypair()[0]):
        bad = DaemonClient(d.endpoint, timeout=0.3, attempts=2, curve_server_key=key)
        try:
            assert is_unavailable(await bad.request("ping", {}))
        finally:
            bad.close()


async def test_stdio_front_end_over_curve(curve_daemon, tmp_path) -> None:
    d, _, pub_file = curve_daemon
    params = stdio_params(tmp_path / "data", tmp_path / "home", "--no-spawn", "--endpoint", d.endpoint,
                          "--curve-server-key-file", str(pub_file))
    async with Client(params, mode="legacy") as c:
        w = await call(c, "write_message", {"session_id": "curve", "role": "user", "content": "hello over tcp"})
        assert w["status"] == "OK"
        found = await call(c, "search_messages", {"query": "hello", "session_id": "curve"})
        assert [r["message_id"] for r in found["results"]] == [w["message"]["message_id"]]
