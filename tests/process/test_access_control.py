"""Access control: the HTTP front-end needs a bearer token (a 0600 file in the data dir), ``--no-auth``
only on loopback, a forged loopback Host from a non-loopback peer is refused; a tcp:// daemon accepts
only CURVE clients on its allow-list. Real processes and sockets throughout."""
from __future__ import annotations

import http.client
import json
import os
import socket
import stat
import subprocess
from pathlib import Path

import pytest
import zmq
import zmq.auth

from tests.support.mcp_fixtures import (  # noqa: F401  (fixtures)
    Daemon, Procs, anyio_backend, call, daemon, data_dir, free_port, frontend_cmd, frontend_env, home, http_client,
    procs, read_http_token, wait_port,
)
from tests.support.daemon_proc import run_storaged

from protocol.config import http_token_path

pytestmark = [pytest.mark.timeout(60)]

INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}}


def start_http(procs: Procs, data_dir: Path, home: Path, *extra: str, host: str = "127.0.0.1") -> tuple[int, Path]:
    """A ``convmem-mcp --http`` process; (port, its stderr file)."""
    port = free_port()
    err_path = home / f"http-{port}.stderr"
    cmd = frontend_cmd(data_dir, "--no-spawn", "--http", "--host", host, "--port", str(port), *extra)
    with open(err_path, "wb") as err:
        proc = procs.start(cmd, frontend_env(home), stderr=err)
    wait_port(host if host != "0.0.0.0" else "127.0.0.1", port, proc)
    return port, err_path


def request(addr: str, port: int, host_header: str, authorization: str | None = None,
            path: str = "/mcp") -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection(addr, port, timeout=10)
    try:
        body = json.dumps(INIT).encode()
        conn.putrequest("POST", path, skip_host=True, skip_accept_encoding=True)
        conn.putheader("Host", host_header)
        if authorization is not None:
            conn.putheader("Authorization", authorization)
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Accept", "application/json, text/event-stream")
        conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def run_frontend(data_dir: Path, home: Path, *extra: str) -> subprocess.CompletedProcess:
    """A front-end that is expected to exit by itself (a refused start, --print-token)."""
    return subprocess.run(frontend_cmd(data_dir, "--no-spawn", *extra), env=frontend_env(home), capture_output=True,
                          text=True, timeout=30, stdin=subprocess.DEVNULL)


