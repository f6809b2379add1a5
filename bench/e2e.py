"""The paths a host uses: durable writes through the stdio MCP front-end, and read latencies.

    python -m bench.e2e [--writes 500] [--messages 20000] [--json out.json]

Write: the SDK's real MCP client over stdio -> convmem-mcp -> daemon -> fsync, per call, beside a
SQLite WAL synchronous=FULL insert+commit of the same content, and beside the floor no server can go
under: the same client against a bare SDK low-level server that answers a canned reply at once (no
daemon, no disk; convmem's output schema and stdio streams). Reads (daemon protocol, beside the
equivalent SQLite queries on the same data): a history page of 100, a 4 KiB content chunk, the
context view (1 before, 1 after, relations depth 1).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from typing import Any

import zmq
from ulid import ULID

from protocol.config import default_endpoint
from protocol.wire import decode, encode_request

from .common import REPO, SqliteBaseline, write_json, corpus, print_table, ratio, start_daemon, stop, summary_ms


def frontend_cmd(data_dir: str) -> list[str]:
    return [sys.executable, "-m", "mcpfront", "--data-dir", data_dir, "--no-spawn"]


# The SDK's own floor: a bare low-level server with one write_message tool that answers a canned reply at
# once (no daemon, no disk), with convmem's output schema (the SDK's client validates every result against
# it) and convmem's stdio streams. What a client sees of it no server can make faster.
BARE_SERVER_CMD = [sys.executable, "-c", "from bench.e2e import bare_server; bare_server()"]


def bare_server() -> None:
    import anyio
    import mcp_types as types
    from mcp.server import Server
    from mcp.server.stdio import stdio_server

    from mcpfront.stdio import native_stdio
    from mcpfront.tools import OUTPUT_SCHEMAS

    reply = {"status": "OK", "message": {
        "message_id": str(ULID()), "session_id": "bare", "timestamp": 0, "role": "user", "content": "x" * 200,
        "revision": 1, "updated_at": 0, "metadata": {"tags": [], "memory_tier": "short", "memory_kind": "conversation",
                                                     "importance": 50, "relations": [], "source_message_ids": []}}}
    tools = [types.Tool(name=name, input_schema={"type": "object"}, output_schema=OUTPUT_SCHEMAS["write_message"])
             for name in ("write_message", "get_system_health")]

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=tools)

    async def call_tool(ctx: Any, params: Any) -> types.CallToolResult:
        return types.CallToolResult(content=[types.TextContent(type="text", text=json.dumps(reply))],
                                    structured_content=reply, is_error=False)

    server = Server("bare", on_list_tools=list_tools, on_call_tool=call_tool)

    async def main() -> None:
        async with native_stdio() as native:
            async with stdio_server(*(native or (None, None))) as (read, write):
                await server.run(read, write, server.create_initialization_options())

    anyio.run(main)


async def sdk_writes(cmd: list[str], texts: list[str]) -> list[float]:
    """write_message calls through the stdio server ``cmd`` as the SDK's client sees them (seconds each)."""
    from mcp import Client, StdioServerParameters

    params = StdioServerParameters(command=cmd[0], args=cmd[1:], cwd=REPO)
    lat = []
    async with Client(params, mode="legacy") as client:
        await client.call_tool("get_system_health", {})  # warm the path
        for t in texts:
            t0 = time.perf_counter()
            r = await client.call_tool("write_message", {"session_id": "e2e", "role": "user", "content": t})
            lat.append(time.perf_counter() - t0)
            assert not r.is_error, r
    return lat


async def mcp_writes(data_dir: str, texts: list[str]) -> list[float]:
    """Durable write_message calls through the stdio front-end as the SDK's client sees them (seconds
    each); a daemon must already serve ``data_dir`` (the front-end does not spawn one)."""
    return await sdk_writes(frontend_cmd(data_dir), texts)


