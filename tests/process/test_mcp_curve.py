"""A tcp:// daemon speaks only CURVE and only to the clients on its allow-list: the front-end and the
admin tool connect with its public key and their own listed key pair; without the server key, or with
a key pair that is not listed, they get the contract's BUSY "unavailable" answer, never a hang."""
from __future__ import annotations

import os
import shutil

import pytest
import zmq
import zmq.auth
from mcp import Client

from tests.support.mcp_fixtures import Daemon, anyio_backend, call, free_port, stdio_params  # noqa: F401  (fixture)

from daemonclient.replies import UNAVAILABLE_MESSAGE, is_unavailable
from daemonclient.transport import DaemonClient, read_curve_client_keys

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]


def client_cert(tmp_path, name: str) -> tuple[str, str]:
    """(public certificate, secret certificate) of a new client key pair, as zmq.auth writes them."""
    keys = tmp_path / "keys"
    keys.mkdir(exist_ok=True, mode=0o700)
    return zmq.auth.create_certificates(keys, name)


@pytest.fixture
def curve_daemon(tmp_path):
    public, secret = zmq.curve_keypair()
    (tmp_path / "server.key").write_bytes(secret + b"\n")
    (tmp_path / "server.pub").write_bytes(public + b"\n")
    os.chmod(tmp_path / "server.key", 0o600)
    listed_pub, listed_secret = client_cert(tmp_path, "listed")
    clients = tmp_path / "data" / "curve" / "clients"  # the default allow-list of the data dir
    clients.mkdir(parents=True)
    shutil.copy(listed_pub, clients / "listed.key")
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    d = Daemon(tmp_path / "data", endpoint=endpoint,
               extra_args=["--curve-secret-key-file", str(tmp_path / "server.key")], curve_server_public=public,
               curve_client_keys=read_curve_client_keys(listed_secret))
    d.start()
    try:
        yield d, public, tmp_path / "server.pub", listed_secret
    finally:
        d.close()


async def test_client_with_and_without_the_server_key(curve_daemon) -> None:
    d, public, _, listed = curve_daemon
    good = DaemonClient(d.endpoint, timeout=2.0, curve_server_key=public,
                        curve_client_keys=read_curve_client_keys(listed))
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


async def test_unlisted_client_key_gets_no_answer(curve_daemon, tmp_path) -> None:
    """The right server key is not enough: a key pair outside the allow-list fails the ZAP check."""
    d, public, _, _ = curve_daemon
    _, unlisted = client_cert(tmp_path, "unlisted")
    for keys in (read_curve_client_keys(unlisted), None):  # a certificate of its own, or a fresh pair
        c = DaemonClient(d.endpoint, timeout=0.3, attempts=2, curve_server_key=public, curve_client_keys=keys)
        try:
            assert is_unavailable(await c.request("ping", {}))
            assert is_unavailable(await c.request("write_message", {"session_id": "s", "role": "user",
                                                                    "content": "must not land"}))
        finally:
            c.close()
    with d.client() as listed:
        assert listed.call("read_messages", {"session_id": "s"})["history"] == []


async def test_client_key_file_from_the_environment(curve_daemon, monkeypatch) -> None:
    """The admin tool and the ingester take the key pair from CONVMEM_CURVE_CLIENT_KEY_FILE."""
    d, public, _, listed = curve_daemon
    monkeypatch.setenv("CONVMEM_CURVE_CLIENT_KEY_FILE", str(listed))
    c = DaemonClient(d.endpoint, timeout=2.0, curve_server_key=public)
    try:
        assert await c.ping(timeout=2.0)
    finally:
        c.close()


async def test_stdio_front_end_over_curve(curve_daemon, tmp_path) -> None:
    d, _, pub_file, listed = curve_daemon
    params = stdio_params(tmp_path / "data", tmp_path / "home", "--no-spawn", "--endpoint", d.endpoint,
                          "--curve-server-key-file", str(pub_file), "--curve-client-key-file", str(listed))
    async with Client(params, mode="legacy") as c:
        w = await call(c, "write_message", {"session_id": "curve", "role": "user", "content": "hello over tcp"})
        assert w["status"] == "OK"
        found = await call(c, "search_messages", {"query": "hello", "session_id": "curve"})
        assert [r["message_id"] for r in found["results"]] == [w["message"]["message_id"]]


async def test_stdio_front_end_with_an_unlisted_key_reports_busy(curve_daemon, tmp_path) -> None:
    d, _, pub_file, _ = curve_daemon
    _, unlisted = client_cert(tmp_path, "stranger")
    params = stdio_params(tmp_path / "data", tmp_path / "home", "--no-spawn", "--endpoint", d.endpoint,
                          "--timeout", "0.5", "--curve-server-key-file", str(pub_file),
                          "--curve-client-key-file", str(unlisted))
    async with Client(params, mode="legacy") as c:
        r = await call(c, "write_message", {"session_id": "curve", "role": "user", "content": "refused"})
        assert r["status"] == "ERROR" and r["error"]["code"] == "BUSY"
        assert r["error"]["message"] == UNAVAILABLE_MESSAGE