def non_loopback_address() -> str | None:
    """An address of this machine that is not loopback (the source address of a route; nothing is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.123", 9))
            addr = s.getsockname()[0]
        except OSError:
            return None
    if addr.startswith("127.") or addr == "0.0.0.0":
        return None
    try:  # bindable?
        with socket.socket() as t:
            t.bind((addr, 0))
    except OSError:
        return None
    return addr


# ------------------------------------------------------------------ HTTP: bearer token
@pytest.mark.anyio
async def test_http_requires_the_bearer_token(daemon: Daemon, data_dir: Path, home: Path, procs: Procs) -> None:
    port, err_path = start_http(procs, data_dir, home)
    token_file = Path(http_token_path(str(data_dir)))
    st = token_file.stat()
    assert stat.S_IMODE(st.st_mode) == 0o600 and stat.S_ISREG(st.st_mode)
    token = read_http_token(data_dir)
    assert len(token) >= 43  # 32 random bytes, URL-safe base64
    stderr = err_path.read_text()
    assert str(token_file) in stderr and token not in stderr  # where it is, never what it is
    host = f"127.0.0.1:{port}"
    for authorization in (None, "Bearer", "Bearer ", f"Bearer {token[:-1]}", f"Bearer {token}x", f"Basic {token}",
                          f"bearer{token}"):
        status, headers, body = request("127.0.0.1", port, host, authorization)
        assert status == 401, (authorization, status)
        assert headers["www-authenticate"].startswith("Bearer")
        assert json.loads(body)["error"] == "invalid_token"
        assert token.encode() not in body
    # every path is behind the check, not only /mcp
    assert request("127.0.0.1", port, host, None, path="/")[0] == 401
    status, _, body = request("127.0.0.1", port, host, f"Bearer {token}")
    assert status == 200, body
    status, _, body = request("127.0.0.1", port, host, f"bearer {token}")  # the scheme is case-insensitive
    assert status == 200, body
    # the SDK's client: refused without the token, served with it
    with pytest.raises(Exception):
        async with http_client(f"http://127.0.0.1:{port}/mcp", None, mode="legacy") as c:
            await c.list_tools()
    async with http_client(f"http://127.0.0.1:{port}/mcp", token) as c:
        assert (await call(c, "get_system_health"))["status"] == "OK"


def test_token_file_is_kept_and_can_be_named(daemon: Daemon, data_dir: Path, home: Path, procs: Procs,
                                             tmp_path: Path) -> None:
    # --print-token creates the file once and prints it; a second call prints the same token
    first = run_frontend(data_dir, home, "--print-token")
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == read_http_token(data_dir)
    again = run_frontend(data_dir, home, "--print-token")
    assert again.stdout == first.stdout
    # --http-token-file: another file, its token is the one that works
    mine = tmp_path / "tok"
    fd = os.open(mine, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, b"my-own-token-0123456789abcdef\n")
    os.close(fd)
    port, _ = start_http(procs, data_dir, home, "--http-token-file", str(mine))
    host = f"127.0.0.1:{port}"
    assert request("127.0.0.1", port, host, f"Bearer {read_http_token(data_dir)}")[0] == 401
    assert request("127.0.0.1", port, host, "Bearer my-own-token-0123456789abcdef")[0] == 200


def test_unsafe_token_files_are_refused(data_dir: Path, home: Path, tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_text("a-token-that-is-long-enough-000\n")
    os.chmod(target, 0o600)
    link = tmp_path / "link"
    link.symlink_to(target)
    r = run_frontend(data_dir, home, "--http", "--http-token-file", str(link))
    assert r.returncode == 2 and "symbolic link" in r.stderr, r.stderr
    os.chmod(target, 0o644)
    r = run_frontend(data_dir, home, "--http", "--http-token-file", str(target))
    assert r.returncode == 2 and "other users" in r.stderr, r.stderr
    assert "a-token-that" not in r.stderr
    short = tmp_path / "short"
    fd = os.open(short, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, b"short\n")
    os.close(fd)
    r = run_frontend(data_dir, home, "--http", "--http-token-file", str(short))
    assert r.returncode == 2 and "at least" in r.stderr, r.stderr


def test_no_auth_only_on_loopback(daemon: Daemon, data_dir: Path, home: Path, procs: Procs) -> None:
    for host in ("0.0.0.0", "::", non_loopback_address() or "192.0.2.2"):
        r = run_frontend(data_dir, home, "--http", "--no-auth", "--host", host, "--port", str(free_port()))
        assert r.returncode == 2, (host, r.returncode, r.stderr)
        assert "--no-auth" in r.stderr and "loopback" in r.stderr
    port, _ = start_http(procs, data_dir, home, "--no-auth")
    status, _, body = request("127.0.0.1", port, f"127.0.0.1:{port}")
    assert status == 200, body


# ------------------------------------------------------------------ HTTP: forged Host on a non-loopback bind
def test_forged_loopback_host_from_a_remote_peer(daemon: Daemon, data_dir: Path, home: Path, procs: Procs) -> None:
    """Bound to the machine's own LAN address, a client there that claims ``Host: 127.0.0.1`` is refused
    (the SDK's Host allow-list alone accepts it), and without the token nothing else gets through."""
    addr = non_loopback_address()
    if addr is None:
        pytest.skip("this machine has no non-loopback address to bind")
    port, _ = start_http(procs, data_dir, home, host=addr)
    token = read_http_token(data_dir)
    for forged in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}"):
        status, _, _ = request(addr, port, forged, f"Bearer {token}")
        assert status == 421, (forged, status)
    assert request(addr, port, f"evil.example:{port}", f"Bearer {token}")[0] == 421
    assert request(addr, port, f"{addr}:{port}")[0] == 401
    status, _, body = request(addr, port, f"{addr}:{port}", f"Bearer {token}")
    assert status == 200, body


def test_wildcard_bind_needs_the_token(daemon: Daemon, data_dir: Path, home: Path, procs: Procs) -> None:
    port, _ = start_http(procs, data_dir, home, host="0.0.0.0")
    token = read_http_token(data_dir)
    assert request("127.0.0.1", port, f"127.0.0.1:{port}")[0] == 401
    assert request("127.0.0.1", port, f"127.0.0.1:{port}", f"Bearer {token}")[0] == 200
    addr = non_loopback_address()
    if addr is not None:  # from the LAN side a loopback Host is a forgery
        assert request(addr, port, f"127.0.0.1:{port}", f"Bearer {token}")[0] == 421


# ------------------------------------------------------------------ CURVE: tcp:// needs an allow-list
def test_tcp_daemon_needs_an_allow_list(tmp_path: Path) -> None:
    public, secret = zmq.curve_keypair()
    key = tmp_path / "server.key"
    key.write_bytes(secret + b"\n")
    os.chmod(key, 0o600)
    base = ["--data-dir", str(tmp_path / "d"), "--endpoint", f"tcp://127.0.0.1:{free_port()}",
            "--curve-secret-key-file", str(key)]
    r = run_storaged(base)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "allow-list" in r.stderr and "--curve-allow-any" in r.stderr
    r = run_storaged(base + ["--curve-clients-dir", str(tmp_path / "missing")])
    assert r.returncode == 2 and "does not exist" in r.stderr, r.stderr
    (tmp_path / "clients").mkdir()
    r = run_storaged(base + ["--curve-clients-dir", str(tmp_path / "clients"), "--curve-allow-any"])
    assert r.returncode == 2 and "not both" in r.stderr, r.stderr