def raw_stdio_writes(cmd: list[str], texts: list[str]) -> list[float]:
    """The same calls as newline-delimited JSON-RPC over the server's stdin/stdout, with no client
    library: what the server (and the daemon behind it) cost, without a Python client's own work."""
    fe = subprocess.Popen(cmd, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)

    def rpc(obj: dict[str, Any]) -> Any:
        fe.stdin.write((json.dumps(obj) + "\n").encode())
        fe.stdin.flush()
        return json.loads(fe.stdout.readline()) if "id" in obj else None

    try:
        rpc({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}}})
        rpc({"jsonrpc": "2.0", "method": "notifications/initialized"})
        lat = []
        for i, t in enumerate(texts):
            t0 = time.perf_counter()
            r = rpc({"jsonrpc": "2.0", "id": i + 1, "method": "tools/call", "params": {
                "name": "write_message", "arguments": {"session_id": "raw", "role": "user", "content": t}}})
            lat.append(time.perf_counter() - t0)
            assert not r["result"].get("isError"), r
        return lat
    finally:
        fe.stdin.close()
        try:
            fe.wait(10)
        except subprocess.TimeoutExpired:
            fe.kill()
            fe.wait()


def mcp_write_latency(tmp: str, n: int) -> dict[str, Any]:
    data_dir = os.path.join(tmp, "e2e")
    proc, _ = start_daemon(data_dir)
    texts = [c for _, c in corpus(n, seed=21)]
    try:
        ours = asyncio.run(mcp_writes(data_dir, texts))
        raw = raw_stdio_writes(frontend_cmd(data_dir), texts)
    finally:
        stop(proc)
    floor = asyncio.run(sdk_writes(BARE_SERVER_CMD, texts))
    floor_raw = raw_stdio_writes(BARE_SERVER_CMD, texts)
    base = SqliteBaseline(os.path.join(tmp, "e2e.sqlite"), fts=True)
    theirs = []
    for t in texts:
        t0 = time.perf_counter()
        base.write(str(ULID()), "e2e", t)
        theirs.append(time.perf_counter() - t0)
    base.close()
    o, s, r = summary_ms(ours), summary_ms(theirs), summary_ms(raw)
    return {"ours": o, "ours_raw_jsonrpc": r, "sqlite": s, "ratio_p50": ratio(o["p50_ms"], s["p50_ms"]),
            "raw_ratio_p50": ratio(r["p50_ms"], s["p50_ms"]),
            "bare_server_sdk": summary_ms(floor), "bare_server_raw_jsonrpc": summary_ms(floor_raw)}


def _load(data_dir: str, db_path: str, n: int) -> list[tuple[str, str]]:
    """The same messages into the daemon (import batches) and SQLite; returns (message_id, session)."""
    from .engine import build_store

    build_store(data_dir, n)
    from storaged.store import Store
    store = Store.open(data_dir)
    ids = [(m.message_id, m.session_id, m.content) for m in store.by_seq.values()]
    store.close()
    base = SqliteBaseline(db_path, fts=False)
    base.bulk(ids)
    base.close()
    return [(mid, sid) for mid, sid, _ in ids]


