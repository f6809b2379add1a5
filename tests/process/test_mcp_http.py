"""The MCP front-end over streamable HTTP: real daemon, real ``convmem-mcp --http`` process, the SDK client."""
from __future__ import annotations

import http.client
import json
import signal
import subprocess
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.support.mcp_fixtures import (  # noqa: F401  (fixtures)
    Daemon, Procs, anyio_backend, call, daemon, data_dir, free_port, frontend_cmd, frontend_env, home, http_client,
    procs, read_http_token, wait_port,
)

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}}


def start_http(procs: Procs, data_dir: Path, home: Path, host: str = "127.0.0.1", *extra: str) -> int:
    port = free_port()
    cmd = frontend_cmd(data_dir, "--no-spawn", "--http", "--port", str(port), *extra)
    if host != "127.0.0.1":
        cmd += ["--host", host]
    err = open(home / f"http-{port}.stderr", "wb")
    proc = procs.start(cmd, frontend_env(home), stdout=subprocess.PIPE, stderr=err)
    err.close()
    wait_port(host, port, proc)
    return port


@pytest.fixture
def http_port(daemon: Daemon, data_dir: Path, home: Path, procs: Procs) -> Iterator[int]:
    yield start_http(procs, data_dir, home)


def raw_post(host: str, port: int, host_header: str, origin: str | None = None,
             token: str | None = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(host, port, timeout=10)
    try:
        body = json.dumps(INIT).encode()
        conn.putrequest("POST", "/mcp", skip_host=True, skip_accept_encoding=True)
        conn.putheader("Host", host_header)
        if token is not None:
            conn.putheader("Authorization", f"Bearer {token}")
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Accept", "application/json, text/event-stream")
        if origin is not None:
            conn.putheader("Origin", origin)
        conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def listening_addresses(port: int) -> set[str]:
    """Local addresses (hex, as in /proc/net/tcp) of sockets listening on ``port``."""
    out = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            addr, hexport = fields[1].rsplit(":", 1)
            if int(hexport, 16) == port and fields[3] == "0A":  # LISTEN
                out.add(addr)
    return out


async def test_tools_over_http(http_port: int, data_dir: Path) -> None:
    async with http_client(f"http://127.0.0.1:{http_port}/mcp", read_http_token(data_dir)) as c:
        names = [t.name for t in (await c.list_tools()).tools]
        assert "write_message" in names and "search_sessions" in names and len(names) == 12
        w = await call(c, "write_message", {"session_id": "web", "role": "user",
                                            "content": "HTTP transport works; 検索もできる"})
        assert w["status"] == "OK"
        mid = w["message"]["message_id"]
        hits = await call(c, "search_messages", {"query": "検索"})
        assert [h["message_id"] for h in hits["results"]] == [mid]
        hist = await call(c, "read_messages", {"session_id": "web"})
        assert [m["message_id"] for m in hist["history"]] == [mid]
        ctx = await call(c, "read_messages", {"view": "context", "message_id": mid, "before": 0})
        assert ctx["message"]["content"].startswith("HTTP transport")
        r = await c.call_tool("read_messages", {"session_id": "web", "limit": 0, "surprise": 1})
        assert r.is_error
        obj = json.loads(r.content[0].text)
        assert obj == r.structured_content and obj["status"] == "ERROR"
        assert obj["error"]["code"] == "VALIDATION_ERROR"
        assert (await call(c, "delete_message", {"message_id": mid})) == {"status": "OK"}


async def test_legacy_mode_over_http(http_port: int, data_dir: Path) -> None:
    async with http_client(f"http://127.0.0.1:{http_port}/mcp", read_http_token(data_dir), mode="legacy") as c:
        assert (await call(c, "get_system_health"))["status"] == "OK"


def test_binds_loopback_and_rejects_foreign_host(http_port: int, data_dir: Path) -> None:
    assert listening_addresses(http_port) == {"0100007F"}  # 127.0.0.1 only
    token = read_http_token(data_dir)
    status, _ = raw_post("127.0.0.1", http_port, f"evil.example:{http_port}", token=token)
    assert status == 421
    status, _ = raw_post("127.0.0.1", http_port, f"127.0.0.1:{http_port}", origin="http://evil.example", token=token)
    assert status == 403
    status, body = raw_post("127.0.0.1", http_port, f"localhost:{http_port}", origin=f"http://localhost:{http_port}",
                            token=token)
    assert status == 200, body


def test_other_bind_address_keeps_host_checks(daemon: Daemon, data_dir: Path, home: Path, procs: Procs) -> None:
    """Bound to an address the SDK does not protect by itself (127.0.0.2): foreign Hosts are still refused."""
    port = start_http(procs, data_dir, home, "127.0.0.2")
    assert listening_addresses(port) == {"0200007F"}
    token = read_http_token(data_dir)
    assert raw_post("127.0.0.2", port, f"evil.example:{port}", token=token)[0] == 421
    assert raw_post("127.0.0.2", port, f"127.0.0.2:{port}", origin="http://evil.example", token=token)[0] == 403
    status, body = raw_post("127.0.0.2", port, f"127.0.0.2:{port}", token=token)
    assert status == 200, body


def test_nothing_on_stdout_in_http_mode(daemon: Daemon, data_dir: Path, home: Path, procs: Procs) -> None:
    """uvicorn and the SDK log to stderr only (stdout stays clean even here)."""
    port = start_http(procs, data_dir, home, "127.0.0.1", "--log-level", "DEBUG")
    assert raw_post("127.0.0.1", port, f"127.0.0.1:{port}", token=read_http_token(data_dir))[0] == 200
    proc = procs.procs[-1]
    proc.kill()
    out, _ = proc.communicate(timeout=10)
    assert out == b""


@pytest.mark.timeout(60)
def test_sigterm_is_a_clean_stop(procs: Procs, data_dir: Path, home: Path) -> None:
    """supervisord stops the HTTP front-end with SIGTERM and expects exit 0, not death by signal."""
    port = free_port()
    proc = procs.start(frontend_cmd(data_dir, "--http", "--no-spawn", "--port", str(port)), frontend_env(home))
    wait_port("127.0.0.1", port, proc)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 0


@pytest.mark.timeout(60)
def test_address_in_use_is_one_line_and_its_own_exit_status(procs: Procs, data_dir: Path, home: Path) -> None:
    """--http on a port another server holds: one line naming the address and what to do, exit 4 — no
    traceback, no exception group. A front-end that listens says where on stderr."""
    port = free_port()
    first = procs.start(frontend_cmd(data_dir, "--http", "--no-spawn", "--port", str(port)), frontend_env(home),
                        stderr=subprocess.PIPE)
    wait_port("127.0.0.1", port, first)
    second = procs.start(frontend_cmd(data_dir, "--http", "--no-spawn", "--port", str(port)), frontend_env(home),
                         stderr=subprocess.PIPE)
    _, err = second.communicate(timeout=30)
    assert second.returncode == 4, err
    lines = err.decode().strip().splitlines()
    assert lines[-1].startswith("convmem-mcp: cannot listen on 127.0.0.1:") and "--port" in lines[-1], err
    assert b"Traceback" not in err and b"ExceptionGroup" not in err
    first.send_signal(signal.SIGTERM)
    _, err1 = first.communicate(timeout=20)
    assert f"serving MCP (streamable HTTP) at http://127.0.0.1:{port}/mcp".encode() in err1, err1