def read_latency(tmp: str, n: int, reps: int) -> dict[str, Any]:
    data_dir = os.path.join(tmp, "reads")
    db_path = os.path.join(tmp, "reads.sqlite")
    ids = _load(data_dir, db_path, n)
    rng = random.Random(5)
    sample = [ids[rng.randrange(len(ids))] for _ in range(reps)]
    proc, _ = start_daemon(data_dir)
    sock = zmq.Context.instance().socket(zmq.REQ)
    sock.connect(default_endpoint(data_dir))

    def call(args: dict[str, Any]) -> float:
        t0 = time.perf_counter()
        sock.send(encode_request("read_messages", args, str(ULID())))
        r = decode(sock.recv(), max_bytes=1 << 30)
        assert "status" not in r or r["status"] != "ERROR", r
        return time.perf_counter() - t0

    ours: dict[str, list[float]] = {"history_100": [], "content_4k": [], "context": []}
    try:
        for mid, sid in sample:
            ours["history_100"].append(call({"view": "history", "session_id": sid, "limit": 100}))
            ours["content_4k"].append(call({"view": "content", "message_id": mid, "content_limit": 4096}))
            ours["context"].append(call({"view": "context", "message_id": mid}))
    finally:
        sock.close(linger=0)
        stop(proc)
    db = sqlite3.connect(db_path)
    theirs: dict[str, list[float]] = {k: [] for k in ours}
    for mid, sid in sample:
        t0 = time.perf_counter()
        db.execute("SELECT message_id, session_id, ts, role, content, metadata FROM messages WHERE session_id=? "
                   "ORDER BY id LIMIT 100", (sid,)).fetchall()
        theirs["history_100"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        db.execute("SELECT substr(CAST(content AS BLOB), 1, 4096) FROM messages WHERE message_id=?", (mid,)).fetchone()
        theirs["content_4k"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        row = db.execute("SELECT id, session_id, content, metadata FROM messages WHERE message_id=?", (mid,)).fetchone()
        db.execute("SELECT * FROM messages WHERE session_id=? AND id<? ORDER BY id DESC LIMIT 1", (row[1], row[0])).fetchall()
        db.execute("SELECT * FROM messages WHERE session_id=? AND id>? ORDER BY id LIMIT 1", (row[1], row[0])).fetchall()
        theirs["context"].append(time.perf_counter() - t0)
    db.close()
    out = {}
    for k in ours:
        o, s = summary_ms(ours[k]), summary_ms(theirs[k])
        out[k] = {"ours": o, "sqlite_in_process": s, "ratio_p50": ratio(o["p50_ms"], s["p50_ms"])}
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--writes", type=int, default=500)
    p.add_argument("--messages", type=int, default=20000, help="store size for the read figures")
    p.add_argument("--reads", type=int, default=300)
    p.add_argument("--json")
    a = p.parse_args(argv)
    tmp = tempfile.mkdtemp(prefix="convmem-e2e-")
    try:
        res = {"mcp_stdio_write": mcp_write_latency(tmp, a.writes), "reads": read_latency(tmp, a.messages, a.reads)}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    w = res["mcp_stdio_write"]
    print_table("Durable write end to end (MCP stdio client -> front-end -> daemon -> fsync)", [
        ["convmem via MCP stdio, SDK client", w["ours"]["p50_ms"], w["ours"]["p95_ms"], w["ratio_p50"]],
        ["convmem via MCP stdio, raw JSON-RPC", w["ours_raw_jsonrpc"]["p50_ms"], w["ours_raw_jsonrpc"]["p95_ms"],
         w["raw_ratio_p50"]],
        ["SQLite WAL FULL (in-process)", w["sqlite"]["p50_ms"], w["sqlite"]["p95_ms"], 1.0],
        ["floor: SDK client -> bare SDK server, no daemon", w["bare_server_sdk"]["p50_ms"],
         w["bare_server_sdk"]["p95_ms"], ratio(w["bare_server_sdk"]["p50_ms"], w["sqlite"]["p50_ms"])],
        ["floor: raw JSON-RPC -> bare SDK server", w["bare_server_raw_jsonrpc"]["p50_ms"],
         w["bare_server_raw_jsonrpc"]["p95_ms"], ratio(w["bare_server_raw_jsonrpc"]["p50_ms"], w["sqlite"]["p50_ms"])]],
        ["", "p50 ms", "p95 ms", "ratio"])
    print_table(f"Read latency at {a.messages} messages (daemon protocol vs SQLite in-process)", [
        [k, v["ours"]["p50_ms"], v["ours"]["p95_ms"], v["sqlite_in_process"]["p50_ms"],
         v["sqlite_in_process"]["p95_ms"], v["ratio_p50"]] for k, v in res["reads"].items()],
        ["read", "ours p50", "ours p95", "SQLite p50", "SQLite p95", "ratio p50"])
    return write_json(a.json, res)


if __name__ == "__main__":
    main()
